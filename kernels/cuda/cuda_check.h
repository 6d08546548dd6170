// CUDA error checking for kernels/cuda and the CUDA backend (docs/architecture.md, second error tier).
//
// LTM_CUDA_CHECK(expr) evaluates a cudaError_t expression; on failure it prints
//   ltm: <host>: CUDA error <name> at <file>:<line>: <message> (<expr>)
// and aborts the process (under MPI the launcher then takes the group down).
// LTM_CUDA_CHECK_LAUNCH() checks the launch of the kernel just enqueued (cudaGetLastError).
// Header-only, host code only; usable from .cu and .cpp files alike (no absl, no spdlog).
#pragma once

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace ltm::kernels::cuda {

// "ltm: <host>: <library> error <name> at <file>:<line>: <message> (<expr>)", then abort: the
// failure of a CUDA call here, of a cuBLAS one in the backend (runtime/backend/cublas_check.h).
[[noreturn]] inline void library_fail(const char* library, const char* name, const char* message,
                                      const char* expr, const char* file, int line) {
  char host[256] = "unknown-host";
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "ltm: %s: %s error %s at %s:%d: %s (%s)\n", host, library, name, file,
               line, message, expr);
  std::fflush(stderr);
  std::abort();
}

[[noreturn]] inline void cuda_fail(cudaError_t error, const char* expr, const char* file,
                                   int line) {
  library_fail("CUDA", cudaGetErrorName(error), cudaGetErrorString(error), expr, file, line);
}

// The host-side invariant check of the kernel launchers (LTM_ASSERT without absl, so nvcc never
// parses absl headers): prints `ltm: internal error at file:line: check `cond` failed: <message>`.
[[noreturn]] inline void kernel_assert_fail(const char* file, int line, const char* cond,
                                            const char* format, ...) {
  std::fprintf(stderr, "ltm: internal error at %s:%d: check `%s` failed: ", file, line, cond);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

// Launches a do-nothing kernel on the current device: cudaSuccess when this build has code for
// it, cudaErrorNoKernelImageForDevice (or the driver's error) otherwise. Lets the backend refuse a
// device with a clear message instead of aborting at the first op.
cudaError_t probe_kernel_image();

}  // namespace ltm::kernels::cuda

#define LTM_CUDA_CHECK(expr)                                                   \
  do {                                                                         \
    const cudaError_t _ltm_cuda_err = (expr);                                  \
    if (__builtin_expect(_ltm_cuda_err != cudaSuccess, 0))                         \
      ::ltm::kernels::cuda::cuda_fail(_ltm_cuda_err, #expr, __FILE__, __LINE__); \
  } while (0)

#define LTM_CUDA_CHECK_LAUNCH() LTM_CUDA_CHECK(cudaGetLastError())

// LTM_KERNEL_ASSERT(cond, "printf format", args...)
#define LTM_KERNEL_ASSERT(cond, ...)                                                       \
  do {                                                                                     \
    if (__builtin_expect(!(cond), 0))                                                      \
      ::ltm::kernels::cuda::kernel_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);    \
  } while (0)
