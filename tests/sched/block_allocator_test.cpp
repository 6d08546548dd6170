// The block allocator the scheduler uses: lowest free ids first, all-or-nothing allocation,
// released blocks come back, and the count of free blocks stays exact; and its prefix cache:
// chained block keys, hits verified by token ids, salt and parent, reference counts, LRU
// eviction only when plain free blocks run out.
#include "runtime/sched/block_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
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

using Chain = BlockAllocator::Chain;

std::vector<int32_t> ids(int n, int salt) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(i * 3 + salt);
  return v;
}

// Registers `tokens` (whole blocks of 2) in freshly allocated blocks and releases them.
std::vector<int32_t> cache(BlockAllocator& a, const std::vector<int32_t>& tokens, uint64_t salt) {
  std::vector<int32_t> blocks;
  EXPECT_TRUE(a.allocate(static_cast<int32_t>(tokens.size()) / 2, &blocks));
  Chain c = BlockAllocator::root(salt);
  for (size_t i = 0; i < blocks.size(); ++i)
    EXPECT_TRUE(a.register_block(blocks[i], std::span(tokens).subspan(2 * i, 2), &c));
  a.release(blocks);
  return blocks;
}

TEST(BlockCache, ReleasedRegisteredBlocksStayCachedAndCountAsFree) {
  BlockAllocator a(8);
  const auto t = ids(6, 1);
  const auto blocks = cache(a, t, 7);
  EXPECT_EQ(a.n_free(), 8);
  EXPECT_EQ(a.n_cached(), 3);
  Chain c = BlockAllocator::root(7);
  EXPECT_EQ(a.lookup(t, 2, 100, &c), blocks);
  // A longer token list matches the cached run; max_blocks caps it; a partial block is ignored.
  auto longer = t;
  longer.push_back(99);
  c = BlockAllocator::root(7);
  EXPECT_EQ(a.lookup(longer, 2, 100, &c), blocks);
  c = BlockAllocator::root(7);
  EXPECT_EQ(a.lookup(t, 2, 2, &c).size(), 2u);
  // Another salt (adapter, KV dtype) or another first block: nothing.
  c = BlockAllocator::root(8);
  EXPECT_TRUE(a.lookup(t, 2, 100, &c).empty());
  auto other = t;
  other[0] = 50;
  c = BlockAllocator::root(7);
  EXPECT_TRUE(a.lookup(other, 2, 100, &c).empty());
  // The same second block after another first block is another key: not found either.
  c = BlockAllocator::root(7);
  EXPECT_TRUE(a.lookup(std::vector<int32_t>{50, 4, 7, 10}, 2, 100, &c).empty());
}

TEST(BlockCache, ReferenceCountsKeepHeldBlocksOffTheLruList) {
  BlockAllocator a(4);
  const auto t = ids(4, 2);
  const auto blocks = cache(a, t, 1);
  a.acquire(blocks);
  a.acquire({blocks[0]});
  EXPECT_EQ(a.n_unheld(blocks), 0);
  EXPECT_EQ(a.n_free(), 2);
  EXPECT_EQ(a.n_cached(), 0);
  std::vector<int32_t> rest;
  EXPECT_FALSE(a.allocate(3, &rest));  // held blocks are never evicted
  a.release(blocks);
  EXPECT_EQ(a.n_free(), 3);  // blocks[0] is still held once
  EXPECT_EQ(a.n_unheld(blocks), 1);
  a.release({blocks[0]});
  EXPECT_EQ(a.n_free(), 4);
  EXPECT_EQ(a.n_cached(), 2);
}

