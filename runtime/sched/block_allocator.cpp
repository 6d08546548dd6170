#include "runtime/sched/block_allocator.h"

#include <algorithm>
#include <functional>

#include "common/check.h"

namespace ltm {

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
