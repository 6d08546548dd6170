// packed_gemm's panel kernel in plain C++ for the build's baseline ISA: the compiler vectorizes
// the 64-wide inner loop with whatever the baseline has (SSE at x86-64-v2). Include only
// isa_kernels.h here: see there why.
#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu::portable {

void panel_gemm(const float* a, const float* panel, float* c, int64_t ldc, int64_t m, int64_t k,
                int64_t cols, float beta) {
  constexpr int64_t kWidth = 64;  // kPanelWidth
  for (int64_t i = 0; i < m; ++i) {
    float acc[kWidth] = {};
    const float* ai = a + i * k;
    for (int64_t p = 0; p < k; ++p) {
      const float x = ai[p];
      const float* bp = panel + p * kWidth;
      for (int64_t j = 0; j < kWidth; ++j) acc[j] += x * bp[j];
    }
    float* ci = c + i * ldc;
    for (int64_t j = 0; j < cols; ++j) ci[j] = beta != 0.0f ? acc[j] + beta * ci[j] : acc[j];
  }
}

}  // namespace ltm::kernels::cpu::portable
