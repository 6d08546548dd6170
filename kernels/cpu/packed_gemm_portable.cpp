// packed_gemm's panel kernel in plain C++ for the build's baseline ISA: the compiler vectorizes
// the 64-wide inner loop with whatever the baseline has (SSE at x86-64-v2). Include only
// isa_kernels.h here: see there why.
#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu::portable {
namespace {

// 16-bit panels: each chunk of kChunk panel rows is converted once into an fp32 scratch (the
// path's vectorized conversions, vec_kernels.inc; bf16 panels hold pairs of rows, packed_gemm.h), then the same loop as the fp32 panel runs on
// it, accumulating into C across chunks.
template <bool kF16>
void panel_gemm16(const float* a, const uint16_t* panel, float* c, int64_t ldc, int64_t m,
                  int64_t k, int64_t cols, float beta) {
  constexpr int64_t kWidth = 64;  // kPanelWidth
  constexpr int64_t kChunk = 64;
  alignas(64) float scratch[kChunk * kWidth];
  for (int64_t p0 = 0; p0 < k; p0 += kChunk) {
    const int64_t kc = k - p0 < kChunk ? k - p0 : kChunk;
    if constexpr (kF16) {
      f16_to_f32_n(panel + p0 * kWidth, scratch, kc * kWidth);
    } else {
      bf16_pairs_to_f32(panel + p0 * kWidth, scratch, kc);  // p0 even: pair row p0 / 2
    }
    for (int64_t i = 0; i < m; ++i) {
      float acc[kWidth] = {};
      const float* ai = a + i * k + p0;
      for (int64_t p = 0; p < kc; ++p) {
        const float x = ai[p];
        const float* bp = scratch + p * kWidth;
        for (int64_t j = 0; j < kWidth; ++j) acc[j] += x * bp[j];
      }
      float* ci = c + i * ldc;
      if (p0 > 0) {
        for (int64_t j = 0; j < cols; ++j) ci[j] += acc[j];
      } else {
        for (int64_t j = 0; j < cols; ++j) ci[j] = beta != 0.0f ? acc[j] + beta * ci[j] : acc[j];
      }
    }
  }
}

}  // namespace

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

void panel_gemm_bf16(const float* a, const uint16_t* panel, float* c, int64_t ldc, int64_t m,
                     int64_t k, int64_t cols, float beta) {
  panel_gemm16<false>(a, panel, c, ldc, m, k, cols, beta);
}

void panel_gemm_f16(const float* a, const uint16_t* panel, float* c, int64_t ldc, int64_t m,
                    int64_t k, int64_t cols, float beta) {
  panel_gemm16<true>(a, panel, c, ldc, m, k, cols, beta);
}

}  // namespace ltm::kernels::cpu::portable
