#include "kernels/cpu/layer_norm.h"

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/static_for.h"

namespace ltm::kernels::cpu {

void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t cols, float eps) {
  // The row kernel is vec_kernels.inc's, for the chosen ISA; threads over rows here.
  const auto row = kernel_table().layer_norm_row;  // outside the parallel region: may throw
  static_for(rows, rows > 8,
             [&](int64_t r) { row(x + r * cols, gamma, beta, y + r * cols, cols, eps); });
}

}  // namespace ltm::kernels::cpu
