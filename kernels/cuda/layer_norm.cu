// One block per row (rows beyond the grid loop with stride gridDim.x). Two passes for the
// statistics (mean, then the sum of squared deviations: no cancellation), a third to normalise;
// the second and third read the row from L1/L2. x and y may alias: every thread finishes reading
// for the statistics (block_sum synchronises) before any thread writes, and each element is
// written by the thread that reads it in the last pass.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/layer_norm.h"

namespace ltm::kernels::cuda {
namespace {

constexpr int kMaxThreads = 512;

__device__ __forceinline__ float sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
__device__ __forceinline__ float sum4(float v) { return v; }
__device__ __forceinline__ float sq_dev4(float4 v, float m) {
  const float a = v.x - m, b = v.y - m, c = v.z - m, d = v.w - m;
  return (a * a + b * b) + (c * c + d * d);
}
__device__ __forceinline__ float sq_dev4(float v, float m) { return (v - m) * (v - m); }
__device__ __forceinline__ float4 normalise(float4 v, float4 g, float4 b, float m, float rstd) {
  return make_float4((v.x - m) * rstd * g.x + b.x, (v.y - m) * rstd * g.y + b.y,
                     (v.z - m) * rstd * g.z + b.z, (v.w - m) * rstd * g.w + b.w);
}
__device__ __forceinline__ float normalise(float v, float g, float b, float m, float rstd) {
  return (v - m) * rstd * g + b;
}

// Stores a T (float or float4) of y's row at T-index i, rounded to y's element type Y.
template <typename Y>
__device__ __forceinline__ void store_out(Y* row, int64_t i, float4 v) { store4_f(row + 4 * i, v); }
template <typename Y>
__device__ __forceinline__ void store_out(Y* row, int64_t i, float v) {
  row[i] = from_float<Y>(v);
}

// T is float or float4; `n` counts T elements per row, `cols` floats. y holds elements of Y
// (float: T itself; bf16 or fp16: 16-bit activations, rounded once).
template <typename T, typename Y>
__global__ void layer_norm_kernel(const T* x, const T* __restrict__ gamma,
                                  const T* __restrict__ beta, Y* y, int64_t rows, int64_t n,
                                  int64_t cols, float eps) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* in = x + r * n;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += sum4(in[i]);
    const float mean = block_sum(s, scratch) / static_cast<float>(cols);
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sq += sq_dev4(in[i], mean);
    const float var = block_sum(sq, scratch) / static_cast<float>(cols);
    const float rstd = 1.0f / sqrtf(var + eps);
    Y* out = y + r * cols;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      store_out(out, i, normalise(in[i], gamma[i], beta[i], mean, rstd));
  }
}

// As layer_norm_kernel, after x += residual + bias (each element read and rewritten by one
// thread, which reads it back in the later passes).
template <typename T, typename Y>
__global__ void add_bias_residual_layer_norm_kernel(T* x, const T* __restrict__ residual,
                                                    const T* __restrict__ bias,
                                                    const T* __restrict__ gamma,
                                                    const T* __restrict__ beta,
                                                    Y* __restrict__ y, int64_t rows, int64_t n,
                                                    int64_t cols, float eps) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* in = x + r * n;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const T v = residual ? in[i] + (residual[r * n + i] + bias[i]) : in[i] + bias[i];
      in[i] = v;
      s += sum4(v);
    }
    const float mean = block_sum(s, scratch) / static_cast<float>(cols);
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sq += sq_dev4(in[i], mean);
    const float var = block_sum(sq, scratch) / static_cast<float>(cols);
    const float rstd = 1.0f / sqrtf(var + eps);
    Y* out = y + r * cols;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      store_out(out, i, normalise(in[i], gamma[i], beta[i], mean, rstd));
  }
}

// y's alignment for the vector path: 16 bytes for float, 8 for 16-bit elements (4 of them).
bool out_aligned(const void* y, ElemType t) {
  return reinterpret_cast<uintptr_t>(y) % (t == ElemType::kF32 ? 16 : 8) == 0;
}

template <typename Y>
void launch_fused(float* x, const float* residual, const float* bias, const float* gamma,
                  const float* beta, void* y_v, ElemType y_type, int64_t rows, int64_t cols,
                  float eps, cudaStream_t stream) {
  Y* y = static_cast<Y*>(y_v);
  const bool vec = cols % 4 == 0 && aligned16(x) && out_aligned(y, y_type) && aligned16(gamma) &&
                   aligned16(beta) && aligned16(bias) && aligned16(residual);
  const int64_t n = vec ? cols / 4 : cols;
  const int threads = threads_for_row(n, kMaxThreads);
  const unsigned blocks = static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20));
  if (vec) {
    add_bias_residual_layer_norm_kernel<<<blocks, threads, 0, stream>>>(
        reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(residual),
        reinterpret_cast<const float4*>(bias), reinterpret_cast<const float4*>(gamma),
        reinterpret_cast<const float4*>(beta), y, rows, n, cols, eps);
  } else {
    add_bias_residual_layer_norm_kernel<<<blocks, threads, 0, stream>>>(
        x, residual, bias, gamma, beta, y, rows, n, cols, eps);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

template <typename Y>
void launch_layer_norm(const float* x, const float* gamma, const float* beta, void* y_v,
                       ElemType y_type, int64_t rows, int64_t cols, float eps,
                       cudaStream_t stream) {
  Y* y = static_cast<Y*>(y_v);
  const bool vec = cols % 4 == 0 && aligned16(x) && out_aligned(y, y_type) && aligned16(gamma) &&
                   aligned16(beta);
  const int64_t n = vec ? cols / 4 : cols;
  const int threads = threads_for_row(n, kMaxThreads);
  const unsigned blocks = static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20));
  if (vec) {
    layer_norm_kernel<<<blocks, threads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<const float4*>(gamma),
        reinterpret_cast<const float4*>(beta), y, rows, n, cols, eps);
  } else {
    layer_norm_kernel<<<blocks, threads, 0, stream>>>(x, gamma, beta, y, rows, n, cols, eps);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_bias_residual_layer_norm(float* x, const float* residual, const float* bias,
                                  const float* gamma, const float* beta, void* y, ElemType y_type,
                                  int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  switch (y_type) {
    case ElemType::kF32:
      return launch_fused<float>(x, residual, bias, gamma, beta, y, y_type, rows, cols, eps,
                                 stream);
    case ElemType::kBF16:
      return launch_fused<__nv_bfloat16>(x, residual, bias, gamma, beta, y, y_type, rows, cols,
                                         eps, stream);
    case ElemType::kF16:
      return launch_fused<__half>(x, residual, bias, gamma, beta, y, y_type, rows, cols, eps,
                                  stream);
  }
}

void layer_norm(const float* x, const float* gamma, const float* beta, void* y, ElemType y_type,
                int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  switch (y_type) {
    case ElemType::kF32:
      return launch_layer_norm<float>(x, gamma, beta, y, y_type, rows, cols, eps, stream);
    case ElemType::kBF16:
      return launch_layer_norm<__nv_bfloat16>(x, gamma, beta, y, y_type, rows, cols, eps, stream);
    case ElemType::kF16:
      return launch_layer_norm<__half>(x, gamma, beta, y, y_type, rows, cols, eps, stream);
  }
}

}  // namespace ltm::kernels::cuda
