#include "kernels/cpu/layer_norm.h"

#include <cmath>

namespace ltm::kernels::cpu {

void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps) {
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    // Two passes in double-free float with a shifted mean: accurate enough for 1e-4 at d <= 12288.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; ++c) sum += in[c];
    const float mean = sum / static_cast<float>(cols);
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < cols; ++c) {
      const float dlt = in[c] - mean;
      sq += dlt * dlt;
    }
    const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(cols) + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] = (in[c] - mean) * rstd * gamma[c] + beta[c];
  }
}

}  // namespace ltm::kernels::cpu
