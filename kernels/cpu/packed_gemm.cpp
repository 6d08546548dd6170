#include "kernels/cpu/packed_gemm.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_tiles.h"

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

namespace {

#ifdef __AVX512F__
// One panel: C[m, cols at c] (cols = the panel's real columns).
void panel_gemm(const float* a, const float* panel, float* c, int64_t ldc, int64_t m, int64_t k,
                int64_t cols, float beta) {
  if (cols == kPanelWidth) {
    tiles::nt_rows<false>(a, k, panel, kPanelWidth, c, ldc, m, k, beta, nullptr);
    return;
  }
  __mmask16 mk[4];
  for (int v = 0; v < 4; ++v) {
    const int64_t n = std::clamp<int64_t>(cols - 16 * v, 0, 16);
    mk[v] = static_cast<__mmask16>((1u << n) - 1u);
  }
  tiles::nt_rows<true>(a, k, panel, kPanelWidth, c, ldc, m, k, beta, mk);
}
#else
void panel_gemm(const float* a, const float* panel, float* c, int64_t ldc, int64_t m, int64_t k,
                int64_t cols, float beta) {
  for (int64_t i = 0; i < m; ++i) {
    float acc[kPanelWidth] = {};
    const float* ai = a + i * k;
    for (int64_t p = 0; p < k; ++p) {
      const float x = ai[p];
      const float* bp = panel + p * kPanelWidth;
      for (int64_t j = 0; j < kPanelWidth; ++j) acc[j] += x * bp[j];
    }
    float* ci = c + i * ldc;
    for (int64_t j = 0; j < cols; ++j) ci[j] = beta != 0.0f ? acc[j] + beta * ci[j] : acc[j];
  }
}
#endif

}  // namespace

void packed_gemm(const float* a, const float* packed, float* c, int64_t m, int64_t n, int64_t k,
                 float beta) {
  if (m == 0 || n == 0) return;
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t c0 = j * kPanelWidth;
    panel_gemm(a, packed + static_cast<size_t>(j) * k * kPanelWidth, c + c0, n, m, k,
               std::min(kPanelWidth, n - c0), beta);
  }
}

}  // namespace ltm::kernels::cpu
