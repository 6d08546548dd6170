// GELU, tanh approximation (GPT-2's "gelu_new"), fused with the bias add of the FFN's first GEMM.
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu {

// x[r, :] = gelu_tanh(x[r, :] + bias[:]); bias may be null.
void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols);

}  // namespace ltm::kernels::cpu
