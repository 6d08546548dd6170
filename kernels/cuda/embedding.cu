#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/embedding.h"

namespace ltm::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float zero_like(float) { return 0.0f; }
__device__ __forceinline__ float4 zero_like(float4) { return make_float4(0.f, 0.f, 0.f, 0.f); }

// Tokens walk grid.y, columns grid.x * blockDim.x; `cols` counts T elements.
template <typename T>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table,
                                 int64_t row_begin, int64_t row_end, T* __restrict__ out,
                                 int64_t n_tokens, int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const int64_t id = ids[t];
    out[t * cols + c] =
        id >= row_begin && id < row_end ? table[(id - row_begin) * cols + c] : zero_like(T{});
  }
}

// A 16-bit table (C) into float rows; one thread per element.
template <typename C>
__global__ void embedding_typed_kernel(const int32_t* __restrict__ ids, const C* __restrict__ table,
                                       int64_t row_begin, int64_t row_end,
                                       float* __restrict__ out, int64_t n_tokens, int64_t d) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= d) return;
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const int64_t id = ids[t];
    out[t * d + c] = id >= row_begin && id < row_end ? to_float(table[(id - row_begin) * d + c])
                                                     : 0.0f;
  }
}

template <typename T>
__global__ void add_learned_position_kernel(T* __restrict__ x, const T* __restrict__ table,
                                            const int32_t* __restrict__ positions,
                                            int64_t n_tokens, int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y)
    x[t * cols + c] = x[t * cols + c] + table[static_cast<int64_t>(positions[t]) * cols + c];
}

// One thread per (sin, cos) pair of columns 2i, 2i+1. Double precision: it is one sin/cos per
// two elements of a once-per-step op, and it keeps large positions exact to float rounding.
__global__ void add_sinusoid_position_kernel(float* __restrict__ x,
                                             const int32_t* __restrict__ positions,
                                             int64_t n_tokens, int64_t d) {
  const int64_t pair = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t c = 2 * pair;
  if (c >= d) return;
  const double wavelength = pow(10000.0, static_cast<double>(c) / static_cast<double>(d));
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const double angle = static_cast<double>(positions[t]) / wavelength;
    double s, co;
    sincos(angle, &s, &co);
    float* row = x + t * d;
    row[c] += static_cast<float>(s);
    if (c + 1 < d) row[c + 1] += static_cast<float>(co);
  }
}

dim3 grid_2d(int64_t rows, int64_t cols, int threads) {
  return dim3(static_cast<unsigned>(ceil_div(cols, threads)), grid_rows(rows));
}

}  // namespace

void embedding(const int32_t* ids, const float* table, int64_t row_begin, int64_t row_end,
               float* out, int64_t n_tokens, int64_t d, cudaStream_t stream) {
  if (n_tokens <= 0 || d <= 0) return;
  const bool vec = d % 4 == 0 && aligned16(table) && aligned16(out);
  const int64_t cols = vec ? d / 4 : d;
  const int threads = threads_for_row(cols, kThreads);
  const dim3 grid = grid_2d(n_tokens, cols, threads);
  if (vec) {
    embedding_kernel<<<grid, threads, 0, stream>>>(ids, reinterpret_cast<const float4*>(table),
                                                   row_begin, row_end,
                                                   reinterpret_cast<float4*>(out), n_tokens, cols);
  } else {
    embedding_kernel<<<grid, threads, 0, stream>>>(ids, table, row_begin, row_end, out, n_tokens,
                                                   cols);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

void embedding(const int32_t* ids, const void* table, ElemType type, int64_t row_begin,
               int64_t row_end, float* out, int64_t n_tokens, int64_t d, cudaStream_t stream) {
  if (type == ElemType::kF32)
    return embedding(ids, static_cast<const float*>(table), row_begin, row_end, out, n_tokens, d,
                     stream);
  if (n_tokens <= 0 || d <= 0) return;
  const int threads = threads_for_row(d, kThreads);
  const dim3 grid = grid_2d(n_tokens, d, threads);
  if (type == ElemType::kBF16) {
    embedding_typed_kernel<<<grid, threads, 0, stream>>>(
        ids, static_cast<const __nv_bfloat16*>(table), row_begin, row_end, out, n_tokens, d);
  } else {
    embedding_typed_kernel<<<grid, threads, 0, stream>>>(ids, static_cast<const __half*>(table),
                                                         row_begin, row_end, out, n_tokens, d);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

void add_position_embedding(float* x, const float* table, const int32_t* positions,
                            int64_t n_tokens, int64_t d, cudaStream_t stream) {
  if (n_tokens <= 0 || d <= 0) return;
  if (table == nullptr) {
    const int64_t pairs = ceil_div(d, 2);
    const int threads = threads_for_row(pairs, kThreads);
    add_sinusoid_position_kernel<<<grid_2d(n_tokens, pairs, threads), threads, 0, stream>>>(
        x, positions, n_tokens, d);
  } else if (d % 4 == 0 && aligned16(x) && aligned16(table)) {
    const int threads = threads_for_row(d / 4, kThreads);
    add_learned_position_kernel<<<grid_2d(n_tokens, d / 4, threads), threads, 0, stream>>>(
        reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(table), positions,
        n_tokens, d / 4);
  } else {
    const int threads = threads_for_row(d, kThreads);
    add_learned_position_kernel<<<grid_2d(n_tokens, d, threads), threads, 0, stream>>>(
        x, table, positions, n_tokens, d);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

}  // namespace ltm::kernels::cuda
