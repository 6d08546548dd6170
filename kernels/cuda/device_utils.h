// Device-side helpers shared by the kernels in kernels/cuda: warp and block reductions, float4
// arithmetic, alignment tests and launch-size arithmetic. Include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

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

// GELU, tanh approximation (GPT-2's "gelu_new"): 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))),
// with the accurate tanhf (matches the CPU at 1e-6). gelu.cu's kernels and int8_gemm.cu's epilogue.
__device__ __forceinline__ float gelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCoeff = 0.044715f;
  return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v)));
}

// --- 16-bit element access: storage in float / bf16 / fp16, arithmetic in float ---
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// Four consecutive elements at p as float4; p is aligned to 4 elements (16 or 8 bytes).
__device__ __forceinline__ float4 load4_f(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4_f(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 lo = __bfloat1622float2(h[0]);
  const float2 hi = __bfloat1622float2(h[1]);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float4 load4_f(const __half* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
  const float2 lo = __half22float2(h[0]);
  const float2 hi = __half22float2(h[1]);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Stores v rounded to nearest even at p (aligned as for load4_f).
__device__ __forceinline__ void store4_f(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}
__device__ __forceinline__ void store4_f(__nv_bfloat16* p, float4 v) {
  __nv_bfloat162 h[2] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
  *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(h);
}
__device__ __forceinline__ void store4_f(__half* p, float4 v) {
  __half2 h[2] = {__floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w)};
  *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(h);
}

// --- activations whose element type is a kernel argument (float, bf16 or fp16) ---
// A branch on a value that is the same for every thread: cheaper than a template per type where
// the access is a small part of the kernel (attention's Q loads and output stores).
// Element i of `base` as float.
__device__ __forceinline__ float load_act(const void* base, int64_t i, ElemType t) {
  switch (t) {
    case ElemType::kBF16: return to_float(static_cast<const __nv_bfloat16*>(base)[i]);
    case ElemType::kF16: return to_float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}
// Elements i .. i + 3 (i a multiple of 4, base 16-byte aligned).
__device__ __forceinline__ float4 load4_act(const void* base, int64_t i, ElemType t) {
  switch (t) {
    case ElemType::kBF16: return load4_f(static_cast<const __nv_bfloat16*>(base) + i);
    case ElemType::kF16: return load4_f(static_cast<const __half*>(base) + i);
    default: return load4_f(static_cast<const float*>(base) + i);
  }
}
// Stores v rounded to nearest even at element i.
__device__ __forceinline__ void store_act(void* base, int64_t i, float v, ElemType t) {
  switch (t) {
    case ElemType::kBF16:
      static_cast<__nv_bfloat16*>(base)[i] = from_float<__nv_bfloat16>(v);
      return;
    case ElemType::kF16: static_cast<__half*>(base)[i] = from_float<__half>(v); return;
    default: static_cast<float*>(base)[i] = v; return;
  }
}
// Stores elements i .. i + 3 (as load4_act).
__device__ __forceinline__ void store4_act(void* base, int64_t i, float4 v, ElemType t) {
  switch (t) {
    case ElemType::kBF16: return store4_f(static_cast<__nv_bfloat16*>(base) + i, v);
    case ElemType::kF16: return store4_f(static_cast<__half*>(base) + i, v);
    default: return store4_f(static_cast<float*>(base) + i, v);
  }
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
