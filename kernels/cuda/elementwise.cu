#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/elementwise.h"

namespace ltm::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// T is float or float4: the same grid-stride loop for the scalar and the vector case.
template <typename T>
__global__ void add_kernel(T* __restrict__ x, const T* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    x[i] = x[i] + y[i];
}

// Rows walk grid.y (stride gridDim.y), columns grid.x * blockDim.x; `cols` counts T elements.
template <typename T>
__global__ void add_bias_kernel(T* __restrict__ x, const T* __restrict__ bias, int64_t rows,
                                int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const T b = bias[c];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) x[r * cols + c] = x[r * cols + c] + b;
}

template <typename T>
__global__ void gather_rows_kernel(const T* __restrict__ src, const int32_t* __restrict__ rows,
                                   T* __restrict__ dst, int64_t n, int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y)
    dst[i * cols + c] = src[static_cast<int64_t>(rows[i]) * cols + c];
}

// The 2-D launch of a row kernel over `rows` rows of `cols` elements.
struct RowLaunch {
  dim3 grid;
  dim3 block;
};
RowLaunch row_launch(int64_t rows, int64_t cols) {
  const int threads = threads_for_row(cols, kThreads);
  return {dim3(static_cast<unsigned>(ceil_div(cols, threads)), grid_rows(rows)), dim3(threads)};
}

// Four elements per thread when kVec == 4 (x 16-byte and y 8-byte aligned), else one.
template <typename C, int kVec>
__global__ void convert_kernel(const float* __restrict__ x, C* __restrict__ y, int64_t n_vec) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_vec;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kVec == 4) {
      store4_f(y + 4 * i, load4_f(x + 4 * i));
    } else {
      y[i] = from_float<C>(x[i]);
    }
  }
}

template <typename C>
void launch_convert(const float* x, void* y_v, int64_t n, cudaStream_t stream) {
  C* y = static_cast<C*>(y_v);
  const bool vec = n % 4 == 0 && aligned16(x) && reinterpret_cast<uintptr_t>(y) % 8 == 0;
  const int64_t n_vec = vec ? n / 4 : n;
  if (vec) {
    convert_kernel<C, 4><<<grid_for(n_vec, kThreads), kThreads, 0, stream>>>(x, y, n_vec);
  } else {
    convert_kernel<C, 1><<<grid_for(n_vec, kThreads), kThreads, 0, stream>>>(x, y, n_vec);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

// One element per thread-iteration over n: x (type X) widened, op, stored as Y.
template <typename X>
__global__ void widen_kernel(const X* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = to_float(x[i]);
}

template <typename X>
__global__ void add_f32_kernel(X* __restrict__ x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = from_float<X>(to_float(x[i]) + y[i]);
}

template <typename X>
__global__ void add_bias_16_kernel(X* __restrict__ x, const float* __restrict__ bias, int64_t rows,
                                   int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const float b = bias[c];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    x[r * cols + c] = from_float<X>(to_float(x[r * cols + c]) + b);
}

template <typename X>
void launch_16(int op, void* x_v, const float* y, int64_t rows, int64_t cols, float* out,
               cudaStream_t stream) {
  X* x = static_cast<X*>(x_v);
  const int64_t n = rows * cols;
  if (op == 0) {
    widen_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, out, n);
  } else if (op == 1) {
    add_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  } else {
    const RowLaunch l = row_launch(rows, cols);
    add_bias_16_kernel<<<l.grid, l.block, 0, stream>>>(x, y, rows, cols);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

// op 0: out = widen(x); 1: x += y; 2: x += bias (y) per row.
void dispatch_16(int op, void* x, ElemType type, const float* y, int64_t rows, int64_t cols,
                 float* out, cudaStream_t stream) {
  if (type == ElemType::kBF16) {
    launch_16<__nv_bfloat16>(op, x, y, rows, cols, out, stream);
  } else {
    launch_16<__half>(op, x, y, rows, cols, out, stream);
  }
}

}  // namespace

void convert_to_f32(const void* x, ElemType type, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (type == ElemType::kF32) {
    LTM_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dispatch_16(0, const_cast<void*>(x), type, nullptr, 1, n, y, stream);
}

void add(void* x, ElemType type, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (type == ElemType::kF32) return add(static_cast<float*>(x), y, n, stream);
  dispatch_16(1, x, type, y, 1, n, nullptr, stream);
}

void add_bias(void* x, ElemType type, const float* bias, int64_t rows, int64_t cols,
              cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (type == ElemType::kF32) return add_bias(static_cast<float*>(x), bias, rows, cols, stream);
  dispatch_16(2, x, type, bias, rows, cols, nullptr, stream);
}

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (n % 4 == 0 && aligned16(x) && aligned16(y)) {
    const int64_t n4 = n / 4;
    add_kernel<<<grid_for(n4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(y), n4);
  } else {
    add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

void add_bias(float* x, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (cols % 4 == 0 && aligned16(x) && aligned16(bias)) {
    const RowLaunch l = row_launch(rows, cols / 4);
    add_bias_kernel<<<l.grid, l.block, 0, stream>>>(
        reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(bias), rows, cols / 4);
  } else {
    const RowLaunch l = row_launch(rows, cols);
    add_bias_kernel<<<l.grid, l.block, 0, stream>>>(x, bias, rows, cols);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t d,
                 cudaStream_t stream) {
  if (n <= 0 || d <= 0) return;
  if (d % 4 == 0 && aligned16(src) && aligned16(dst)) {
    const RowLaunch l = row_launch(n, d / 4);
    gather_rows_kernel<<<l.grid, l.block, 0, stream>>>(reinterpret_cast<const float4*>(src), rows,
                                                       reinterpret_cast<float4*>(dst), n, d / 4);
  } else {
    const RowLaunch l = row_launch(n, d);
    gather_rows_kernel<<<l.grid, l.block, 0, stream>>>(src, rows, dst, n, d);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

void convert_from_f32(const float* x, void* y, ElemType type, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  switch (type) {
    case ElemType::kF32:
      LTM_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream));
      return;
    case ElemType::kBF16: return launch_convert<__nv_bfloat16>(x, y, n, stream);
    case ElemType::kF16: return launch_convert<__half>(x, y, n, stream);
  }
}

}  // namespace ltm::kernels::cuda
