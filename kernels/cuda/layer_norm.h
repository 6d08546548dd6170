// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta, with the
// biased (population) variance, as torch.nn.LayerNorm. Device pointers; enqueues on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ltm::kernels::cuda {

// x, y: [rows, cols] (may alias); gamma, beta: [cols].
void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps, cudaStream_t stream);

// The end of a residual block and the next LayerNorm in one pass over x (Backend::
// add_bias_residual_layer_norm): x[r, :] = x[r, :] + (residual[r, :] + bias[:]) (without residual:
// x[r, :] + bias[:]), rounded as those two adds are; then y[r, :] = layer_norm(x[r, :]).
// residual may be null; y must not alias x or residual.
void add_bias_residual_layer_norm(float* x, const float* residual, const float* bias,
                                  const float* gamma, const float* beta, float* y, int64_t rows,
                                  int64_t cols, float eps, cudaStream_t stream);

}  // namespace ltm::kernels::cuda
