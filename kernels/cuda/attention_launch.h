// Internal to kernels/cuda: the launchers attention.cu dispatches to (one file per kernel).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.h"

namespace ltm::kernels::cuda::detail {

// What both attention kernels read (passed to them by value): the batch layout and the cache.
struct PagedParams {
  const void* qkv;      // [n_tokens, (n_head + 2 n_kv_head) * head_dim] of `act`
  const void* k_cache;  // [n_blocks, n_kv_head, block_size, head_dim] of the kernel's cache type
  const void* v_cache;
  void* out;            // [n_tokens, n_head * head_dim] of `act`
  const int32_t* token_offsets;
  const int32_t* context_lens;
  const int32_t* block_tables;
  int n_head;
  int n_kv_head;  // resolved: n_head when the shape's is 0
  int kv_group;   // query heads per KV head: head h reads KV head h / kv_group
  int64_t qkv_stride;  // elements per qkv row: (n_head + 2 n_kv_head) * head_dim
  int head_dim;
  int block_size;
  int max_blocks_per_seq;
  float scale;  // 1 / sqrt(head_dim)
  ElemType act;  // element type of qkv and out
};

inline PagedParams paged_params(const PagedAttentionShape& s, const void* qkv,
                                const void* k_cache, const void* v_cache, void* out) {
  const int n_kv = s.n_kv_head > 0 ? s.n_kv_head : s.n_head;
  return PagedParams{qkv, k_cache, v_cache, out, s.token_offsets, s.context_lens, s.block_tables,
                     s.n_head, n_kv, s.n_head / n_kv,
                     static_cast<int64_t>(s.n_head + 2 * n_kv) * s.head_dim, s.head_dim,
                     s.block_size, s.max_blocks_per_seq,
                     1.0f / std::sqrt(static_cast<float>(s.head_dim)), s.act};
}

// Number of decode partitions for `shape` (>= 1).
int decode_partitions(const PagedAttentionShape& shape);

// Decode: the sequences with new rows (only those with exactly one when `single_only`; else
// each sequence's last row, which must then be its only one). `workspace` as in paged_attention.
void launch_paged_decode(const PagedAttentionShape& shape, const void* qkv, const void* k_cache,
                         const void* v_cache, void* out, float* workspace, bool single_only,
                         cudaStream_t stream);

// Prefill: any number of new rows per sequence; with `skip_single`, sequences with exactly one
// new row are left to the decode kernel.
void launch_paged_prefill(const PagedAttentionShape& shape, const void* qkv,
                          const void* k_cache, const void* v_cache, void* out, bool skip_single,
                          cudaStream_t stream);

// The tensor-core prefill (attention_prefill_mma.cu): whether it takes `shape` on this device
// (16-bit activations and cache of one type, head_dim % 16 == 0 and <= 128, 16-byte aligned
// pointers, compute capability >= 8.0, LTM_CUDA_PREFILL_MMA not 0), and its launch, with
// launch_paged_prefill's contract.
bool prefill_mma_applies(const PagedAttentionShape& shape, const void* qkv, const void* k_cache,
                         const void* v_cache, const void* out);
void launch_paged_prefill_mma(const PagedAttentionShape& shape, const void* qkv,
                              const void* k_cache, const void* v_cache, void* out,
                              bool skip_single, cudaStream_t stream);

}  // namespace ltm::kernels::cuda::detail
