// packed_gemm (weights packed into 64-column panels) against OpenBLAS sgemm on the row-major
// matrix, and the CPU backend's upload_weight + matmul on the same inputs; the GEMM tests run once
// per kernel path the CPU supports (PackedGemmIsa/*/avx512, /avx2, /portable). 16-bit weights
// (bf16, fp16): against a double-precision reference on the rounded weights, and against the
// fp32 weights within the rounding error; streamed (row-range) packing; packed_column.
#include "kernels/cpu/packed_gemm.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/panel_runs.h"
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
    check(300, 100, 64, 1.0f);  // 2 panels for 2 threads: the rows are split too
    check(97, 64, 48, 0.0f);    // one panel, ragged row blocks
  }
  set_blas_threads(saved);
}

TEST_P(PackedGemmIsa, CpuBackendUploadWeightAndMatmul) {
  auto backend = make_cpu_backend(2);
  const int64_t m = 11, n = 200, k = 96;
  const Inputs in = random_inputs(m, n, k);
  {
    DeviceBuffer w = backend->upload_weight(in.w.data(), k, n);
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
  DeviceBuffer table = backend->upload_embedding(e.data(), rows, d);
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

// ---- 16-bit weights ----

constexpr WeightType k16BitTypes[] = {WeightType::kBF16, WeightType::kF16};

// Unit roundoff of the type: relative rounding error <= u (8 and 11 significant bits).
double unit_roundoff(WeightType t) { return t == WeightType::kBF16 ? 0x1p-8 : 0x1p-11; }

// Packs W in one range, runs packed_gemm, and checks:
// 1. against C computed in double on the rounded weights (round_to): the kernel's only error is
//    fp32 accumulation, bounded as in expect_close: 1e-5 (sqrt(k) + 1) for inputs in [-1, 1];
// 2. against C in double on the fp32 weights: the weights' rounding adds sum_p a_p w_p d_p with
//    |d_p| <= u, independent, variance <= u^2 / 3 each, so 5 u sqrt(sum_p (a_p w_p)^2) (8.7
//    standard deviations) plus, for fp16 subnormals (absolute error <= 2^-25), k 2^-25.
void check16(int64_t m, int64_t n, int64_t k, float beta, WeightType t) {
  const Inputs in = random_inputs(m, n, k);
  std::vector<float> wr(in.w.size());
  for (size_t i = 0; i < wr.size(); ++i) wr[i] = round_to(t, in.w[i]);
  std::vector<unsigned char> packed(packed_bytes(k, n, t), 0xFF);  // NaN pattern in any type
  pack_weight_rows(in.w.data(), 0, k, k, n, t, packed.data());
  std::vector<float> out = in.c0;
  if (beta == 0.0f) std::fill(out.begin(), out.end(), std::nanf(""));  // must not be read
  packed_gemm(in.a.data(), packed.data(), t, out.data(), m, n, k, beta);
  const double tol_acc = 1e-5 * (std::sqrt(static_cast<double>(k)) + 1.0);
  const double u = unit_roundoff(t);
  double worst_rounded = 0.0, worst_fp32 = 0.0;  // as fractions of the tolerance
  std::vector<double> ref_r(n), ref_w(n), sq(n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) ref_r[j] = ref_w[j] = beta * static_cast<double>(in.c0[i * n + j]);
    std::fill(sq.begin(), sq.end(), 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double a = in.a[i * k + p];
      const float* wrow = in.w.data() + p * n;
      const float* rrow = wr.data() + p * n;
      for (int64_t j = 0; j < n; ++j) {
        const double aw = a * wrow[j];
        ref_r[j] += a * rrow[j];
        ref_w[j] += aw;
        sq[j] += aw * aw;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const double got = out[i * n + j];
      worst_rounded = std::max(worst_rounded, std::fabs(got - ref_r[j]) / tol_acc);
      const double tol_w = tol_acc + 5.0 * u * std::sqrt(sq[j]) + k * 0x1p-25;
      worst_fp32 = std::max(worst_fp32, std::fabs(got - ref_w[j]) / tol_w);
      if (!(std::fabs(got - ref_r[j]) < tol_acc)) {  // also catches NaN
        ADD_FAILURE() << weight_type_name(t) << " m=" << m << " n=" << n << " k=" << k
                      << " beta=" << beta << " C[" << i << "," << j << "]=" << got
                      << " ref(rounded W)=" << ref_r[j];
        return;
      }
    }
  }
  EXPECT_LT(worst_rounded, 1.0);
  EXPECT_LT(worst_fp32, 1.0) << weight_type_name(t) << " m=" << m << " n=" << n << " k=" << k
                             << ": off the fp32-weight result by more than the rounding error";
}

TEST_P(PackedGemmIsa, SixteenBitGpt2Shapes) {
  for (WeightType t : k16BitTypes)
    for (int64_t m : {1, 2, 5, 6, 7, 8, 9, 13, 32})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {768, 3072}})
        check16(m, n, k, m % 2 ? 1.0f : 0.0f, t);
}

