// GEMM through OpenBLAS: C[m, n] = A[m, k] @ B + beta * C, B [k, n] or (b_transposed) [n, k].
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu {

void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
          bool b_transposed, float beta);

// Threads OpenBLAS may use (process-wide).
void set_blas_threads(int n);
int blas_threads();
// The BLAS behind gemm: "OpenBLAS", or the GPU-only build's plain loops (common/fallback/).
const char* blas_name();

}  // namespace ltm::kernels::cpu
