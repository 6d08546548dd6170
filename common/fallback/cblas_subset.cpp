// Plain C++ sgemm and sgemv for the GPU-only build (common/fallback/include/cblas.h). Row-major
// is computed directly; column-major as the row-major product of the transposes. Each output
// element is one sum over k in order, in float, as a straightforward reference.
#include <cblas.h>  // common/fallback/include/cblas.h

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace {

std::atomic<int> g_threads{0};  // 0: OpenMP's default

int threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, all row-major.
void gemm_row_major(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float beta, float* c, int ldc) {
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int i = 0; i < m; ++i) {
    std::vector<float> row(static_cast<size_t>(n), 0.0f);
    for (int p = 0; p < k; ++p) {
      const float av = ta ? a[static_cast<int64_t>(p) * lda + i] : a[static_cast<int64_t>(i) * lda + p];
      if (!tb) {
        const float* brow = b + static_cast<int64_t>(p) * ldb;
        for (int j = 0; j < n; ++j) row[j] += av * brow[j];
      } else {
        for (int j = 0; j < n; ++j) row[j] += av * b[static_cast<int64_t>(j) * ldb + p];
      }
    }
    float* crow = c + static_cast<int64_t>(i) * ldc;
    for (int j = 0; j < n; ++j)
      crow[j] = alpha * row[j] + (beta == 0.0f ? 0.0f : beta * crow[j]);
  }
}

}  // namespace

extern "C" {

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans_a,
                 enum CBLAS_TRANSPOSE trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const bool ta = trans_a != CblasNoTrans, tb = trans_b != CblasNoTrans;
  if (order == CblasRowMajor)
    gemm_row_major(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else  // C^T[n, m] = op(B)^T op(A)^T, row-major views of the column-major operands
    gemm_row_major(tb, ta, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

void cblas_sgemv(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans, int m, int n, float alpha,
                 const float* a, int lda, const float* x, int incx, float beta, float* y,
                 int incy) {
  // Row-major A[m, n]: y[m] = A x, or y[n] = A^T x; column-major swaps the two.
  const bool t = (trans != CblasNoTrans) == (order == CblasRowMajor);
  const int rows = order == CblasRowMajor ? m : n, cols = order == CblasRowMajor ? n : m;
  // In row-major terms: A is [rows, cols]; `t` asks for A^T x.
  const int out = t ? cols : rows, in = t ? rows : cols;
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int i = 0; i < out; ++i) {
    float s = 0.0f;
    for (int p = 0; p < in; ++p) {
      const float av = t ? a[static_cast<int64_t>(p) * lda + i] : a[static_cast<int64_t>(i) * lda + p];
      s += av * x[static_cast<int64_t>(p) * incx];
    }
    float& yi = y[static_cast<int64_t>(i) * incy];
    yi = alpha * s + (beta == 0.0f ? 0.0f : beta * yi);
  }
}

void openblas_set_num_threads(int n) { g_threads.store(std::max(0, n), std::memory_order_relaxed); }
int openblas_get_num_threads(void) { return threads(); }

}  // extern "C"
