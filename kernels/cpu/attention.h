// Causal multi-head attention over a paged KV cache.
//
// Cache layout, per layer, for K and V each: [n_blocks, n_kv_head, block_size, head_dim].
// Batch rows: sequence s owns rows [token_offsets[s], token_offsets[s+1]) of qkv/out; its
// context (cached tokens after this step's write) is context_lens[s]; its row i is at position
// context_lens[s] - n_new + i and attends to positions 0 .. that position.
// qkv rows: [n_tokens, (n_head + 2 * n_kv_head) * head_dim] = Q | K | V, each split per head.
// Grouped-query attention: the cache holds n_kv_head heads (K and V of qkv have n_kv_head
// heads), and query head h reads KV head h / (n_head / n_kv_head). n_kv_head 0: n_head.
// All arrays are host memory. Threaded over (sequence, head, query tile).
//
// 16-bit caches (kv_type bf16 or f16, weight_type.h): the same layout with 2-byte elements,
// converted from fp32 by kv_cache_write (round to nearest even) and back to fp32 as attention
// reads them. Decode rows (the tiled path) read the 16-bit K and V rows directly, converting them
// with the path's vector instructions, so attention reads half the bytes; a prefill chunk (the
// matrix path) converts each head's K and V into an fp32 scratch before its two GEMMs.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_type.h"

namespace ltm::kernels::cpu {

struct PagedAttentionShape {
  int n_seqs;
  int n_head;
  int head_dim;
  int block_size;
  int max_blocks_per_seq;
  const int32_t* token_offsets;  // [n_seqs + 1]
  const int32_t* context_lens;   // [n_seqs]
  const int32_t* block_tables;   // [n_seqs, max_blocks_per_seq]
  WeightType kv_type = WeightType::kF32;  // element type of the K and V caches
  int n_kv_head = 0;                      // KV heads (0: n_head); n_head % n_kv_head == 0
  // [n_seqs] or null: a sequence with a nonzero entry has its rows computed tile by tile, as
  // one-row decode steps compute theirs, however many they are (speculative decoding's verify
  // rows, whose logits must have the bits plain decoding gives); the others take the matrix form
  // from kMatrixRows new rows (a prefill chunk), whose sums run in other orders.
  const int32_t* exact = nullptr;
};

// New rows of a sequence from which paged_attention takes the matrix form (unless `exact`).
inline constexpr int kMatrixRows = 16;

// `static`, not plain inline: the per-ISA units include this header, and an inline function
// they share with baseline units could be linked as their AVX copy (isa_kernels.h).
static inline int kv_heads(const PagedAttentionShape& s) {
  return s.n_kv_head > 0 ? s.n_kv_head : s.n_head;
}
// Elements of one qkv row: Q of n_head heads, K and V of kv_heads() heads each.
static inline int64_t qkv_stride(const PagedAttentionShape& s) {
  return (static_cast<int64_t>(s.n_head) + 2 * kv_heads(s)) * s.head_dim;
}
// The KV head that query head `head` reads.
static inline int kv_head_of(const PagedAttentionShape& s, int head) {
  return head / (s.n_head / kv_heads(s));
}

// Writes K and V of each new token into its cache slot (slot = block * block_size + offset);
// a row whose slot is negative (padding) writes nothing, as in the CUDA kernel. qkv rows hold
// n_head query heads, then n_kv_head K heads and n_kv_head V heads (n_kv_head 0: n_head).
void kv_cache_write(const float* qkv, const int32_t* slot_mapping, int64_t n_tokens, int n_head,
                    int head_dim, int block_size, float* k_cache, float* v_cache,
                    int n_kv_head = 0);

// As kv_cache_write above, converting K and V to kv_type in caches of that element type.
void kv_cache_write(const float* qkv, const int32_t* slot_mapping, int64_t n_tokens, int n_head,
                    int head_dim, int block_size, WeightType kv_type, void* k_cache, void* v_cache,
                    int n_kv_head = 0);

// out: [n_tokens, n_head * head_dim]. fp32 caches: shape.kv_type must be kF32 (else
// std::invalid_argument). head_dim <= 512.
void paged_attention(const PagedAttentionShape& shape, const float* qkv, const float* k_cache,
                     const float* v_cache, float* out);

// As paged_attention above, reading caches of shape.kv_type (converted to fp32 as read).
void paged_attention(const PagedAttentionShape& shape, const float* qkv, const void* k_cache,
                     const void* v_cache, float* out);

}  // namespace ltm::kernels::cpu
