#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/static_for.h"

namespace ltm::kernels::cpu {

// The loops are vec_kernels.inc's, for the chosen ISA; the threading is here.

void add(float* x, const float* y, int64_t n) {
  constexpr int64_t kBlock = 4096;
  const auto kernel = kernel_table().add;  // outside the parallel region: may throw
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  static_for(blocks, n > 16384, [&](int64_t b) {
    kernel(x + b * kBlock, y + b * kBlock, std::min(kBlock, n - b * kBlock));
  });
}

void add_bias(float* x, const float* bias, int64_t rows, int64_t cols) {
  const auto kernel = kernel_table().add_bias;
  static_for(rows, rows * cols > 16384, [&](int64_t r) { kernel(x + r * cols, bias, 1, cols); });
}

void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + i * d, src + static_cast<int64_t>(rows[i]) * d, sizeof(float) * d);
}

}  // namespace ltm::kernels::cpu