TEST_P(PackedGemmIsa, SixteenBitRaggedShapes) {
  // n not a multiple of 64 (nor 16, nor 8); k around the 64- and 128-row chunks; m over every
  // row count of the register tiles, the two tiles (7..12) and the scratch path (m > 12).
  for (WeightType t : k16BitTypes)
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13})
      for (int64_t n : {1, 17, 63, 65, 130, 200})
        for (int64_t k : {1, 7, 64, 65, 127, 128, 129, 300})
          for (float beta : {0.0f, 0.5f}) check16(m, n, k, beta, t);
}

// On AVX-512 and AVX2, 16-bit weights: a row of A gives the same bits whether it is multiplied
// alone (the decode kernel) or as one of up to 12 rows (a verify step of speculative decoding,
// which must reproduce the decode's greedy tokens): every path up to 12 rows sums the whole k in
// order (AVX2: by the same 64-row chunks, each added into C).
TEST_P(PackedGemmIsa, SixteenBitRowsAgreeUpToTwelve) {
  if (GetParam() == Isa::kPortable) GTEST_SKIP() << "the property is the AVX-512 and AVX2 paths'";
  for (WeightType t : k16BitTypes)
    for (auto [n, k] : {std::pair<int64_t, int64_t>{200, 300}, {768, 256}, {256, 1024}})
      for (float beta : {0.0f, 1.0f}) {
        const Inputs in = random_inputs(12, n, k);
        std::vector<unsigned char> packed(packed_bytes(k, n, t));
        pack_weight_rows(in.w.data(), 0, k, k, n, t, packed.data());
        std::vector<float> alone = in.c0;
        for (int64_t i = 0; i < 12; ++i)
          packed_gemm(in.a.data() + i * k, packed.data(), t, alone.data() + i * n, 1, n, k, beta);
        for (int64_t m = 2; m <= 12; ++m) {
          std::vector<float> out = in.c0;
          packed_gemm(in.a.data(), packed.data(), t, out.data(), m, n, k, beta);
          EXPECT_EQ(0, std::memcmp(out.data(), alone.data(), static_cast<size_t>(m * n) * 4))
              << weight_type_name(t) << " m=" << m << " n=" << n << " k=" << k << " beta=" << beta;
        }
      }
}

// The register-converted rows of a verify step (AVX2, 3..12 rows: 3 x 32, 4..6 x 16 and two row
// groups, bf16 converted by halves of a pair) over ragged panels: odd k (bf16's pad row), n tails
// of every strip width, k across the 64-row (AVX2) and 128-row (AVX-512) chunks. Against the
// reference, and bit for bit against each row alone and inside the scratch path's 13..16 rows, so
// that a change of the summation order in every register path at once, which
// SixteenBitRowsAgreeUpToTwelve cannot see, fails here. (AVX-512 bf16 up to 15 rows: from 16 a
// CPU with AMX or AVX512-BF16 rounds the activations to bf16. Until 2026-12-03 AVX-512's tiles
// summed the whole k and its scratch path by chunks, so rows 13.. differed for k > 128.)
TEST_P(PackedGemmIsa, SixteenBitVerifyRowsRagged) {
  for (WeightType t : k16BitTypes)
    for (int64_t m : {3, 4, 5, 6, 10, 11})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{17, 7}, {63, 65}, {130, 129}, {200, 191}})
        check16(m, n, k, m % 2 ? 0.5f : 0.0f, t);
  if (GetParam() == Isa::kPortable) return;  // the bits: the AVX-512 and AVX2 paths' property
  for (WeightType t : k16BitTypes)
    for (auto [n, k] : {std::pair<int64_t, int64_t>{17, 7}, {40, 63}, {63, 65}, {130, 129},
                        {200, 191}, {65, 257}, {70, 300}})
      for (float beta : {0.0f, 0.5f}) {
        const int64_t kRows = GetParam() == Isa::kAvx512 && t == WeightType::kBF16 ? 15 : 16;
        const Inputs in = random_inputs(16, n, k);
        std::vector<unsigned char> packed(packed_bytes(k, n, t));
        pack_weight_rows(in.w.data(), 0, k, k, n, t, packed.data());
        std::vector<float> alone = in.c0;
        for (int64_t i = 0; i < kRows; ++i)
          packed_gemm(in.a.data() + i * k, packed.data(), t, alone.data() + i * n, 1, n, k, beta);
        for (int64_t m = 2; m <= kRows; ++m) {
          std::vector<float> out = in.c0;
          packed_gemm(in.a.data(), packed.data(), t, out.data(), m, n, k, beta);
          EXPECT_EQ(0, std::memcmp(out.data(), alone.data(), static_cast<size_t>(m * n) * 4))
              << weight_type_name(t) << " m=" << m << " n=" << n << " k=" << k << " beta=" << beta;
        }
      }
}