TEST(BlockCache, EvictsLeastRecentlyReleasedOnlyWhenNoPlainBlockIsFree) {
  BlockAllocator a(6);
  const auto x = cache(a, ids(2, 1), 0);  // released first
  const auto y = cache(a, ids(2, 2), 0);
  const auto z = cache(a, ids(2, 3), 0);
  EXPECT_EQ(a.n_cached(), 3);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.allocate(3, &got));  // the three plain free blocks
  EXPECT_EQ(a.n_cached(), 3);
  // Use x again: y is now the least recently released.
  Chain c = BlockAllocator::root(0);
  ASSERT_EQ(a.lookup(ids(2, 1), 2, 1, &c), x);
  a.acquire(x);
  a.release(x);
  std::vector<int32_t> one;
  ASSERT_TRUE(a.allocate(1, &one));
  EXPECT_EQ(one, y);
  c = BlockAllocator::root(0);
  EXPECT_TRUE(a.lookup(ids(2, 2), 2, 1, &c).empty());  // evicted: unregistered
  c = BlockAllocator::root(0);
  EXPECT_EQ(a.lookup(ids(2, 3), 2, 1, &c), z);
  c = BlockAllocator::root(0);
  EXPECT_EQ(a.lookup(ids(2, 1), 2, 1, &c), x);
  // The evicted block's new holder can register other contents in it.
  Chain r = BlockAllocator::root(0);
  EXPECT_TRUE(a.register_block(one[0], ids(2, 9), &r));
  a.release(one);
  c = BlockAllocator::root(0);
  EXPECT_EQ(a.lookup(ids(2, 9), 2, 1, &c), one);
}

TEST(BlockCache, AnEqualBlockIsRegisteredOnceAndTheChainFollowsIt) {
  BlockAllocator a(6);
  const auto t = ids(4, 5);
  std::vector<int32_t> first, second;
  ASSERT_TRUE(a.allocate(2, &first));
  ASSERT_TRUE(a.allocate(2, &second));
  Chain c1 = BlockAllocator::root(3), c2 = BlockAllocator::root(3);
  EXPECT_TRUE(a.register_block(first[0], std::span(t).subspan(0, 2), &c1));
  EXPECT_FALSE(a.register_block(second[0], std::span(t).subspan(0, 2), &c2));  // same contents
  EXPECT_EQ(c1.serial, c2.serial);
  // The second sequence's next block chains from the first's block 0.
  EXPECT_TRUE(a.register_block(second[1], std::span(t).subspan(2, 2), &c2));
  a.release(first);
  a.release(second);
  EXPECT_EQ(a.n_cached(), 2);  // first[0] and second[1]; second[0] went back to the free list
  Chain c = BlockAllocator::root(3);
  EXPECT_EQ(a.lookup(t, 2, 10, &c), (std::vector<int32_t>{first[0], second[1]}));
}

TEST(BlockCache, HashCollisionsNeverHandOutAnotherBlocksContents) {
  BlockAllocator a(8);
  a.set_hash_for_testing([](uint64_t, std::span<const int32_t>) { return uint64_t{42}; });
  const auto p = ids(4, 1), q = ids(4, 2);
  const auto bp = cache(a, p, 0);
  const auto bq = cache(a, q, 0);  // every key collides with p's
  Chain c = BlockAllocator::root(0);
  EXPECT_EQ(a.lookup(p, 2, 10, &c), bp);
  c = BlockAllocator::root(0);
  EXPECT_EQ(a.lookup(q, 2, 10, &c), bq);
  // p's first block then q's second: each exists, but not as parent and child.
  std::vector<int32_t> mixed = {p[0], p[1], q[2], q[3]};
  c = BlockAllocator::root(0);
  EXPECT_EQ(a.lookup(mixed, 2, 10, &c), (std::vector<int32_t>{bp[0]}));
  c = BlockAllocator::root(1);  // another salt: the same key, another chain
  EXPECT_TRUE(a.lookup(p, 2, 10, &c).empty());
  c = BlockAllocator::root(0);
  EXPECT_TRUE(a.lookup(ids(4, 3), 2, 10, &c).empty());
}

}  // namespace
}  // namespace ltm
