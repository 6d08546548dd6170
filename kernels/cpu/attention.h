// Causal multi-head attention over a paged KV cache.
//
// Cache layout, per layer, for K and V each: [n_blocks, n_head, block_size, head_dim].
// Batch rows: sequence s owns rows [token_offsets[s], token_offsets[s+1]) of qkv/out; its
// context (cached tokens after this step's write) is context_lens[s]; its row i is at position
// context_lens[s] - n_new + i and attends to positions 0 .. that position.
// qkv rows: [n_tokens, 3 * n_head * head_dim] = Q | K | V, each split per head.
// All arrays are host memory. Threaded over (sequence, head, query tile).
#pragma once

#include <cstdint>

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
};

// Writes K and V of each new token into its cache slot (slot = block * block_size + offset).
void kv_cache_write(const float* qkv, const int32_t* slot_mapping, int64_t n_tokens, int n_head,
                    int head_dim, int block_size, float* k_cache, float* v_cache);

// out: [n_tokens, n_head * head_dim].
void paged_attention(const PagedAttentionShape& shape, const float* qkv, const float* k_cache,
                     const float* v_cache, float* out);

}  // namespace ltm::kernels::cpu
