// LTM_CUBLAS_CHECK: a cuBLAS call that must succeed, as kernels/cuda/cuda_check.h's
// LTM_CUDA_CHECK for the runtime: on failure it prints "ltm: <host>: cuBLAS error <name> at
// file:line: <message> (<the call>)" and aborts. The CUDA backend's (cuda_backend.cpp).
#pragma once

#include <cublas_v2.h>

#include "kernels/cuda/cuda_check.h"

#define LTM_CUBLAS_CHECK(expr)                                                       \
  do {                                                                               \
    const cublasStatus_t _ltm_cublas_status = (expr);                                \
    if (_ltm_cublas_status != CUBLAS_STATUS_SUCCESS) [[unlikely]]                    \
      ::ltm::kernels::cuda::library_fail("cuBLAS", cublasGetStatusName(_ltm_cublas_status), \
                                         cublasGetStatusString(_ltm_cublas_status), #expr, \
                                         __FILE__, __LINE__);                        \
  } while (0)
