#include "kernels/cpu/gelu.h"

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/static_for.h"

namespace ltm::kernels::cpu {

void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) {
  // The loops are vec_kernels.inc's, for the chosen ISA; threads over rows here.
  const auto gelu = kernel_table().bias_gelu;  // outside the parallel region: may throw
  static_for(rows, rows * cols > 8192, [&](int64_t r) { gelu(x + r * cols, bias, 1, cols); });
}

}  // namespace ltm::kernels::cpu
