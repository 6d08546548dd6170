// GELU, tanh approximation (GPT-2's "gelu_new"), fused with the bias add of the FFN's first GEMM.
// Device pointers; enqueues on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace ltm::kernels::cuda {

// x[r, :] = gelu_tanh(x[r, :] + bias[:]); bias may be null.
void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// The same on activations of `type` (bf16 or fp16; float32 runs the function above): widened,
// bias (float32) added and GELU applied in float32, rounded once.
void bias_gelu(void* x, ElemType type, const float* bias, int64_t rows, int64_t cols,
               cudaStream_t stream);

}  // namespace ltm::kernels::cuda
