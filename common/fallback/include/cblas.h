// The CBLAS calls ltm makes (kernels/cpu/gemm.cpp, attention.cpp), for the GPU-only build
// (-DLTM_GPU_ONLY=ON), which has no OpenBLAS: plain C++ loops (common/fallback/cblas_subset.cpp),
// threaded with OpenMP over rows. There the CPU backend is a reference for the gpu tests and a
// one-rank --device cpu run, not a fast path; every other build links OpenBLAS.
#pragma once

#define LTM_CBLAS_SUBSET 1

#ifdef __cplusplus
extern "C" {
#endif

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
typedef enum CBLAS_ORDER CBLAS_LAYOUT;

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans_a,
                 enum CBLAS_TRANSPOSE trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc);
void cblas_sgemv(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans, int m, int n, float alpha,
                 const float* a, int lda, const float* x, int incx, float beta, float* y,
                 int incy);
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);

#ifdef __cplusplus
}
#endif
