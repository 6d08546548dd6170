// The Llama family's element-wise ops on the CPU (RMSNorm, rotate-half RoPE, the gated SiLU),
// threaded over rows; the row loops are llama_kernels.inc's for the ISA chosen at run time.
// All arrays are host fp32, row-major.
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]  (x and y may alias).
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t cols, float eps);

// x[r, :] += residual[r, :] (when non-null) + bias[:] (when non-null), then
// y[r, :] = rms_norm(x[r, :]); one pass over each row (y must not alias x or residual).
void add_residual_rms_norm(float* x, const float* residual, const float* bias, const float* w,
                           float* y, int64_t rows, int64_t cols, float eps);

// Rotary position embedding as HF applies it (rotate-half): for each row t, its first n_heads
// heads of head_dim elements (rows are `row_stride` elements apart) are rotated in place by
// angles positions[t] * inv_freq[i], i < head_dim / 2, element i paired with i + head_dim / 2:
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin.
// The angle is the fp32 product, as in HF; its cos and sin are computed in double.
void rope(float* x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
          int64_t n_heads, int64_t row_stride, int64_t head_dim);

// out[r, j] = silu(gate_up[r, j]) * gate_up[r, cols + j], silu(g) = g / (1 + e^-g).
// gate_up is [rows, 2 * cols]; out [rows, cols] must not alias it.
void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols);

}  // namespace ltm::kernels::cpu
