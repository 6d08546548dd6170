// ltm-gpu-limits: the GPU's limits that scripts/gpu_check sets the benchmark beside, measured in
// the same run: device-to-device copy bandwidth (bytes read + written per second; decode reads
// every weight once a step) and the cuBLAS bf16 GEMM rate with fp32 accumulation (tensor cores)
// at the GPT-3 6.7B prefill shapes and a square one. Rounds alternate copy and GEMM; the best
// round of each is reported, as one JSON line:
//   {"copy_gb_s": ..., "gemm_bf16_tflop_s": ..., "gemm_shapes": [...], "device": "..."}
//   ltm-gpu-limits [--rounds 3] [--device 0]
// Exit 77: no CUDA device (nothing measured).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

#define CHECK_CUDA(x)                                                                \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "ltm-gpu-limits: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
#define CHECK_CUBLAS(x)                                                      \
  do {                                                                       \
    cublasStatus_t s_ = (x);                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                       \
      std::fprintf(stderr, "ltm-gpu-limits: %s: status %d\n", #x, int(s_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

// Seconds per call of `f` on the device, timed by events over `reps` calls after one warm-up.
template <typename F>
double time_device(int reps, F f) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  f();
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f();
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return ms / 1e3 / reps;
}

struct Shape {
  int m, n, k;  // C[m, n] = A[m, k] B[k, n]
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3, device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--device")) device = std::atoi(argv[i + 1]);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= device) {
    std::fprintf(stderr, "ltm-gpu-limits: no CUDA device %d\n", device);
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));

  // Copy: 1 GiB each way, well beyond any cache.
  const size_t copy_bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 0x3c, copy_bytes));

  // GEMM: prefill of 2048 tokens through d 4096 (QKV, attention out, MLP up, MLP down) and a
  // square 8192. Inputs are bf16 0x3c3c (about 0.0115) everywhere, not zeros.
  const Shape shapes[] = {{2048, 3 * 4096, 4096}, {2048, 4096, 4096}, {2048, 16384, 4096},
                          {2048, 4096, 16384}, {8192, 8192, 8192}};
  size_t max_a = 0, max_b = 0, max_c = 0;
  for (const Shape& s : shapes) {
    max_a = std::max(max_a, size_t(s.m) * s.k);
    max_b = std::max(max_b, size_t(s.k) * s.n);
    max_c = std::max(max_c, size_t(s.m) * s.n);
  }
  void *a = nullptr, *b = nullptr, *c = nullptr;
  CHECK_CUDA(cudaMalloc(&a, max_a * 2));
  CHECK_CUDA(cudaMalloc(&b, max_b * 2));
  CHECK_CUDA(cudaMalloc(&c, max_c * 2));
  CHECK_CUDA(cudaMemset(a, 0x3c, max_a * 2));
  CHECK_CUDA(cudaMemset(b, 0x3c, max_b * 2));
  cublasHandle_t h;
  CHECK_CUBLAS(cublasCreate(&h));

  double best_copy = 0, best_gemm = 0;
  double best_shape[sizeof(shapes) / sizeof(shapes[0])] = {};
  for (int r = 0; r < rounds; ++r) {
    const double t = time_device(10, [&] {
      CHECK_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice));
    });
    best_copy = std::max(best_copy, 2.0 * copy_bytes / t);
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); ++i) {
      const Shape s = shapes[i];
      const float alpha = 1, beta = 0;
      // Column-major cuBLAS: C^T[n, m] = B^T[n, k] A^T[k, m] on row-major buffers.
      const double tg = time_device(10, [&] {
        CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, b,
                                  CUDA_R_16BF, s.n, a, CUDA_R_16BF, s.k, &beta, c, CUDA_R_16BF,
                                  s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      const double rate = 2.0 * s.m * s.n * s.k / tg;
      best_shape[i] = std::max(best_shape[i], rate);
      best_gemm = std::max(best_gemm, rate);
    }
  }
  std::string per_shape;
  for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); ++i) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), "%s{\"m\": %d, \"n\": %d, \"k\": %d, \"tflop_s\": %.2f}",
                  i ? ", " : "", shapes[i].m, shapes[i].n, shapes[i].k, best_shape[i] / 1e12);
    per_shape += buf;
  }
  std::printf("{\"device\": \"%s\", \"copy_gb_s\": %.1f, \"gemm_bf16_tflop_s\": %.2f, "
              "\"rounds\": %d, \"gemm_shapes\": [%s]}\n",
              prop.name, best_copy / 1e9, best_gemm / 1e12, rounds, per_shape.c_str());
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(src);
  cudaFree(dst);
  return 0;
}
