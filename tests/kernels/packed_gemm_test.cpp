// packed_gemm (weights packed into 64-column panels) against OpenBLAS sgemm on the row-major
// matrix, and the CPU backend's upload_weight + matmul on the same inputs; the GEMM tests run once
// per kernel path the CPU supports (PackedGemmIsa/*/avx512, /avx2, /portable).
#include "kernels/cpu/packed_gemm.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "runtime/backend/backend.h"
#include "tests/kernels/isa_param.h"

namespace ltm::kernels::cpu {
namespace {

struct Inputs {
  std::vector<float> a, w, c0;
};

Inputs random_inputs(int64_t m, int64_t n, int64_t k) {
  std::mt19937 rng(static_cast<unsigned>(m * 7919 + n * 31 + k));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Inputs in{std::vector<float>(m * k), std::vector<float>(k * n), std::vector<float>(m * n)};
  for (auto* v : {&in.a, &in.w, &in.c0})
    for (float& x : *v) x = u(rng);
  return in;
}

std::vector<float> reference(const Inputs& in, int64_t m, int64_t n, int64_t k, float beta) {
  std::vector<float> ref = in.c0;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, in.a.data(), k,
              in.w.data(), n, beta, ref.data(), n);
  return ref;
}

void expect_close(const std::vector<float>& out, const std::vector<float>& ref, int64_t m,
                  int64_t n, int64_t k, float beta) {
  double max_diff = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(out[i] - ref[i])));
  // Sums of k products of numbers in [-1, 1]: rounding grows like sqrt(k).
  const double tol = 1e-5 * (std::sqrt(static_cast<double>(k)) + 1.0);
  EXPECT_LT(max_diff, tol) << "m=" << m << " n=" << n << " k=" << k << " beta=" << beta;
}

void check(int64_t m, int64_t n, int64_t k, float beta) {
  const Inputs in = random_inputs(m, n, k);
  std::vector<float> packed(packed_floats(k, n), std::nanf(""));
  pack_weight(in.w.data(), k, n, packed.data());
  std::vector<float> out = in.c0;
  if (beta == 0.0f) std::fill(out.begin(), out.end(), std::nanf(""));  // must not be read
  packed_gemm(in.a.data(), packed.data(), out.data(), m, n, k, beta);
  expect_close(out, reference(in, m, n, k, beta), m, n, k, beta);
}

class PackedGemmIsa : public IsaTest {};

TEST(PackedGemm, PackingLayout) {
  const int64_t k = 3, n = 70;  // two panels, the second with 6 real columns
  std::vector<float> w(k * n);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i + 1);
  std::vector<float> packed(packed_floats(k, n), -1.0f);
  ASSERT_EQ(packed.size(), static_cast<size_t>(2 * k * kPanelWidth));
  pack_weight(w.data(), k, n, packed.data());
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t panel = j / kPanelWidth, col = j % kPanelWidth;
      EXPECT_EQ(packed[(panel * k + p) * kPanelWidth + col], w[p * n + j]) << p << "," << j;
    }
  for (int64_t p = 0; p < k; ++p)
    for (int64_t col = n - kPanelWidth; col < kPanelWidth; ++col)
      EXPECT_EQ(packed[(k + p) * kPanelWidth + col], 0.0f) << "padding " << p << "," << col;
}

TEST_P(PackedGemmIsa, Gpt2ShapesEveryBatchSize) {
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 13, 32, 64, 100})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}})
      for (float beta : {0.0f, 1.0f}) check(m, n, k, beta);
}

TEST_P(PackedGemmIsa, RaggedShapes) {
  // n not a multiple of the panel (or of 16 or 8), k shorter and longer than the 64- and 128-row
  // chunks; m covering every register tile's row count (1 to 6) and a remainder after 6.
  for (int64_t m : {1, 2, 3, 4, 5, 9})
    for (int64_t n : {1, 15, 17, 40, 63, 65, 130})
      for (int64_t k : {1, 7, 64, 65, 128, 129, 300})
        for (float beta : {0.0f, 1.0f, 0.5f}) check(m, n, k, beta);
}

TEST_P(PackedGemmIsa, LongPrefill) { check(512, 576, 384, 0.0f); }

TEST_P(PackedGemmIsa, OneAndTwoThreads) {
  const int saved = blas_threads();
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    check(32, 2304, 768, 0.0f);
    check(3, 200, 64, 1.0f);
  }
  set_blas_threads(saved);
}

TEST_P(PackedGemmIsa, CpuBackendUploadWeightAndMatmul) {
  auto backend = make_cpu_backend(2);
  const int64_t m = 11, n = 200, k = 96;
  const Inputs in = random_inputs(m, n, k);
  for (bool host_outlives : {false, true}) {
    DeviceBuffer w = backend->upload_weight(in.w.data(), k, n, host_outlives);
    std::vector<float> out = in.c0;
    backend->matmul(in.a.data(), w, out.data(), m, n, k, 1.0f);
    expect_close(out, reference(in, m, n, k, 1.0f), m, n, k, 1.0f);
  }
}

TEST(PackedGemm, TransposedPackingAndColumns) {
  // E [n, k] packed as E^T: column c of the packed [k, n] matrix is row c of E.
  const int64_t n = 130, k = 37;
  std::vector<float> e(n * k);
  for (size_t i = 0; i < e.size(); ++i) e[i] = static_cast<float>(i) * 0.5f - 7.0f;
  std::vector<float> packed(packed_floats(k, n), std::nanf(""));
  pack_weight_transposed(e.data(), n, k, packed.data());
  std::vector<float> col(k);
  for (int64_t c = 0; c < n; ++c) {
    packed_column(packed.data(), k, c, col.data());
    for (int64_t p = 0; p < k; ++p) ASSERT_EQ(col[p], e[c * k + p]) << "row " << c << " of E";
  }
  for (int64_t p = 0; p < k; ++p)  // padding of the last panel (130 = 2 * 64 + 2)
    for (int64_t c = n % kPanelWidth; c < kPanelWidth; ++c)
      ASSERT_EQ(packed[(2 * k + p) * kPanelWidth + c], 0.0f);
}

TEST_P(PackedGemmIsa, CpuBackendEmbedAndLmHead) {
  auto backend = make_cpu_backend(2);
  const int64_t rows = 200, d = 48, m = 7;  // this rank holds vocab rows [100, 300)
  const Inputs in = random_inputs(m, rows, d);  // a [m, d], w read as E [rows, d]
  const std::vector<float>& e = in.w;
  DeviceBuffer table = backend->upload_embedding(e.data(), rows, d, false);
  std::vector<float> logits(m * rows, std::nanf("")), ref(m * rows);
  backend->lm_head(in.a.data(), table, logits.data(), m, rows, d);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, rows, d, 1.0f, in.a.data(), d, e.data(),
              d, 0.0f, ref.data(), rows);
  expect_close(logits, ref, m, rows, d, 0.0f);

  const std::vector<int32_t> ids = {100, 299, 5, 300, 150};  // 5 and 300 belong to other ranks
  std::vector<float> out(ids.size() * d, std::nanf(""));
  backend->embed(ids.data(), table, 100, 300, out.data(), static_cast<int64_t>(ids.size()), d);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t c = 0; c < d; ++c) {
      const bool mine = ids[t] >= 100 && ids[t] < 300;
      ASSERT_EQ(out[t * d + c], mine ? e[(ids[t] - 100) * d + c] : 0.0f) << t << "," << c;
    }
}

LTM_INSTANTIATE_ISA_TESTS(PackedGemmIsa);

}  // namespace
}  // namespace ltm::kernels::cpu
