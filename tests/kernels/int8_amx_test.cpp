// int8_gemm's AMX-INT8 kernel (kernels/cpu/int8_kernels_amx.cpp; prefill-sized m on the AVX-512
// path where the CPU has AMX-INT8) against
//   1. the VNNI kernel (set_amx(false)) bit for bit: the same integer sums, scaled and added in
//      the same fp32 operations;
//   2. the portable kernel and a reference that dequantizes (int8_gemm_test's check, here as a
//      double-precision product of the dequantized sides with the same bound);
// over ragged m (partial blocks of 16 rows), n (partial panels) and k (a pad tail), beta, 1 and
// 2 threads, and that it leaves the AMX-BF16 kernel's tile configuration as it found it.
// Reported skipped on a CPU (or kernel) without AMX-INT8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/weight_type.h"

namespace ltm::kernels::cpu {
namespace {

std::vector<float> random_vec(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<float> gemm(const std::vector<float>& a, const std::vector<uint8_t>& packed,
                        const std::vector<float>& c0, int64_t m, int64_t n, int64_t k, float beta) {
  std::vector<float> c = c0;
  if (beta == 0.0f) std::fill(c.begin(), c.end(), std::nanf(""));  // must not be read
  int8_gemm(a.data(), packed.data(), c.data(), m, n, k, beta);
  return c;
}

class Int8Amx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "AMX-INT8 not available on this CPU";
    saved_isa_ = isa();
    ASSERT_TRUE(set_isa(Isa::kAvx512));
    set_amx(true);
    if (!int8_amx_enabled()) GTEST_SKIP() << "AMX-INT8 not available on this CPU";
    ASSERT_STREQ(int8_kernel_name(kInt8AmxMinRows), "amx-int8");
    ASSERT_STRNE(int8_kernel_name(kInt8AmxMinRows - 1), "amx-int8");
  }
  void TearDown() override {
    set_amx(true);
    set_isa(saved_isa_);
    set_blas_threads(saved_threads_);
  }

  // AMX against VNNI (exact), portable and the dequantizing reference.
  void check(int64_t m, int64_t n, int64_t k, float beta) {
    SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k << " beta=" << beta);
    const auto a = random_vec(m * k, static_cast<unsigned>(m * 131 + k), 2.0f);
    const auto w = random_vec(k * n, static_cast<unsigned>(n * 7 + k), 0.1f);
    const auto c0 = random_vec(m * n, 3);
    std::vector<uint8_t> packed(int8_packed_bytes(k, n));
    int8_pack_rows(w.data(), 0, k, k, n, packed.data());
    const std::vector<float> amx = gemm(a, packed, c0, m, n, k, beta);
    set_amx(false);
    const std::vector<float> vnni = gemm(a, packed, c0, m, n, k, beta);
    set_isa(Isa::kPortable);
    const std::vector<float> port = gemm(a, packed, c0, m, n, k, beta);
    set_isa(Isa::kAvx512);
    set_amx(true);
    ASSERT_EQ(amx, vnni) << "the VNNI kernel's result, bit for bit";
    // The dequantizing reference: W from the packed bytes, A quantized as int8_gemm does.
    std::vector<float> wd(k * n), col(k);
    for (int64_t j = 0; j < n; ++j) {
      int8_packed_column(packed.data(), k, j, col.data());
      for (int64_t p = 0; p < k; ++p) wd[p * n + j] = col[p];
    }
    const int64_t groups = int8_groups(k);
    std::vector<int8_t> q(groups * kInt8Group);
    std::vector<float> s(groups);
    for (int64_t i = 0; i < m; ++i) {
      int8_quantize_row(a.data() + i * k, k, q.data(), s.data());
      for (int64_t j = 0; j < n; ++j) {
        double ref = beta * static_cast<double>(c0[i * n + j]), mag = std::fabs(ref);
        for (int64_t p = 0; p < k; ++p) {
          const double t = static_cast<double>(q[p]) * s[p / kInt8Group] * wd[p * n + j];
          ref += t;
          mag += std::fabs(t);
        }
        const double bound = 1e-6 * mag + 1e-6;
        ASSERT_NEAR(amx[i * n + j], ref, bound) << "dequantizing reference, " << i << "," << j;
        ASSERT_NEAR(amx[i * n + j], port[i * n + j], 2 * bound) << "portable, " << i << "," << j;
      }
    }
  }

 private:
  Isa saved_isa_ = Isa::kPortable;
  int saved_threads_ = blas_threads();
};

TEST_F(Int8Amx, RaggedShapes) {
  for (int64_t m : {16, 17, 31, 32, 47, 100})
    for (int64_t n : {5, 64, 100, 130})
      for (int64_t k : {1, 32, 33, 96, 100})
        for (float beta : {0.0f, 0.5f}) check(m, n, k, beta);
}

TEST_F(Int8Amx, Gpt2ShapesOneAndTwoThreads) {
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    check(64, 2304, 768, 0.0f);
    check(40, 768, 3072, 1.0f);
    check(128, 130, 64, 0.0f);  // 3 panels for 2 threads: rows are split too
  }
}

TEST_F(Int8Amx, LeavesTheBf16TilesAlone) {
  // The AMX-BF16 kernel configures its tiles once per thread (packed_gemm_amx.cpp): an int8 GEMM
  // between two bf16 ones must leave that configuration loaded.
  if (!amx_enabled()) GTEST_SKIP() << "no AMX-BF16 kernel here";
  set_blas_threads(1);
  const int64_t m = 32, n = 64, k = 64;
  const auto a = random_vec(m * k, 1), w = random_vec(k * n, 2);
  std::vector<unsigned char> bf(packed_bytes(k, n, WeightType::kBF16));
  pack_weight_rows(w.data(), 0, k, k, n, WeightType::kBF16, bf.data());
  std::vector<uint8_t> i8(int8_packed_bytes(k, n));
  int8_pack_rows(w.data(), 0, k, k, n, i8.data());
  std::vector<float> first(m * n), second(m * n), c(m * n);
  packed_gemm(a.data(), bf.data(), WeightType::kBF16, first.data(), m, n, k, 0.0f);
  int8_gemm(a.data(), i8.data(), c.data(), m, n, k, 0.0f);
  packed_gemm(a.data(), bf.data(), WeightType::kBF16, second.data(), m, n, k, 0.0f);
  EXPECT_EQ(first, second);
  std::vector<float> again(m * n);  // and int8's own configuration is loaded again each call
  int8_gemm(a.data(), i8.data(), again.data(), m, n, k, 0.0f);
  EXPECT_EQ(c, again);
}

}  // namespace
}  // namespace ltm::kernels::cpu
