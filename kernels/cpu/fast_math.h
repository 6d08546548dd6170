// exp and tanh in plain arithmetic, so that loops over them vectorize (libm's expf/tanhf are
// scalar calls). exp_approx: Cody-Waite range reduction and a degree-7 Taylor polynomial,
// relative error < 2e-7 over the float range; inputs below -87.3 (including -inf) give 0.
// tanh_approx: 1 - 2 / (1 + e^(2x)), absolute error < 3e-7.
//
// These inline functions are compiled into translation units with different target flags (the
// baseline ones and kernels/cpu/*_avx2.cpp, *_avx512.cpp). An inline function is one entity
// across the program and the linker keeps one of its copies, so an AVX-512 copy could end up
// called from baseline code. Hence the inline namespace, named after the including unit's ISA
// (LTM_FAST_MATH_NS, defined before the include by the ISA units): every ISA gets its own
// entities, with the same source names. And no std templates inside (std::bit_cast): those
// would be shared entities again.
#pragma once

#include <cstdint>

#ifndef LTM_FAST_MATH_NS
#define LTM_FAST_MATH_NS fm_baseline
#endif

namespace ltm::kernels::cpu {
inline namespace LTM_FAST_MATH_NS {

inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const bool underflow = x < -87.3f;
  x = x > 88.3f ? 88.3f : (underflow ? -87.3f : x);
  // Round to nearest even by adding and subtracting 1.5 * 2^23 (|x * log2e| <= 128 here): the
  // same result as roundevenf, which GCC 12 does not vectorize (the loops stayed scalar).
  constexpr float kRound = 12582912.0f;
  const float n = (x * kLog2e + kRound) - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2 / 2
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale =
      __builtin_bit_cast(float, static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return underflow ? 0.0f : p * scale;
}

inline float tanh_approx(float x) { return 1.0f - 2.0f / (1.0f + exp_approx(2.0f * x)); }

}  // namespace LTM_FAST_MATH_NS
}  // namespace ltm::kernels::cpu
