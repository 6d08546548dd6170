// Internal to kernels/cuda: the launchers attention.cu dispatches to (one file per kernel).
#pragma once

#include "kernels/cuda/attention.h"

namespace ltm::kernels::cuda::detail {

// Number of decode partitions for `shape` (>= 1).
int decode_partitions(const PagedAttentionShape& shape);

// Decode: every sequence has at most one new row. `workspace` as in paged_attention.
void launch_paged_decode(const PagedAttentionShape& shape, const float* qkv, const float* k_cache,
                         const float* v_cache, float* out, float* workspace, cudaStream_t stream);

// Prefill (and mixed batches): any number of new rows per sequence.
void launch_paged_prefill(const PagedAttentionShape& shape, const float* qkv,
                          const float* k_cache, const float* v_cache, float* out,
                          cudaStream_t stream);

}  // namespace ltm::kernels::cuda::detail
