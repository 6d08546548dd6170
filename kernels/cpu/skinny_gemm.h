// GEMM for few rows of A (decode batches, m ~ 2..64) that streams B once without packing it:
// C[m, n] = A[m, k] @ B + beta * C, B [k, n] (weights) or (b_transposed) [n, k] (tied LM head).
// Register-blocked AVX-512 kernels parallel (OpenMP, blas_threads() threads) over column blocks
// of C; without AVX-512 it falls back to OpenBLAS sgemm. kernels::cpu::gemm dispatches here for
// the shapes where it was measured faster (see skinny_gemm_preferred).
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu {

void skinny_gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                 bool b_transposed, float beta);

// True where skinny_gemm beats OpenBLAS sgemm (measured, tests/kernels/skinny_gemm_bench.cpp).
bool skinny_gemm_preferred(int64_t m, int64_t n, int64_t k, bool b_transposed);

}  // namespace ltm::kernels::cpu
