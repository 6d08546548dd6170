// The sampler's row normalizer on each vector path this CPU has (runtime/sampling/sum_exp_isa.h):
// bit for bit the sum a plain scalar loop makes with the same exp and the same lanes (which the
// sharded and CUDA samplers rely on), and within float rounding of exp in long double.
#include "runtime/sampling/sum_exp_isa.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/fast_math.h"
#include "runtime/sampling/sampler.h"

namespace ltm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The contract, written out element by element: weight i = exp_approx((v[i] - m) / t) in lane
// i mod 8, each lane summed in double in index order, the lanes added ((0+1)+(2+3))+((4+5)+(6+7)).
double scalar_block_sum(const float* v, size_t n, float m, float t) {
  double lane[8] = {};
  for (size_t i = 0; i < n; ++i) lane[i % 8] += kernels::cpu::exp_approx((v[i] - m) / t);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Rows of every length a block takes, with values far below the max (exp underflows to 0), -inf
// entries, ties with the max, and temperatures from near zero to large.
TEST(SumExpIsa, EveryPathIsTheScalarSumBitForBit) {
  BlockSumExpPath paths[3];
  const int n_paths = block_sum_exp_paths(paths);
  ASSERT_GE(n_paths, 1);
  EXPECT_STREQ(paths[n_paths - 1].name, "baseline");
  Rng rng(7);
  const float temps[] = {1.0f, 0.37f, 0.8f, 2.5f, 1e-3f, 50.0f};
  int checked = 0;
  for (size_t n = 1; n <= kSumExpBlock; n += (n < 24 ? 1 : 13)) {
    for (float t : temps) {
      std::vector<float> v(n);
      float m = -kInf;
      for (size_t i = 0; i < n; ++i) {
        const double u = rng.uniform();
        v[i] = u < 0.05 ? -kInf : static_cast<float>(-20.0 + 40.0 * rng.uniform());
        if (u > 0.95) v[i] = static_cast<float>(-200.0 * rng.uniform());  // exp -> 0
        m = std::max(m, v[i]);
      }
      if (m == -kInf) v[0] = m = 0.0f;
      if (n > 3) v[n / 2] = m;  // a tie with the max
      const double want = scalar_block_sum(v.data(), n, m, t);
      for (int p = 0; p < n_paths; ++p) {
        const double got = paths[p].fn(v.data(), n, m, t);
        ASSERT_EQ(bits(got), bits(want))
            << paths[p].name << " n " << n << " t " << t << ": " << got << " vs " << want;
        ++checked;
      }
      // And the sum is the softmax normalizer: exp in long double, relative 1e-6.
      long double z = 0;
      for (float x : v) z += std::exp(static_cast<long double>((x - m) / t));
      EXPECT_NEAR(static_cast<double>(want / z), 1.0, 1e-6) << "n " << n << " t " << t;
    }
  }
  EXPECT_GT(checked, 200);
}

// The path sampling takes is one of them (the widest LTM_CPU_ISA allows).
TEST(SumExpIsa, TheChosenPathIsOneOfThisCpusPaths) {
  BlockSumExpPath paths[3];
  const int n_paths = block_sum_exp_paths(paths);
  bool found = false;
  for (int p = 0; p < n_paths; ++p) found = found || paths[p].fn == block_sum_exp_fn();
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace ltm
