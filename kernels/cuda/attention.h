// Causal multi-head attention over a paged KV cache, on the GPU (the kernels/cpu/attention.h ops).
//
// Cache layout, per layer, for K and V each: [n_blocks, n_kv_head, block_size, head_dim].
// Batch rows: sequence s owns rows [token_offsets[s], token_offsets[s+1]) of qkv/out; its
// context (cached tokens after this step's kv_cache_write) is context_lens[s]; its row i is at
// position context_lens[s] - n_new + i and attends to positions 0 .. that position.
// qkv rows: [n_tokens, (n_head + 2 n_kv_head) * head_dim] = Q | K | V, each split per head in
// head_dim columns. Grouped-query attention (the Llama family's, as kernels/cpu/attention.h):
// query head h reads KV head h / (n_head / n_kv_head); n_kv_head 0 means n_head.
//
// Two kernels, chosen per sequence:
//  - decode (a sequence with one new row): one thread block per (sequence, head,
//    partition of kDecodePartitionTokens keys). Each warp walks whole KV blocks through the block
//    table with an online softmax (running max, running sum, rescaled accumulator); the warps, then
//    the partitions (a second, small kernel), are merged with the same rescaling.
//  - prefill (a sequence with several new rows): flash-attention style. One thread block per (32 query rows,
//    head, sequence) keeps Q in shared memory and streams 32-key tiles of K and V, gathered through
//    the block table, with an online softmax per row and the causal mask; nothing of size
//    [n_new, context] is ever materialised.
// A batch whose rows are all decode rows (max_new_tokens == 1) launches only the decode kernel;
// a mixed batch launches both, each skipping the other's sequences, so a decode row next to a
// prompt is not pushed through a 32-row prefill tile.
// The cache holds float32, bf16 or fp16 elements (shape.kv); new keys and values are rounded to
// it (nearest even) by kv_cache_write and read back as float32. qkv and out hold activations of
// shape.act (float32, bf16 or fp16: Q is widened as loaded, the output rounded once as stored).
// All arithmetic is float32 with accurate expf (results agree with the CPU kernel to ~1e-6 on the
// same cache contents and float32 activations).
//
// Limits: head_dim <= 256 for prefill; decode head_dim <= 512 (multiple of 4) or <= 128.
// Violations abort with file:line. All pointers are device memory; calls enqueue on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/elem_type.h"

namespace ltm::kernels::cuda {

struct PagedAttentionShape {
  int n_seqs = 0;
  int n_head = 0;
  int n_kv_head = 0;  // KV heads (grouped-query attention; divides n_head); 0: n_head
  int head_dim = 0;
  int block_size = 0;
  int max_blocks_per_seq = 0;
  int max_context_len = 0;       // host hint: max of context_lens (sizes the decode split)
  int max_new_tokens = 0;        // host hint: max rows of one sequence (picks the kernels)
  ElemType kv = ElemType::kF32;  // element type of the K and V caches
  ElemType act = ElemType::kF32;  // element type of qkv and out
  const int32_t* token_offsets = nullptr;  // [n_seqs + 1] device
  const int32_t* context_lens = nullptr;   // [n_seqs] device
  const int32_t* block_tables = nullptr;   // [n_seqs, max_blocks_per_seq] device
};

// Keys one decode thread block covers; longer contexts are split and merged.
inline constexpr int kDecodePartitionTokens = 512;

// Writes K and V (n_kv_head heads each; 0: n_head) of each new token into its cache slot (slot =
// block * block_size + offset). A negative slot (a padding row) is skipped. qkv holds elements of
// `act`, the caches of `kv`.
void kv_cache_write(const void* qkv, ElemType act, const int32_t* slot_mapping, int64_t n_tokens,
                    int n_head, int n_kv_head, int head_dim, int block_size, void* k_cache,
                    void* v_cache, ElemType kv, cudaStream_t stream);

// Scratch paged_attention needs for `shape` (0 when the decode context fits one partition).
// Depends only on n_seqs, n_head, head_dim, block_size and max_context_len.
size_t paged_attention_workspace_bytes(const PagedAttentionShape& shape);

// out: [n_tokens, n_head * head_dim]. `workspace` holds paged_attention_workspace_bytes(shape)
// bytes (16-byte aligned; may be null when that is 0) and must not be in use by other work.
void paged_attention(const PagedAttentionShape& shape, const void* qkv, const void* k_cache,
                     const void* v_cache, void* out, void* workspace, cudaStream_t stream);

}  // namespace ltm::kernels::cuda
