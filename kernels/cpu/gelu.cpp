#include "kernels/cpu/gelu.h"

#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu {

void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) {
  // The loops are vec_kernels.inc's, for the chosen ISA; threads over rows here.
  const auto gelu = kernel_table().bias_gelu;  // outside the parallel region: may throw
#pragma omp parallel for schedule(static) if (rows * cols > 8192)
  for (int64_t r = 0; r < rows; ++r) gelu(x + r * cols, bias, 1, cols);
}

}  // namespace ltm::kernels::cpu
