// mma.sync.m16n8k16 (kernels/cuda/mma_16816.h) emulated on the CPU for the tests that run a
// warp's 32 lanes one after the other: the lanes' fragments are decoded by the layouts PTX
// documents ("Matrix fragments for mma.m16n8k16", written out in kernels/cuda/attention_mma.h),
// multiplied in float64 and added to each lane's accumulators. Elements a fragment does not set
// stay NaN, so a layout that misses one poisons the result instead of reading a stale zero.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>

#include "runtime/model/dtype.h"

namespace ltm::host_mma {

// a[l]: lane l's A fragment (4 registers), b[l]: its B fragment (2), c[l]: its 4 accumulators.
template <bool kBf16>
void mma_16816(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], float* const (&c)[32]) {
  auto f = [](uint32_t reg, int half) {
    const auto bits = static_cast<uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16);
    return kBf16 ? bf16_to_f32(bits) : f16_to_f32(bits);
  };
  float am[16][16], bm[16][8];
  for (auto& r : am) std::fill(std::begin(r), std::end(r), std::nanf(""));
  for (auto& r : bm) std::fill(std::begin(r), std::end(r), std::nanf(""));
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    for (int h = 0; h < 2; ++h) {
      am[g][2 * t + h] = f(a[l][0], h);
      am[g + 8][2 * t + h] = f(a[l][1], h);
      am[g][2 * t + 8 + h] = f(a[l][2], h);
      am[g + 8][2 * t + 8 + h] = f(a[l][3], h);
      bm[2 * t + h][g] = f(b[l][0], h);
      bm[2 * t + 8 + h][g] = f(b[l][1], h);
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
      double sum = 0;
      for (int k = 0; k < 16; ++k) sum += static_cast<double>(am[row][k]) * bm[k][col];
      c[l][e] = static_cast<float>(c[l][e] + sum);
    }
  }
}

// A warp on the CPU: every lane's registers, the operations mma_16816.h's DeviceWarp runs.
template <class LaneT>
struct HostWarp {
  LaneT lanes[32];
  int mma_calls = 0;

  template <class F>
  void each(F&& f) {
    for (int l = 0; l < 32; ++l) f(lanes[l], l);
  }
  template <bool kBf16, class A, class B, class C>
  void mma(A&& a_fn, B&& b_fn, C&& c_fn) {
    ++mma_calls;
    uint32_t a[32][4], b[32][2];
    float* c[32];
    for (int l = 0; l < 32; ++l) {
      a_fn(lanes[l], l, a[l]);
      b_fn(lanes[l], l, b[l]);
      c[l] = c_fn(lanes[l]);
    }
    mma_16816<kBf16>(a, b, c);
  }
};

}  // namespace ltm::host_mma
