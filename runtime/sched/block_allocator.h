// Rank 0's free list of KV cache block ids: the scheduler decides which blocks a sequence uses
// and sends them in every step plan's block tables, so all ranks agree without talking.
// Threading: single-threaded (the scheduler's step thread).
#pragma once

#include <cstdint>
#include <vector>

namespace ltm {

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

}  // namespace ltm
