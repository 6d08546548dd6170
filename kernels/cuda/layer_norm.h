// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta, with the
// biased (population) variance, as torch.nn.LayerNorm. Device pointers; enqueues on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ltm::kernels::cuda {

// x, y: [rows, cols] (may alias); gamma, beta: [cols].
void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps, cudaStream_t stream);

}  // namespace ltm::kernels::cuda
