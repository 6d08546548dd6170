// The bf16 dot-product paths of packed_gemm for bf16 weights (kernels/cpu/cpu_isa.h: GEMMs of
// >= kAmxMinRows rows round A to bf16 and run on AMX tiles, or with AVX512-BF16's vdpbf16ps on a
// CPU without AMX) against a double-precision reference on the same rounded A and W; ragged k, n
// and m (partial tiles, odd k: the pad row of the last pair), beta, 1 and 2 threads. Reported
// skipped (ctest) on a CPU or kernel with neither AMX-BF16 nor AVX512-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/weight_type.h"

namespace ltm::kernels::cpu {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Max |C - reference| over sqrt(k): the fp32-accumulation bound used by the other GEMM tests.
double check(int64_t m, int64_t n, int64_t k, float beta) {
  const std::vector<float> a = random_vector(m * k, 1 + m), w = random_vector(k * n, 2 + n);
  std::vector<float> c0 = random_vector(m * n, 3);
  std::vector<unsigned char> packed(packed_bytes(k, n, WeightType::kBF16));
  pack_weight_rows(w.data(), 0, k, k, n, WeightType::kBF16, packed.data());
  std::vector<float> c = c0;
  packed_gemm(a.data(), packed.data(), WeightType::kBF16, c.data(), m, n, k, beta);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = beta * double(c0[i * n + j]);
      for (int64_t p = 0; p < k; ++p)
        ref += double(round_to(WeightType::kBF16, a[i * k + p])) *
               round_to(WeightType::kBF16, w[p * n + j]);
      worst = std::max(worst, std::fabs(c[i * n + j] - ref));
    }
  return worst / std::sqrt(double(k));
}

class Amx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!amx_available() && !dpbf16_available())
      GTEST_SKIP() << "AMX not available on this CPU (nor AVX512-BF16)";
    ASSERT_TRUE(set_isa(Isa::kAvx512));
    set_amx(true);
    ASSERT_TRUE(amx_enabled() != dpbf16_enabled());  // one of the two, never both
    std::printf("path: %s\n", amx_enabled() ? "amx-bf16" : "avx512-bf16");
  }
  void TearDown() override { set_blas_threads(saved_); }
  int saved_ = blas_threads();
};

TEST_F(Amx, MatchesReferenceOnRoundedInputs) {
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    for (int64_t m : {20, 48, 64, 100, 512})  // 20, 48: a last block of 16 rows partly padding
      for (int64_t n : {64, 130, 2304})
        for (int64_t k : {37, 100, 768})
          for (float beta : {0.0f, 1.0f}) {
            if (m * n * k > 512ll * 768 * 768) continue;  // keep the reference loop short
            const double err = check(m, n, k, beta);
            EXPECT_LT(err, 1e-5) << m << "x" << n << "x" << k << " beta " << beta << " threads "
                                 << threads;
          }
  }
}

TEST_F(Amx, SmallBatchesAndTheExactPathDoNotRoundActivations) {
  // Below kAmxMinRows (decode), and with AMX off, A stays fp32: the result equals the fp32-A
  // reference, which the rounded one misses by far more than the fp32 tolerance.
  const int64_t k = 256, n = 64;
  for (int64_t m : {int64_t{8}, kAmxMinRows}) {
    set_amx(m < kAmxMinRows);  // on for the small batch (unused there), off for the large one
    const std::vector<float> a = random_vector(m * k, 7), w = random_vector(k * n, 8);
    std::vector<unsigned char> packed(packed_bytes(k, n, WeightType::kBF16));
    pack_weight_rows(w.data(), 0, k, k, n, WeightType::kBF16, packed.data());
    std::vector<float> c(m * n);
    packed_gemm(a.data(), packed.data(), WeightType::kBF16, c.data(), m, n, k, 0.0f);
    double exact = 0, rounded = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double r_exact = 0, r_rounded = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double wv = round_to(WeightType::kBF16, w[p * n + j]);
          r_exact += double(a[i * k + p]) * wv;
          r_rounded += double(round_to(WeightType::kBF16, a[i * k + p])) * wv;
        }
        exact = std::max(exact, std::fabs(c[i * n + j] - r_exact));
        rounded = std::max(rounded, std::fabs(c[i * n + j] - r_rounded));
      }
    std::printf("m %lld: max |C - fp32-A reference| %.3g, |C - bf16-A reference| %.3g\n",
                static_cast<long long>(m), exact, rounded);
    EXPECT_LT(exact, 1e-4);
    EXPECT_GT(rounded, 1e-3);
  }
  set_amx(true);
}

}  // namespace
}  // namespace ltm::kernels::cpu