TEST_P(PackedGemmIsa, SixteenBitLargeM) {
  for (WeightType t : k16BitTypes) {
    check16(64, 200, 300, 1.0f, t);
    check16(100, 130, 257, 0.0f, t);
    check16(512, 576, 384, 0.0f, t);
  }
}

TEST_P(PackedGemmIsa, SixteenBitOneAndTwoThreads) {
  const int saved = blas_threads();
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    for (WeightType t : k16BitTypes) {
      check16(8, 2304, 768, 0.0f, t);
      check16(3, 200, 64, 1.0f, t);
      check16(300, 100, 64, 1.0f, t);  // few panels: rows split across threads too
    }
  }
  set_blas_threads(saved);
}

TEST(PackedGemm, PanelRunsCoverEveryPanelOnceInOrder) {
  // The decode's runs (panel_runs.h): 4 panels a run while more than 4 a thread remain, then 2
  // while more than 1 a thread, then 1; consecutive, every panel once.
  for (int threads : {1, 2, 3, 8})
    for (int64_t panels = 0; panels <= 300; ++panels) {
      const PanelRuns runs = panel_runs(panels, threads);
      int64_t next = 0;
      for (int64_t i = 0; i < runs.count(); ++i) {
        int64_t first;
        int n;
        runs.run(i, &first, &n);
        ASSERT_EQ(first, next) << panels << " panels, " << threads << " threads, run " << i;
        ASSERT_TRUE(n == 4 || n == 2 || n == 1);
        const int64_t left = panels - first;  // panels not yet handed out before this run
        if (n == 4) {
          EXPECT_GT(left, 4 * threads);
        } else {
          EXPECT_LE(left, 4 * threads + 3);
        }
        if (n == 1 && threads > 1) {
          EXPECT_LE(left, threads + 1);
        }
        next += n;
      }
      EXPECT_EQ(next, panels) << panels << " panels, " << threads << " threads";
    }
  EXPECT_EQ(panel_runs(12, 2).quads, 1);  // GPT-2-124M's proj: 4, 2, 2, 2, 1, 1
  EXPECT_EQ(panel_runs(12, 2).pairs, 3);
  EXPECT_EQ(panel_runs(12, 2).singles, 2);
}

TEST_P(PackedGemmIsa, OneRowOverEveryPanelCount) {
  // Decode (m = 1; AVX2: m <= 2): on the AVX-512 and AVX2 paths runs of 4, 2 and 1 panels
  // (panel_runs, gemv_panels), so runs of 1..4 panels, ragged last panels and beta all occur.
  const int saved = blas_threads();
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    for (int64_t m : {1, 2})
      for (int64_t n : {1, 63, 64, 65, 130, 257, 520, 1000})
        for (float beta : {0.0f, 1.0f}) {
          check(m, n, 97, beta);
          for (WeightType t : k16BitTypes) check16(m, n, 97, beta, t);
        }
  }
  set_blas_threads(saved);
}

