// int8 weights on the GPU (--weight-dtype int8): the quants and scales of kernels/cpu/int8_quant.h
// (the CPU backend's rule, so both backends hold the same values), laid out for a warp per column.
//
// A weight W [k, n] is held as its n columns, each a row of kp = ceil(k / 32) * 32 int8 (the
// column's k weights, zero past k), then the n columns' scales, ceil(k / 32) fp16 each:
//   bytes [0, n kp): q[c, p] = quant of W[p, c];  bytes [n kp, n kp + 2 n kp / 32): scales.
// That is 1.0625 bytes a weight. A tied embedding E [rows, d] is the same with n = rows, k = d
// (its rows are already columns of E^T): one copy serves embed() and lm_head().
//
// GEMM: C[m, n] = epilogue(A[m, k] W + beta C), A and C float32 or 16-bit. Up to
// kInt8GemvMaxRows rows of A (decode, a verify step, a small batch) the weight-streaming kernel:
// one warp a column, the quants read once for all the rows, each converted exactly to float
// (int8_lane.h) and multiplied in float32 with A's values as they are; bias and GELU are applied
// in float32 and C rounded once. Up to kInt8MmaMaxRows rows (a batched decode or verify step),
// on compute capability 8.0 and up: int8_gemm_mma, the quants as exact fp16 integers into
// mma.sync with A in fp16, the scales applied in float32 (int8_mma.h), so the weight is still
// read once. More rows (prefill), or LTM_CUDA_INT8_MMA=0: int8_dequantize into a 16-bit [n, k]
// scratch and a tensor-core GEMM on it (the CUDA backend's cuBLASLt path), where the conversion
// costs the weight's read twice over but the GEMM is compute-bound anyway.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace ltm::kernels::cuda {

inline constexpr int64_t kInt8GemvMaxRows = 16;
inline constexpr int64_t kInt8MmaMaxRows = 64;  // int8_mma.h's kMmaMaxRows

// A column's quants: k rounded up to whole groups of 32.
inline int64_t int8_padded_k(int64_t k) { return (k + 31) / 32 * 32; }

// Bytes of an int8 weight of n columns of k (the quants, then the scales).
inline size_t int8_weight_bytes(int64_t n, int64_t k) {
  const int64_t kp = int8_padded_k(k);
  return static_cast<size_t>(n * kp + 2 * n * (kp / 32));
}

// A view of such a weight in device memory.
struct Int8Weight {
  const int8_t* q = nullptr;
  const uint16_t* scales = nullptr;  // fp16 bits
  int64_t n = 0;
  int64_t k = 0;
};
inline Int8Weight int8_weight(const void* data, int64_t n, int64_t k) {
  const int64_t kp = int8_padded_k(k);
  const auto* q = static_cast<const int8_t*>(data);
  return Int8Weight{q, reinterpret_cast<const uint16_t*>(q + n * kp), n, k};
}

// C[m, n] = epilogue(A[m, k] W + beta C) for m <= kInt8GemvMaxRows: A [m, k] of a_type, C [m, n]
// of c_type (read only where beta != 0), bias [n] float32 or null, gelu: GELU (tanh) after the
// bias. m <= 0 or n <= 0 does nothing; k = 0 gives epilogue(beta C).
void int8_gemv(const void* a, ElemType a_type, Int8Weight w, void* c, ElemType c_type, int64_t m,
               float beta, const float* bias, bool gelu, cudaStream_t stream);

// Whether int8_gemm_mma runs on the current device: compute capability 8.0 or later, and the
// environment's LTM_CUDA_INT8_MMA is not 0 (0: the dequantizing path, to compare in one run).
bool int8_mma_available();

// Workspace int8_gemm_mma needs for m rows of an n x k weight: float32 partial sums when k is
// split (narrow weights: n too small to fill the GPU), else 0. splits: as int8_gemm_mma's.
size_t int8_mma_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t splits = 0);

// C[m, n] = epilogue(A[m, k] W + beta C) on the tensor cores, for m <= kInt8MmaMaxRows where
// int8_mma_available(): A fp16 [m, k], C of c_type (read only where beta != 0), bias [n] float32
// or null, gelu: GELU (tanh) after the bias. workspace: int8_mma_workspace_bytes of it. splits:
// the pieces of k (whole groups of 32), 0 to choose them for the device's SMs; tests force them.
void int8_gemm_mma(const void* a, Int8Weight w, void* c, ElemType c_type, int64_t m, float beta,
                   const float* bias, bool gelu, void* workspace, cudaStream_t stream,
                   int64_t splits = 0);

// out [n, k] (row c: column c of W, dequantized) of `type`, rounded once from q * scale.
void int8_dequantize(Int8Weight w, void* out, ElemType type, cudaStream_t stream);

// out[t, :] = row ids[t] - row_begin of a table held as above (n = row_end - row_begin rows of
// k = d), dequantized, for ids inside [row_begin, row_end), else zeros. out is float32 [n_tokens, d].
void int8_embedding(const int32_t* ids, Int8Weight table, int64_t row_begin, int64_t row_end,
                    float* out, int64_t n_tokens, cudaStream_t stream);

}  // namespace ltm::kernels::cuda
