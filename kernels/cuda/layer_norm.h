// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta, with the
// biased (population) variance, as torch.nn.LayerNorm. Device pointers; enqueues on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace ltm::kernels::cuda {

// x, y: [rows, cols] (may alias when y is float32); gamma, beta: [cols]. y holds elements of
// y_type (bf16/fp16: the statistics and the affine map in float32, the result rounded once).
void layer_norm(const float* x, const float* gamma, const float* beta, void* y, ElemType y_type,
                int64_t rows, int64_t cols, float eps, cudaStream_t stream);

// The end of a residual block and the next LayerNorm in one pass over x (Backend::
// add_bias_residual_layer_norm): x[r, :] = x[r, :] + (residual[r, :] + bias[:]) (without residual:
// x[r, :] + bias[:]), rounded as those two adds are; then y[r, :] = layer_norm(x[r, :]).
// residual may be null; y (elements of y_type, as for layer_norm) must not alias x or residual.
// x, the residual stream, stays float32.
void add_bias_residual_layer_norm(float* x, const float* residual, const float* bias,
                                  const float* gamma, const float* beta, void* y, ElemType y_type,
                                  int64_t rows, int64_t cols, float eps, cudaStream_t stream);

}  // namespace ltm::kernels::cuda