// fp32: a decode row (gemv_panels, runs of 4, 2 or 1 panels; AVX2: their
// accumulators kept in L1 between turns, also 2 rows) gives the bits of the same row in a step of
// up to 16 rows (the row groups' tiles): both sum each chunk of rows (AVX2 64, AVX-512 128) from
// zero in row order and add it into C. Needed by speculative decoding's greedy identity. Shares of 1..9 panels, ragged last panels, k across chunks, 1 and 2 threads.
TEST_P(PackedGemmIsa, F32DecodeRowIsABatchRow) {
  if (GetParam() == Isa::kPortable) GTEST_SKIP() << "the AVX2 and AVX-512 paths' property";
  const int saved = blas_threads();
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    for (auto [n, k] : {std::pair<int64_t, int64_t>{63, 65}, {130, 129}, {520, 191}, {1000, 300},
                        {576, 64}, {256, 768}})
      for (float beta : {0.0f, 0.5f}) {
        const Inputs in = random_inputs(16, n, k);
        std::vector<float> packed(packed_floats(k, n));
        pack_weight(in.w.data(), k, n, packed.data());
        std::vector<float> alone = in.c0;
        for (int64_t i = 0; i < 16; ++i)
          packed_gemm(in.a.data() + i * k, packed.data(), alone.data() + i * n, 1, n, k, beta);
        for (int64_t m : {2, 3, 6, 7, 12, 16}) {
          std::vector<float> out = in.c0;
          packed_gemm(in.a.data(), packed.data(), out.data(), m, n, k, beta);
          EXPECT_EQ(0, std::memcmp(out.data(), alone.data(), static_cast<size_t>(m * n) * 4))
              << "threads=" << threads << " m=" << m << " n=" << n << " k=" << k
              << " beta=" << beta;
        }
      }
  }
  set_blas_threads(saved);
}

// Every weight type on every vector path: each row alone has the bits of the same row in steps of
// 2..40 rows (decode walks, register tiles, the chunked paths, rows split across threads), which
// greedy speculative decoding relies on (a verified token must be the one plain decoding picks).
// bf16 with AMX / AVX512-BF16 off: from 16 rows those round the activations to bf16 by design
// (set_amx; cpu_isa.h).
TEST_P(PackedGemmIsa, ARowHasTheSameBitsAtEveryRowCount) {
  if (GetParam() == Isa::kPortable) GTEST_SKIP() << "the AVX2 and AVX-512 paths' property";
  const int saved = blas_threads();
  const bool amx = amx_enabled();
  set_amx(false);
  constexpr int64_t kRows = 40;
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kF16})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{130, 257}, {64, 768}, {300, 96}, {20, 1000}})
        for (float beta : {0.0f, 0.5f}) {
          const Inputs in = random_inputs(kRows, n, k);
          std::vector<unsigned char> packed(packed_bytes(k, n, t));
          pack_weight_rows(in.w.data(), 0, k, k, n, t, packed.data());
          std::vector<float> alone = in.c0;
          for (int64_t i = 0; i < kRows; ++i)
            packed_gemm(in.a.data() + i * k, packed.data(), t, alone.data() + i * n, 1, n, k, beta);
          for (int64_t m : {2, 5, 7, 12, 13, 16, 17, 24, 31, 40}) {
            std::vector<float> out = in.c0;
            packed_gemm(in.a.data(), packed.data(), t, out.data(), m, n, k, beta);
            EXPECT_EQ(0, std::memcmp(out.data(), alone.data(), static_cast<size_t>(m * n) * 4))
                << weight_type_name(t) << " threads=" << threads << " m=" << m << " n=" << n
                << " k=" << k << " beta=" << beta;
          }
        }
  }
  set_amx(amx);
  set_blas_threads(saved);
}

// k = 0 (an empty reduction): C = beta * C on every path, weight type and row count, C written
// even where no row of B is read (NaN before, so beta = 0 must give 0, not keep it).
TEST_P(PackedGemmIsa, AnEmptyReductionWritesBetaTimesC) {
  for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kF16})
    for (int64_t m : {1, 2, 7, 13})
      for (int64_t n : {1, 65, 300})
        for (float beta : {0.0f, 0.5f}) {
          std::vector<float> a(1), c0(static_cast<size_t>(m * n));
          for (size_t i = 0; i < c0.size(); ++i) c0[i] = static_cast<float>(i % 7) - 3.0f;
          std::vector<unsigned char> packed(std::max<size_t>(1, packed_bytes(0, n, t)));
          std::vector<float> out = c0;
          if (beta == 0.0f) std::fill(out.begin(), out.end(), std::nanf(""));
          packed_gemm(a.data(), packed.data(), t, out.data(), m, n, 0, beta);
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_EQ(out[i], beta * c0[i]) << weight_type_name(t) << " m=" << m << " n=" << n
                                            << " beta=" << beta << " at " << i;
        }
}

