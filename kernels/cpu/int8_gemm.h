// int8 weights for the CPU GEMM (--weight-dtype int8): symmetric int8 with one scale per group of
// 32 weights along the reduction dimension k (8.5 bits a weight, as llama.cpp's Q8_0), quantized
// at load from fp32 rows (each rank quantizes its own slice).
//
// Layout. W [k, n] is held, like the other weight types (packed_gemm.h), as ceil(n / 64) column
// panels of 64 columns. A panel is ceil(k / 32) group blocks of kInt8GroupBytes (2176) bytes, one
// per group g of 32 rows of W:
//   bytes [0, 128): the 64 columns' scales, fp16 (s[c] = max |W[32g .. 32g+31, c]| / 127, rounded
//     to fp16; the weights are then rounded to nearest of W / s, so that q * s is what is used);
//   bytes [128, 2176): 8 quads of 4 rows; quad t holds, for each column c, the 4 weights
//     W[32g + 4t .. 32g + 4t + 3, c] as 4 consecutive bytes at 128 + 256 t + 4 c, each stored as
//     q + 128 (unsigned, 1 .. 255; 128 is zero).
// Rows past k (to the next multiple of 32) and columns past n hold zero (scale 0, byte 128).
// Four bytes of a column in one 32-bit lane is what VNNI's vpdpbusd and AVX2's maddubs + madd
// sum: one lane per column, no shuffles.
//
// GEMM. C[m, n] = A[m, k] @ W + beta * C with A fp32: each row of A is quantized per group of 32
// the same way (scale max|a| / 127, to nearest; kept in fp32), the products of a group are summed
// exactly in int32 and scaled by s_a * s_w into an fp32 accumulator, group after group. The kernel
// is chosen at run time (cpu_isa.h): AVX-512 VNNI (int8_kernels_avx512.cpp; when the AVX-512 path
// is in use and the CPU has VNNI), AVX2 (int8_kernels_avx2.cpp; also the AVX-512 path's kernel on
// a CPU without VNNI), or portable C++ (int8_kernels_portable.cpp). All of them compute the same
// integer sums; they differ only in the order of fp32 roundings (fma or not).
// Decode (m == 1) on the VNNI and AVX2 kernels walks 4 panels per thread at once, as packed_gemm
// does (LTM_INT8_GEMV=0 walks them one by one, for comparisons). GEMMs of kInt8AmxMinRows rows or
// more on a CPU with AMX-INT8 run on tiles (int8_kernels_amx.cpp: each 32-deep group's exact
// int32 tile product scaled into fp32 with AVX-512, as the VNNI kernel scales its group sums, so
// the result is the VNNI kernel's bit for bit).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ltm::kernels::cpu {

inline constexpr int64_t kInt8Group = 32;          // weights per scale, along k
inline constexpr int64_t kInt8GroupBytes = 2176;   // 64 fp16 scales + 32 x 64 bytes

// Groups of k: ceil(k / 32).
inline int64_t int8_groups(int64_t k) { return (k + kInt8Group - 1) / kInt8Group; }

// Bytes a packed int8 [k, n] matrix occupies.
size_t int8_packed_bytes(int64_t k, int64_t n);

// Packs rows [row_begin, row_end) of a row-major fp32 W [k, n] (w_rows holds just those rows)
// into their place in `packed` (int8_packed_bytes(k, n) bytes). A group's scale needs all of its
// rows: row_begin must be a multiple of 32 and row_end one too or k (std::invalid_argument
// otherwise). Ranges may come in any order; pad rows and columns are written by the calls whose
// ranges hold them, so no zeroed buffer is required.
void int8_pack_rows(const float* w_rows, int64_t row_begin, int64_t row_end, int64_t k, int64_t n,
                    void* packed);

// The same for W = E^T of a row-major E [n, k] (the tied embedding): rows [row_begin, row_end) of
// E, i.e. columns of W, each row whole (k values), so any ranges do. Pad columns past n are
// written by the call whose range ends at n.
void int8_pack_transposed_rows(const float* e_rows, int64_t row_begin, int64_t row_end, int64_t n,
                               int64_t k, void* packed);

// out[0..k) = column `col` of the packed W dequantized (q * s), fp32.
void int8_packed_column(const void* packed, int64_t k, int64_t col, float* out);

// C[m, n] = A[m, k] @ W + beta * C (see above). beta == 0: C is not read.
void int8_gemm(const float* a, const void* packed, float* c, int64_t m, int64_t n, int64_t k,
               float beta);

// Which kernel int8_gemm runs on the current path: "avx512-vnni", "avx2" or "portable";
// with m, for m rows of A: "amx-int8" where int8_amx_enabled() and m >= kInt8AmxMinRows.
const char* int8_kernel_name();
const char* int8_kernel_name(int64_t m);

// AMX-INT8 for GEMMs of at least kInt8AmxMinRows rows of A (prefill; decode stays on the VNNI
// kernel): on the AVX-512 path when the CPU has AMX-INT8 and AMX is on (cpu_isa.h: amx_enabled(),
// LTM_AMX=0 and set_amx(false) turn it off with the bf16 AMX kernel). Same integer sums and the
// same fp32 roundings as the VNNI kernel.
inline constexpr int64_t kInt8AmxMinRows = 16;
bool int8_amx_enabled();

// Tests and references: the quantization of one row of A as int8_gemm does it. q gets
// int8_groups(k) * 32 values (zero past k), scales one fp32 per group.
void int8_quantize_row(const float* a, int64_t k, int8_t* q, float* scales);
// The same on the current path's vector code (bit for bit int8_quantize_row's), plus each
// group's sum of q.
void int8_quantize_row_for_path(const float* a, int64_t k, int8_t* q, float* scales,
                                int32_t* sums);

}  // namespace ltm::kernels::cpu
