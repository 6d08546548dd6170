#include "runtime/model/kv_cache.h"

#include <algorithm>
#include <functional>

#include "common/check.h"

namespace ltm {

KvCache::KvCache(Backend& backend, int64_t n_layers_local, int64_t n_head_local, int64_t head_dim,
                 int32_t block_size, int32_t n_blocks)
    : block_size_(block_size), n_blocks_(n_blocks) {
  LTM_ASSERT(block_size > 0 && n_blocks > 0, "block_size ", block_size, " n_blocks ", n_blocks);
  const size_t bytes = static_cast<size_t>(n_blocks) * n_head_local * block_size * head_dim *
                       sizeof(float);
  for (int64_t l = 0; l < n_layers_local; ++l) {
    // Zeroed so that a stale slot can never hold NaN/Inf that a masked weight of 0 would spread.
    k_.push_back(backend.alloc_zeroed(bytes));
    v_.push_back(backend.alloc_zeroed(bytes));
  }
}

int64_t KvCache::block_bytes(int64_t n_layers, int64_t n_head_local, int64_t head_dim,
                             int32_t block_size) {
  return 2 * n_layers * n_head_local * block_size * head_dim * static_cast<int64_t>(sizeof(float));
}

BlockAllocator::BlockAllocator(int32_t n_blocks) : n_total_(n_blocks) {
  free_.reserve(n_blocks);
  for (int32_t b = 0; b < n_blocks; ++b) free_.push_back(b);  // ascending: already a min-heap
}

bool BlockAllocator::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n > n_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<int32_t>());
    out->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    LTM_ASSERT(b >= 0 && b < n_total_, "block ", b, " out of range");
    free_.push_back(b);
    std::push_heap(free_.begin(), free_.end(), std::greater<int32_t>());
  }
  LTM_ASSERT(n_free() <= n_total_, "a block was released twice");
}

}  // namespace ltm
