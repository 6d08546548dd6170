#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/static_for.h"

namespace ltm::kernels::cpu {

void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
          bool b_transposed, float beta) {
  if (m == 0 || n == 0) return;
  if (m == 1 && !b_transposed) {
    // Decode with one row: y[n] = x[k] @ B[k, n] is B^T x for row-major B.
    cblas_sgemv(CblasRowMajor, CblasTrans, k, n, 1.0f, b, n, a, 1, beta, c, 1);
    return;
  }
  if (m == 1 && b_transposed) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, b, k, a, 1, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, m, n, k,
              1.0f, a, k, b, b_transposed ? k : n, beta, c, n);
}

void gemm_rows_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  const auto kernel = kernel_table().dot_rows;  // outside the parallel region: may throw
  static_for(m, m * n * k >= 65536, [&](int64_t r) { kernel(a + r * k, b, c + r * n, k, n); });
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }
int blas_threads() { return openblas_get_num_threads(); }
#ifdef LTM_CBLAS_SUBSET
const char* blas_name() { return "plain C++ BLAS"; }
#else
const char* blas_name() { return "OpenBLAS"; }
#endif

}  // namespace ltm::kernels::cpu
