// int8_gemm's panel kernel in plain C++ for the build's baseline ISA (int8_gemm.h's layout). The
// reference the vector kernels are tested against, with a dequantizing one
// (tests/kernels/int8_gemm_test.cpp).
#include "kernels/cpu/int8_kernels.h"
#include "kernels/cpu/weight_type.h"

namespace ltm::kernels::cpu::int8::portable {

void panel_gemm(const QuantRows& a, const uint8_t* panel, float* c, int64_t ldc, int64_t m,
                int64_t cols, float beta) {
  constexpr int64_t kWidth = 64, kGroupBytes = 2176;
  const int64_t groups = a.groups, kq = groups * 32;
  for (int64_t i = 0; i < m; ++i) {
    float acc[kWidth] = {};
    const int8_t* qi = a.q + i * kq;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* blk = panel + g * kGroupBytes;
      int32_t isum[kWidth] = {};
      for (int64_t t = 0; t < 8; ++t) {
        const uint8_t* w = blk + 128 + 256 * t;
        const int8_t* x = qi + 32 * g + 4 * t;
        for (int64_t col = 0; col < kWidth; ++col)
          for (int64_t b = 0; b < 4; ++b)
            isum[col] += (static_cast<int32_t>(w[4 * col + b]) - 128) * x[b];
      }
      const float sa = a.scale[i * groups + g];
      for (int64_t col = 0; col < kWidth; ++col) {
        const uint16_t h = static_cast<uint16_t>(blk[2 * col] | (blk[2 * col + 1] << 8));
        acc[col] += static_cast<float>(isum[col]) * (f16_to_f32(h) * sa);
      }
    }
    float* ci = c + i * ldc;
    for (int64_t col = 0; col < cols; ++col)
      ci[col] = beta != 0.0f ? acc[col] + beta * ci[col] : acc[col];
  }
}

}  // namespace ltm::kernels::cpu::int8::portable