TEST_P(PackedGemmIsa, F32TypeMatchesFloatApi) {
  // WeightType::kF32 through the generic functions: the same bytes and results as the float* API.
  const int64_t m = 5, n = 130, k = 129;
  const Inputs in = random_inputs(m, n, k);
  std::vector<float> p1(packed_floats(k, n), std::nanf("")), p2(packed_floats(k, n), 1.0f);
  pack_weight(in.w.data(), k, n, p1.data());
  ASSERT_EQ(packed_bytes(k, n, WeightType::kF32), p1.size() * sizeof(float));
  pack_weight_rows(in.w.data(), 0, 50, k, n, WeightType::kF32, p2.data());
  pack_weight_rows(in.w.data() + 50 * n, 50, k, k, n, WeightType::kF32, p2.data());
  ASSERT_EQ(std::memcmp(p1.data(), p2.data(), p1.size() * sizeof(float)), 0);
  std::vector<float> o1(m * n), o2(m * n);
  packed_gemm(in.a.data(), p1.data(), o1.data(), m, n, k, 0.0f);
  packed_gemm(in.a.data(), static_cast<const void*>(p2.data()), WeightType::kF32, o2.data(), m, n,
              k, 0.0f);
  ASSERT_EQ(o1, o2);
}

// Splits [0, rows) at `cuts` and packs each range, in reverse order, from a copy holding just
// that range's rows.
template <typename PackFn>
std::vector<unsigned char> pack_in_ranges(const std::vector<float>& src, int64_t rows,
                                          int64_t row_len, std::vector<int64_t> cuts,
                                          size_t bytes, PackFn pack) {
  std::vector<unsigned char> out(bytes, 0xCD);
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(rows);
  for (size_t r = cuts.size() - 1; r-- > 0;) {
    const int64_t b = cuts[r], e = cuts[r + 1];
    std::vector<float> part(src.begin() + b * row_len, src.begin() + e * row_len);
    pack(part.data(), b, e, out.data());
  }
  return out;
}

TEST_P(PackedGemmIsa, StreamedPackingIsByteIdentical) {
  for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kF16})
  for (int64_t k : {300, 301}) {  // 301: bf16's last pair has a pad row
    const int64_t n = 130;
    const Inputs in = random_inputs(1, n, k);
    const size_t bytes = packed_bytes(k, n, t);
    auto pack = [&](const float* rows, int64_t b, int64_t e, void* dst) {
      pack_weight_rows(rows, b, e, k, n, t, dst);
    };
    const auto whole = pack_in_ranges(in.w, k, n, {}, bytes, pack);
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{1}, {127, 128, 129}, {7, 64, 200, 299}, {150}}) {
      const auto parts = pack_in_ranges(in.w, k, n, cuts, bytes, pack);
      ASSERT_EQ(std::memcmp(whole.data(), parts.data(), bytes), 0) << weight_type_name(t);
    }
    // The layout itself: element (p, j) at panel j / 64, row p, lane j % 64 (bf16: pair row
    // p / 2, lane 2 (j % 64) + p % 2); pad lanes zero.
    const size_t es = weight_type_size(t);
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < 2 * kPanelWidth + 64; ++j) {
        if (j >= 3 * kPanelWidth) break;
        const int64_t rows = t == WeightType::kBF16 ? (k + 1) / 2 * 2 : k;
        const int64_t lane = t == WeightType::kBF16
                                 ? (p / 2) * 2 * kPanelWidth + 2 * (j % kPanelWidth) + p % 2
                                 : p * kPanelWidth + j % kPanelWidth;
        const size_t at = static_cast<size_t>(j / kPanelWidth * rows * kPanelWidth + lane) * es;
        ASSERT_EQ(at, packed_index(k, p, j, t) * es) << weight_type_name(t) << " " << p << "," << j;
        if (j >= n) {
          for (size_t b = 0; b < es; ++b) ASSERT_EQ(whole[at + b], 0) << "pad " << p << "," << j;
          continue;
        }
        const float w = in.w[p * n + j];
        if (t == WeightType::kF32) {
          float got;
          std::memcpy(&got, whole.data() + at, 4);
          ASSERT_EQ(got, w);
        } else {
          uint16_t got;
          std::memcpy(&got, whole.data() + at, 2);
          ASSERT_EQ(got, t == WeightType::kBF16 ? f32_to_bf16(w) : f32_to_f16(w)) << p << "," << j;
        }
      }
    if (panel_rows(k, t) > k) {  // the pad row reads as zero in every panel
      for (int64_t j = 0; j < 3 * kPanelWidth; ++j)
        for (size_t b = 0; b < es; ++b)
          ASSERT_EQ(whole[packed_index(k, k, j, t) * es + b], 0) << "pad row, column " << j;
    }
  }
}

