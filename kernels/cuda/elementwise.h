// Element-wise CUDA kernels: residual add, bias add, row gather (the kernels/cpu/elementwise.h
// ops). Row-major float32; pointers are device memory; each call enqueues on `stream` and returns
// (a launch failure aborts with host:file:line). float4 loads when rows and pointers are aligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace ltm::kernels::cuda {

// x[i] += y[i], i < n.
void add(float* x, const float* y, int64_t n, cudaStream_t stream);
// x[r, :] += bias[:] for every row.
void add_bias(float* x, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// dst[i, :] = src[rows[i], :], i < n; rows is device memory.
void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t d,
                 cudaStream_t stream);
// y[i] = x[i] rounded to nearest even in `type` (bf16 or fp16; a copy for f32), i < n: the
// activations a 16-bit GEMM reads.
void convert_from_f32(const float* x, void* y, ElemType type, int64_t n, cudaStream_t stream);

// --- 16-bit activations (bf16 or fp16; float32 runs the float32 ops above) ---
// y[i] = x[i] widened to float32, i < n (x of `type`).
void convert_to_f32(const void* x, ElemType type, float* y, int64_t n, cudaStream_t stream);
// x[i] = round(x[i] + y[i]) (x of `type`, y float32), i < n.
void add(void* x, ElemType type, const float* y, int64_t n, cudaStream_t stream);
// x[r, :] = round(x[r, :] + bias[:]) (x of `type`, bias float32).
void add_bias(void* x, ElemType type, const float* bias, int64_t rows, int64_t cols,
              cudaStream_t stream);

}  // namespace ltm::kernels::cuda
