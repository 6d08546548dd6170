#include "kernels/cpu/elementwise.h"

#include <cstring>

namespace ltm::kernels::cpu {

void add(float* x, const float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void add_bias(float* x, const float* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + i * d, src + static_cast<int64_t>(rows[i]) * d, sizeof(float) * d);
}

}  // namespace ltm::kernels::cpu
