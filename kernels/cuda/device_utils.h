// Device-side helpers shared by the kernels in kernels/cuda: warp and block reductions, float4
// arithmetic, alignment tests and launch-size arithmetic. Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ltm::kernels::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int kWarpSize = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds >= 32 floats and may be
// reused right after the call returns. blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < n_warps ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  __syncthreads();  // scratch may be reused by the caller
  return total;
}

__device__ __forceinline__ float4 operator+(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float4 operator*(float4 a, float s) {
  return make_float4(a.x * s, a.y * s, a.z * s, a.w * s);
}
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
// acc += w * v
__device__ __forceinline__ void fma4(float4& acc, float w, float4 v) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
}

// Host and device: launch-size arithmetic.
__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks for a grid-stride loop over `n` items with `threads` per block: enough to fill the GPU
// several times over, never more than needed.
inline unsigned grid_for(int64_t n, int threads) {
  constexpr int64_t kMaxBlocks = 8192;
  const int64_t blocks = ceil_div(n, threads);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// Rows handled by a 2-D launch's y dimension (each block loops over rows with stride gridDim.y).
inline unsigned grid_rows(int64_t rows) {
  constexpr int64_t kMaxRows = 65535;
  return static_cast<unsigned>(rows < kMaxRows ? rows : kMaxRows);
}

// Threads for a block that walks `n` items of a row: a multiple of 32 in [32, max_threads].
inline int threads_for_row(int64_t n, int max_threads) {
  const int64_t t = round_up(n < 1 ? 1 : n, kWarpSize);
  return static_cast<int>(t > max_threads ? max_threads : t);
}

}  // namespace ltm::kernels::cuda
