// The Llama family's element-wise ops on the GPU, twins of kernels/cpu/llama_ops.h (same names):
// RMSNorm, its fusion with the residual block's end, rotate-half RoPE and the gated SiLU.
// Arithmetic is float32 (RoPE's cos and sin in double, of the float32 angle, as the CPU's);
// activations may be float32, bf16 or fp16 (`ElemType`: read widened, results rounded once to
// nearest even); norm weights, biases, the residual stream and inv_freq stay float32. Device
// pointers; each call enqueues on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace ltm::kernels::cuda {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]; y of y_type (x and y may alias when
// y_type is float32).
void rms_norm(const float* x, const float* w, void* y, ElemType y_type, int64_t rows,
              int64_t cols, float eps, cudaStream_t stream);

// x[r, :] += residual[r, :] (when non-null), then += bias[:] (when non-null), as the CPU adds
// them; then y[r, :] = rms_norm(x[r, :]). y must not alias x or residual.
void add_residual_rms_norm(float* x, const float* residual, const float* bias, const float* w,
                           void* y, ElemType y_type, int64_t rows, int64_t cols, float eps,
                           cudaStream_t stream);

// In place on the first n_heads heads (head_dim elements each, head_dim even) of each of n_tokens
// rows of x (elements of `type`, rows row_stride elements apart): element i < head_dim / 2 of a
// head paired with i + head_dim / 2, rotated by positions[t] * inv_freq[i].
void rope(void* x, ElemType type, const int32_t* positions, const float* inv_freq,
          int64_t n_tokens, int64_t n_heads, int64_t row_stride, int64_t head_dim,
          cudaStream_t stream);

// out[r, j] = silu(gate_up[r, j]) * gate_up[r, cols + j], silu(g) = g / (1 + e^-g); gate_up
// [rows, 2 cols] and out [rows, cols] of `type` (out must not alias gate_up).
void silu_mul(const void* gate_up, void* out, ElemType type, int64_t rows, int64_t cols,
              cudaStream_t stream);

}  // namespace ltm::kernels::cuda
