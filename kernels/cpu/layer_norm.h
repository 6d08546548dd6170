// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta.
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu {

// x, y: [rows, cols] (may alias); gamma, beta: [cols].
void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps);

}  // namespace ltm::kernels::cpu
