#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/gelu.h"

namespace ltm::kernels::cuda {
namespace {

constexpr int kThreads = 256;

using ::ltm::kernels::cuda::gelu_tanh;  // the float one (device_utils.h), beside float4's below

__device__ __forceinline__ float4 gelu_tanh(float4 v) {
  return make_float4(gelu_tanh(v.x), gelu_tanh(v.y), gelu_tanh(v.z), gelu_tanh(v.w));
}
__device__ __forceinline__ float zero_like(float) { return 0.0f; }
__device__ __forceinline__ float4 zero_like(float4) { return make_float4(0.f, 0.f, 0.f, 0.f); }

// Rows walk grid.y, columns grid.x * blockDim.x; `cols` counts T elements.
template <typename T>
__global__ void bias_gelu_kernel(T* __restrict__ x, const T* __restrict__ bias, int64_t rows,
                                 int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const T b = bias ? bias[c] : zero_like(T{});
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    T* p = x + r * cols + c;
    *p = gelu_tanh(*p + b);
  }
}

// 16-bit x: kVec elements per thread (4 when cols % 4 == 0 and the pointers allow it).
template <typename Y, int kVec>
__global__ void bias_gelu_16_kernel(Y* __restrict__ x, const float* __restrict__ bias,
                                    int64_t rows, int64_t cols) {
  const int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kVec;
  if (c >= cols) return;
  if constexpr (kVec == 4) {
    const float4 b = bias ? *reinterpret_cast<const float4*>(bias + c) : zero_like(float4{});
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
      Y* p = x + r * cols + c;
      store4_f(p, gelu_tanh(load4_f(p) + b));
    }
  } else {
    const float b = bias ? bias[c] : 0.0f;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
      Y* p = x + r * cols + c;
      *p = from_float<Y>(gelu_tanh(to_float(*p) + b));
    }
  }
}

template <typename Y>
void launch_bias_gelu_16(void* x_v, const float* bias, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  Y* x = static_cast<Y*>(x_v);
  const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 8 == 0 &&
                   (bias == nullptr || aligned16(bias));
  const int64_t n_cols = vec ? cols / 4 : cols;
  const int threads = threads_for_row(n_cols, kThreads);
  const dim3 grid(static_cast<unsigned>(ceil_div(n_cols, threads)), grid_rows(rows));
  if (vec) {
    bias_gelu_16_kernel<Y, 4><<<grid, threads, 0, stream>>>(x, bias, rows, cols);
  } else {
    bias_gelu_16_kernel<Y, 1><<<grid, threads, 0, stream>>>(x, bias, rows, cols);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void bias_gelu(void* x, ElemType type, const float* bias, int64_t rows, int64_t cols,
               cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  switch (type) {
    case ElemType::kF32: return bias_gelu(static_cast<float*>(x), bias, rows, cols, stream);
    case ElemType::kBF16: return launch_bias_gelu_16<__nv_bfloat16>(x, bias, rows, cols, stream);
    case ElemType::kF16: return launch_bias_gelu_16<__half>(x, bias, rows, cols, stream);
  }
}

void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const bool vec = cols % 4 == 0 && aligned16(x) && (bias == nullptr || aligned16(bias));
  const int64_t n_cols = vec ? cols / 4 : cols;
  const int threads = threads_for_row(n_cols, kThreads);
  const dim3 grid(static_cast<unsigned>(ceil_div(n_cols, threads)), grid_rows(rows));
  if (vec) {
    bias_gelu_kernel<<<grid, threads, 0, stream>>>(
        reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(bias), rows, n_cols);
  } else {
    bias_gelu_kernel<<<grid, threads, 0, stream>>>(x, bias, rows, n_cols);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

}  // namespace ltm::kernels::cuda
