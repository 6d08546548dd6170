// The CPU GEMM for weight matrices: C[m, n] = A[m, k] @ W + beta * C, where W [k, n] was packed
// once, at load time, into column panels: ceil(n / 64) panels, each [k, 64] contiguous (row p of
// a panel holds W[p, 64 j .. 64 j + 63]; columns past n are zero).
//
// Why: OpenBLAS re-packs W on every call (a third of a decode step at batch 32), and a kernel that
// reads a row-major W 64 columns at a time touches a new page at every k step, which the hardware
// prefetcher cannot follow. A panel is one sequential stream. Measured on this machine's AVX-512
// core (1 thread, W colder than L3, GPT-2-124M shapes, tests/kernels/packed_gemm_bench.cpp):
// x2.1-3.1 OpenBLAS at m = 1 (bandwidth-bound), x1.4-1.9 at m = 32 (65-79 GF/s), x0.9-1.2 at
// m = 512 (prefill, 85-105 GF/s). One layout then serves every batch size, so weights are held
// once.
//
// Threading: OpenMP over panels, blas_threads() threads. The panel kernel is chosen at run time
// (cpu_isa.h): AVX-512 (packed_gemm_avx512.cpp), AVX2 + FMA (packed_gemm_avx2.cpp) or a portable
// loop over the same layout (packed_gemm_portable.cpp, vectorized by the compiler).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_isa.h"  // the run-time choice of the panel kernel
#include "kernels/cpu/weight_type.h"

namespace ltm::kernels::cpu {

inline constexpr int64_t kPanelWidth = 64;

// Floats a packed [k, n] matrix occupies.
inline size_t packed_floats(int64_t k, int64_t n) {
  return static_cast<size_t>((n + kPanelWidth - 1) / kPanelWidth) * static_cast<size_t>(k) *
         kPanelWidth;
}

// Packs row-major W [k, n] into `packed` (packed_floats(k, n) floats).
void pack_weight(const float* w, int64_t k, int64_t n, float* packed);

// Packs W = E^T for a row-major E [n, k] (the tied embedding: the LM head multiplies by E^T).
void pack_weight_transposed(const float* e, int64_t n, int64_t k, float* packed);

// out[0..k) = column `col` of the packed W [k, n] (a row of E for pack_weight_transposed).
void packed_column(const float* packed, int64_t k, int64_t col, float* out);

// C[m, n] = A[m, k] @ W + beta * C for W packed by pack_weight. beta == 0: C is not read.
void packed_gemm(const float* a, const float* packed, float* c, int64_t m, int64_t n, int64_t k,
                 float beta);

// ---- Weights of any WeightType (weight_type.h): fp32, bf16 or fp16 elements ----
//
// (kInt8 is handed to int8_gemm.h's functions, its own panel layout: packed_bytes, the packing
// of row ranges (whole groups of 32 rows), packed_column and packed_gemm all take it;
// packed_index and panel_rows do not apply.)
//
// The same panel layout with elements of weight_type_size(t) bytes; activations, accumulation
// and C stay fp32 (the 16-bit elements are converted as the kernel reads them). A 16-bit matrix
// is half the bytes, which is what a decode step (m = 1..8, bandwidth-bound) is limited by.
// Packing rounds to nearest even (weight_type.h) and gives the same bytes on every kernel path.
// For t == kF32 these functions give the same bytes and results as the float* ones above.

// bf16 panels interleave pairs of rows (the VNNI layout AMX's tiles read, and what AVX512-BF16's
// dot products take): rows 2q and 2q + 1 of a panel form one pair row of 128 elements holding,
// for each column c, row 2q's element at 2c and row 2q + 1's at 2c + 1. A panel then has k
// rounded up to even rows (the pad row is zero). Every kernel path reads this layout (the fp32
// ones split a pair row into its two rows with a shift and a mask, in registers), so the AMX
// kernel no longer re-lays each panel on every call (62% of its time at 32 rows). fp16 and fp32
// panels keep one row after the other.

// Rows a panel of a [k, n] matrix of type t holds: k, or k rounded up to even for bf16.
inline int64_t panel_rows(int64_t k, WeightType t) {
  return t == WeightType::kBF16 ? (k + 1) / 2 * 2 : k;
}

// Element offset of W[p, j] in a packed [k, n] matrix of type t.
inline size_t packed_index(int64_t k, int64_t p, int64_t j, WeightType t) {
  const int64_t panel = j / kPanelWidth, c = j % kPanelWidth;
  const size_t base = static_cast<size_t>(panel * panel_rows(k, t)) * kPanelWidth;
  if (t == WeightType::kBF16)
    return base + static_cast<size_t>((p / 2) * 2 * kPanelWidth + 2 * c + p % 2);
  return base + static_cast<size_t>(p * kPanelWidth + c);
}

// Bytes a packed [k, n] matrix of type t occupies (ceil(n / 64) panels of panel_rows(k, t) x 64
// elements).
size_t packed_bytes(int64_t k, int64_t n, WeightType t);

// Packs rows [row_begin, row_end) of a row-major W [k, n] (w_rows holds just those rows,
// [row_end - row_begin, n]) into their place in `packed` (packed_bytes(k, n, t) bytes),
// converting to t; pad columns past n of those rows are written as zero. Calling it for
// consecutive row ranges that cover [0, k) packs the whole matrix (streamed loading: no full fp32
// copy needed); the ranges may come in any order, and each range's bytes depend only on its rows.
void pack_weight_rows(const float* w_rows, int64_t row_begin, int64_t row_end, int64_t k,
                      int64_t n, WeightType t, void* packed);

// The same for W = E^T of a row-major E [n, k] (the tied embedding): rows [row_begin, row_end) of
// E, i.e. columns [row_begin, row_end) of W. Ranges covering [0, n) pack the whole matrix, in any
// order. Pad columns (past n, in the last panel) are zeroed by the call whose range ends at n
// (row_end == n): no zeroed buffer is required.
void pack_weight_transposed_rows(const float* e_rows, int64_t row_begin, int64_t row_end,
                                 int64_t n, int64_t k, WeightType t, void* packed);

// out[0..k) = column `col` of the packed W [k, n] as fp32 (a row of E for the transposed pack).
void packed_column(const void* packed, WeightType t, int64_t k, int64_t col, float* out);

// C[m, n] = A[m, k] @ W + beta * C for W packed with type t; fp32 accumulation. beta == 0: C is
// not read.
void packed_gemm(const float* a, const void* packed, WeightType t, float* c, int64_t m,
                 int64_t n, int64_t k, float beta);

}  // namespace ltm::kernels::cpu
