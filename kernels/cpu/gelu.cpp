#include "kernels/cpu/gelu.h"

#include "kernels/cpu/fast_math.h"

namespace ltm::kernels::cpu {
namespace {

inline float gelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCoeff = 0.044715f;
  return 0.5f * v * (1.0f + tanh_approx(kSqrt2OverPi * (v + kCoeff * v * v * v)));
}

}  // namespace

void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) {
  // Two plain loops: a conditional bias load inside one loop keeps GCC from vectorizing it
  // (measured: scalar code, 7% of a batch-32 decode step).
#pragma omp parallel for schedule(static) if (rows * cols > 8192)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] = gelu_tanh(row[c] + bias[c]);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] = gelu_tanh(row[c]);
    }
  }
}

}  // namespace ltm::kernels::cpu
