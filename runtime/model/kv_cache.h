// Paged KV cache storage for this rank's layers and heads, and the block allocator rank 0 uses.
//
// Storage (every rank): per local layer, K and V each [n_blocks, n_head_local, block_size, d_k]
// (device memory). Which blocks a sequence uses is decided by the scheduler on rank 0 and sent in
// every step plan as a block table, so all ranks agree without talking.
// Threading: single-threaded (the step thread).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/model_config.h"

namespace ltm {

class KvCache {
 public:
  KvCache(Backend& backend, int64_t n_layers_local, int64_t n_head_local, int64_t head_dim,
          int32_t block_size, int32_t n_blocks);
  float* k(int64_t layer) { return k_[layer].f32(); }  // layer: index within this stage
  float* v(int64_t layer) { return v_[layer].f32(); }
  int32_t block_size() const { return block_size_; }
  int32_t n_blocks() const { return n_blocks_; }

  // Bytes one block takes across `n_layers` layers, K and V.
  static int64_t block_bytes(int64_t n_layers, int64_t n_head_local, int64_t head_dim,
                             int32_t block_size);

 private:
  int32_t block_size_, n_blocks_;
  std::vector<DeviceBuffer> k_, v_;
};

// Free list of block ids. Hands out the lowest free ids first (stable tests).
class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t n_blocks);
  int32_t n_total() const { return n_total_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  bool allocate(int32_t n, std::vector<int32_t>* out);  // false (nothing taken) when short
  void release(const std::vector<int32_t>& blocks);

 private:
  int32_t n_total_;
  // Min-heap of free ids (std::greater): the lowest free id comes out first, and a release costs
  // O(log n) per block instead of re-sorting the whole free list.
  std::vector<int32_t> free_;
};

// Blocks needed to hold `n_tokens` tokens.
inline int32_t blocks_for(int64_t n_tokens, int32_t block_size) {
  return static_cast<int32_t>((n_tokens + block_size - 1) / block_size);
}

}  // namespace ltm
