// skinny_gemm (and the gemm dispatch to it) against OpenBLAS sgemm on random inputs.
#include "kernels/cpu/skinny_gemm.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace ltm::kernels::cpu {
namespace {

struct Case {
  int64_t m, n, k;
  bool t;
};

// Max |C - C_ref| relative to the scale of one output (||a_row|| * ||b_col|| bound: sqrt(k)).
void check(const Case& cs, float beta, bool via_gemm) {
  std::mt19937 rng(static_cast<unsigned>(cs.m * 7919 + cs.n * 31 + cs.k + (cs.t ? 1 : 0)));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(cs.m * cs.k), b(cs.n * cs.k), c0(cs.m * cs.n);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  for (auto& x : c0) x = u(rng);
  std::vector<float> ref = c0, out = c0;
  if (beta == 0.0f) std::fill(out.begin(), out.end(), std::nanf(""));  // must not be read
  cblas_sgemm(CblasRowMajor, CblasNoTrans, cs.t ? CblasTrans : CblasNoTrans, cs.m, cs.n, cs.k,
              1.0f, a.data(), cs.k, b.data(), cs.t ? cs.k : cs.n, beta, ref.data(), cs.n);
  if (via_gemm)
    gemm(a.data(), b.data(), out.data(), cs.m, cs.n, cs.k, cs.t, beta);
  else
    skinny_gemm(a.data(), b.data(), out.data(), cs.m, cs.n, cs.k, cs.t, beta);
  double max_diff = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(out[i] - ref[i])));
  const double scale = std::sqrt(static_cast<double>(std::max<int64_t>(cs.k, 1))) / 3.0 + 1.0;
  std::printf("m=%ld n=%ld k=%ld %s beta=%g %s: max abs diff %.3g (scale %.3g)\n",
              static_cast<long>(cs.m), static_cast<long>(cs.n), static_cast<long>(cs.k),
              cs.t ? "T" : "N", beta, via_gemm ? "gemm" : "skinny", max_diff, scale);
  EXPECT_LT(max_diff, 1e-4 * scale) << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k
                                    << " t=" << cs.t << " beta=" << beta;
}

TEST(SkinnyGemm, Gpt2Shapes) {
  for (int64_t m : {1, 2, 4, 8, 16, 32, 64})
    for (const Case& s : {Case{0, 2304, 768, false}, Case{0, 768, 768, false},
                          Case{0, 3072, 768, false}, Case{0, 768, 3072, false}})
      for (float beta : {0.0f, 1.0f}) check({m, s.n, s.k, s.t}, beta, false);
}

TEST(SkinnyGemm, LmHead) {
  for (int64_t m : {2, 8, 32, 64}) check({m, 50257, 768, true}, 0.0f, false);
  check({5, 50257, 768, true}, 1.0f, false);
}

TEST(SkinnyGemm, OddShapes) {
  for (int64_t m : {1, 2, 3, 5, 7, 11, 13, 63, 65})
    for (int64_t n : {1, 15, 17, 63, 100, 129})
      for (int64_t k : {1, 7, 17, 129, 131, 257})
        for (bool t : {false, true})
          for (float beta : {0.0f, 1.0f}) check({m, n, k, t}, beta, false);
}

TEST(SkinnyGemm, GemmDispatch) {
  for (int64_t m : {1, 2, 4, 6, 32, 64, 65, 100}) {
    check({m, 2304, 768, false}, 0.0f, true);
    check({m, 768, 3072, false}, 1.0f, true);
    check({m, 1000, 768, true}, 0.0f, true);
  }
}

}  // namespace
}  // namespace ltm::kernels::cpu