TEST_P(PackedGemmIsa, StreamedTransposedPackingAndColumns) {
  // E [n, k] in row ranges of E: the same bytes as one range, and as pack_weight_transposed for
  // fp32; packed_column gives back E's rows (rounded); pad columns zero without a zeroed buffer.
  for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kF16})
  for (int64_t k : {300, 301}) {  // 301: bf16's last pair has a pad row
    const int64_t n = 130;
    const Inputs in = random_inputs(1, k, n);  // w: [n, k] read as E
    const std::vector<float>& e = in.w;
    const size_t bytes = packed_bytes(k, n, t);
    auto pack = [&](const float* rows, int64_t b, int64_t r_end, void* dst) {
      pack_weight_transposed_rows(rows, b, r_end, n, k, t, dst);
    };
    const auto whole = pack_in_ranges(e, n, k, {}, bytes, pack);
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{1}, {63, 64, 65}, {10, 100, 128, 129}}) {
      const auto parts = pack_in_ranges(e, n, k, cuts, bytes, pack);
      ASSERT_EQ(std::memcmp(whole.data(), parts.data(), bytes), 0) << weight_type_name(t);
    }
    if (t == WeightType::kF32) {
      std::vector<float> ref(packed_floats(k, n));
      pack_weight_transposed(e.data(), n, k, ref.data());
      ASSERT_EQ(std::memcmp(whole.data(), ref.data(), bytes), 0);
    }
    std::vector<float> col(k);
    for (int64_t c = 0; c < n; ++c) {
      packed_column(whole.data(), t, k, c, col.data());
      for (int64_t p = 0; p < k; ++p)
        ASSERT_EQ(col[p], round_to(t, e[c * k + p])) << weight_type_name(t) << " row " << c;
    }
    const size_t es = weight_type_size(t);
    for (int64_t p = 0; p < k; ++p)  // padding of the last panel (130 = 2 * 64 + 2)
      for (int64_t c = n; c < 3 * kPanelWidth; ++c)
        for (size_t b = 0; b < es; ++b)
          ASSERT_EQ(whole[packed_index(k, p, c, t) * es + b], 0) << p << "," << c;
    if (panel_rows(k, t) > k) {
      for (int64_t c = 0; c < 3 * kPanelWidth; ++c)
        for (size_t b = 0; b < es; ++b)
          ASSERT_EQ(whole[packed_index(k, k, c, t) * es + b], 0) << "pad row, column " << c;
    }
    // And the GEMM on it is the LM head: logits = A E^T.
    const int64_t m = 3;
    const Inputs a = random_inputs(m, 1, k);
    std::vector<float> logits(m * n);
    packed_gemm(a.a.data(), whole.data(), t, logits.data(), m, n, k, 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < n; ++c) {
        double ref = 0.0;
        for (int64_t p = 0; p < k; ++p)
          ref += static_cast<double>(a.a[i * k + p]) * round_to(t, e[c * k + p]);
        ASSERT_NEAR(logits[i * n + c], ref, 1e-5 * (std::sqrt(static_cast<double>(k)) + 1.0));
      }
  }
}

TEST(PackedGemm, PackedColumn16Bit) {
  const int64_t k = 70, n = 200;
  const Inputs in = random_inputs(1, n, k);
  for (WeightType t : k16BitTypes) {
    std::vector<unsigned char> packed(packed_bytes(k, n, t));
    ASSERT_EQ(packed.size(), packed_floats(k, n) * 2);
    pack_weight_rows(in.w.data(), 0, k, k, n, t, packed.data());
    std::vector<float> col(k);
    for (int64_t j = 0; j < n; ++j) {
      packed_column(packed.data(), t, k, j, col.data());
      for (int64_t p = 0; p < k; ++p) ASSERT_EQ(col[p], round_to(t, in.w[p * n + j])) << p << "," << j;
    }
  }
}

LTM_INSTANTIATE_ISA_TESTS(PackedGemmIsa);

}  // namespace
}  // namespace ltm::kernels::cpu
