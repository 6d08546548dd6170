// GEMM through OpenBLAS: C[m, n] = A[m, k] @ B + beta * C, B [k, n] or (b_transposed) [n, k].
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu {

void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
          bool b_transposed, float beta);

// C[m, n] = A[m, k] @ B^T for B [n, k], row by row on the chosen ISA's dot product (not OpenBLAS):
// a row of C has the same bits whatever m and the thread count. For thin products whose rows
// must not depend on the batch (a LoRA adapter's down projection, n = its rank: the verify rows
// of speculative decoding must compute what one-row decode steps do), where gemm's sgemv for one
// row and sgemm for several sum in different orders.
void gemm_rows_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k);

// Threads OpenBLAS may use (process-wide).
void set_blas_threads(int n);
int blas_threads();
// The BLAS behind gemm: "OpenBLAS", or the GPU-only build's plain loops (common/fallback/).
const char* blas_name();

}  // namespace ltm::kernels::cpu
