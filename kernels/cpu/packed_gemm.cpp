#include "kernels/cpu/packed_gemm.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm.h"

#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu {

void pack_weight(const float* w, int64_t k, int64_t n, float* packed) {
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t c0 = j * kPanelWidth;
    const int64_t cols = std::min(kPanelWidth, n - c0);
    float* panel = packed + static_cast<size_t>(j) * k * kPanelWidth;
    for (int64_t p = 0; p < k; ++p) {
      float* dst = panel + p * kPanelWidth;
      std::memcpy(dst, w + p * n + c0, static_cast<size_t>(cols) * sizeof(float));
      if (cols < kPanelWidth) std::fill(dst + cols, dst + kPanelWidth, 0.0f);
    }
  }
}

void pack_weight_transposed(const float* e, int64_t n, int64_t k, float* packed) {
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t r0 = j * kPanelWidth;
    const int64_t rows = std::min(kPanelWidth, n - r0);
    float* panel = packed + static_cast<size_t>(j) * k * kPanelWidth;
    // Tiles of 64 x 16 so that both the 64 rows of E and the panel stay in L1.
    for (int64_t p0 = 0; p0 < k; p0 += 16) {
      const int64_t p1 = std::min(k, p0 + 16);
      for (int64_t p = p0; p < p1; ++p)
        std::fill(panel + p * kPanelWidth + rows, panel + (p + 1) * kPanelWidth, 0.0f);
      for (int64_t c = 0; c < rows; ++c) {
        const float* src = e + (r0 + c) * k;
        for (int64_t p = p0; p < p1; ++p) panel[p * kPanelWidth + c] = src[p];
      }
    }
  }
}

void packed_column(const float* packed, int64_t k, int64_t col, float* out) {
  const float* panel = packed + static_cast<size_t>(col / kPanelWidth) * k * kPanelWidth;
  const int64_t c = col % kPanelWidth;
  for (int64_t p = 0; p < k; ++p) out[p] = panel[p * kPanelWidth + c];
}

void packed_gemm(const float* a, const float* packed, float* c, int64_t m, int64_t n, int64_t k,
                 float beta) {
  if (m == 0 || n == 0) return;
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
  const auto panel_gemm = kernel_table().panel_gemm;  // outside the parallel region: may throw
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t c0 = j * kPanelWidth;
    panel_gemm(a, packed + static_cast<size_t>(j) * k * kPanelWidth, c + c0, n, m, k,
               std::min(kPanelWidth, n - c0), beta);
  }
}

}  // namespace ltm::kernels::cpu
