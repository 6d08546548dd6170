#include "kernels/cpu/gelu.h"

#include "kernels/cpu/fast_math.h"

namespace ltm::kernels::cpu {

void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCoeff = 0.044715f;
#pragma omp parallel for schedule(static) if (rows * cols > 8192)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const float v = row[c] + (bias ? bias[c] : 0.0f);
      row[c] = 0.5f * v * (1.0f + tanh_approx(kSqrt2OverPi * (v + kCoeff * v * v * v)));
    }
  }
}

}  // namespace ltm::kernels::cpu
