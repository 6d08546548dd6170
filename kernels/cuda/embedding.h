// Token and position embeddings. Device pointers; enqueues on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace ltm::kernels::cuda {

// out[t, :] = table[ids[t] - row_begin, :] for ids inside [row_begin, row_end), else zeros.
// table: [row_end - row_begin, d] (a vocab-parallel rank's rows).
void embedding(const int32_t* ids, const float* table, int64_t row_begin, int64_t row_end,
               float* out, int64_t n_tokens, int64_t d, cudaStream_t stream);
// The same on a table of `type` elements (bf16 or fp16 weights); out is float32.
void embedding(const int32_t* ids, const void* table, ElemType type, int64_t row_begin,
               int64_t row_end, float* out, int64_t n_tokens, int64_t d, cudaStream_t stream);

// x[t, :] += table[positions[t], :]; with table == nullptr, the sinusoid
// pe[p, 2i] = sin(p / 10000^(2i/d)), pe[p, 2i+1] = cos(p / 10000^(2i/d)), computed in double
// (as the CPU kernel does, so the two agree to float rounding at any position).
void add_position_embedding(float* x, const float* table, const int32_t* positions,
                            int64_t n_tokens, int64_t d, cudaStream_t stream);

}  // namespace ltm::kernels::cuda
