// OpenBLAS's kernels following ltm's forced path (kernels/cpu/blas_core.h): the switch takes,
// the products stay right on each core, and OpenBLAS's own choice comes back.
#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <gtest/gtest.h>
#include <strings.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace ltm::kernels::cpu {
namespace {

// C = A B for A [m, k], B [k, n] through OpenBLAS, against a double-precision loop.
double sgemm_error(int m, int n, int k) {
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (int i = 0; i < m * k; ++i) a[i] = std::sin(0.37 * i);
  for (int i = 0; i < k * n; ++i) b[i] = std::cos(0.11 * i);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
              0.0f, c.data(), n);
  double worst = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double want = 0;
      for (int p = 0; p < k; ++p) want += double(a[i * k + p]) * b[p * n + j];
      worst = std::max(worst, std::abs(want - c[i * n + j]));
    }
  return worst;
}

bool same(const std::string& a, const char* b) { return strcasecmp(a.c_str(), b) == 0; }

TEST(BlasCore, CoreForEachPath) {
  EXPECT_STREQ(blas_core_for(Isa::kAvx2), "Haswell");
  EXPECT_STREQ(blas_core_for(Isa::kPortable), "Prescott");
  EXPECT_EQ(blas_core_for(Isa::kAvx512), nullptr);
}

TEST(BlasCore, SwitchesAndComesBack) {
  const std::string own = blas_core();
  if (own.empty()) GTEST_SKIP() << "the BLAS is not OpenBLAS with run-time dispatch";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is set";
  std::vector<Isa> paths = {Isa::kPortable};
  if (isa_supported(Isa::kAvx2)) paths.insert(paths.begin(), Isa::kAvx2);
  for (Isa isa : paths) {
    const char* want = blas_core_for(isa);
    EXPECT_TRUE(same(select_blas_core(want), want)) << isa_name(isa);
    EXPECT_TRUE(same(blas_core(), want)) << isa_name(isa);
    EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr) << "the variable is put back";
    EXPECT_LT(sgemm_error(37, 45, 130), 1e-3) << want;
  }
  EXPECT_EQ(select_blas_core(nullptr), own);
  EXPECT_EQ(blas_core(), own);
  EXPECT_LT(sgemm_error(37, 45, 130), 1e-3) << own;
}

TEST(BlasCore, UnknownCoreKeepsTheOldOne) {
  const std::string own = blas_core();
  if (own.empty()) GTEST_SKIP() << "the BLAS is not OpenBLAS with run-time dispatch";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is set";
  EXPECT_EQ(select_blas_core("NoSuchCore"), own);
  EXPECT_EQ(blas_core(), own);
}

}  // namespace
}  // namespace ltm::kernels::cpu
