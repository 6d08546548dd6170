// The block allocator the scheduler uses: lowest free ids first, all-or-nothing allocation,
// released blocks come back, and the count of free blocks stays exact.
#include "runtime/sched/block_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace ltm {
namespace {

TEST(BlockAllocator, HandsOutLowestIdsFirstAndTakesThemBack) {
  BlockAllocator a(8);
  std::vector<int32_t> x, y;
  ASSERT_TRUE(a.allocate(3, &x));
  EXPECT_EQ(x, (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE(a.allocate(2, &y));
  EXPECT_EQ(y, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(a.n_free(), 3);
  a.release({2, 0});
  EXPECT_EQ(a.n_free(), 5);
  std::vector<int32_t> z;
  ASSERT_TRUE(a.allocate(3, &z));
  EXPECT_EQ(z, (std::vector<int32_t>{0, 2, 5}));
}

TEST(BlockAllocator, ShortAllocationTakesNothing) {
  BlockAllocator a(4);
  std::vector<int32_t> x;
  ASSERT_TRUE(a.allocate(3, &x));
  std::vector<int32_t> y;
  EXPECT_FALSE(a.allocate(2, &y));
  EXPECT_TRUE(y.empty());
  EXPECT_EQ(a.n_free(), 1);
}

TEST(BlockAllocator, ChurnKeepsEveryBlockExactlyOnce) {
  BlockAllocator a(64);
  std::vector<std::vector<int32_t>> held;
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> b;
    if (a.allocate(1 + round % 7, &b)) held.push_back(b);
    if (round % 3 == 0 && !held.empty()) {
      a.release(held[round % held.size()]);
      held.erase(held.begin() + round % held.size());
    }
  }
  std::vector<int32_t> all;
  for (auto& h : held) all.insert(all.end(), h.begin(), h.end());
  std::vector<int32_t> rest;
  ASSERT_TRUE(a.allocate(a.n_free(), &rest));
  all.insert(all.end(), rest.begin(), rest.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), 64u);
  for (int32_t i = 0; i < 64; ++i) EXPECT_EQ(all[i], i);
}

}  // namespace
}  // namespace ltm
