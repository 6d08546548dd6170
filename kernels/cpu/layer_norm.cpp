#include "kernels/cpu/layer_norm.h"

#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu {

void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps) {
  // The row kernel is vec_kernels.inc's, for the chosen ISA; threads over rows here.
  const auto row = kernel_table().layer_norm_row;  // outside the parallel region: may throw
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) row(x + r * cols, gamma, beta, y + r * cols, cols, eps);
}

}  // namespace ltm::kernels::cpu
