#include "runtime/sched/block_allocator.h"

#include <algorithm>
#include <functional>

#include "common/check.h"

namespace ltm {

namespace {

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = mix64(seed ^ (0x9e3779b97f4a7c15ull + n));
  for (size_t i = 0; i < n; ++i) h = mix64(h ^ (p[i] + 0x100ull * (i + 1)));
  return h;
}

BlockAllocator::BlockAllocator(int32_t n_blocks) : n_total_(n_blocks), blocks_(n_blocks) {
  free_.reserve(n_blocks);
  for (int32_t b = 0; b < n_blocks; ++b) free_.push_back(b);  // ascending: already a min-heap
}

uint64_t BlockAllocator::hash(uint64_t parent, std::span<const int32_t> tokens) const {
  if (hash_) return hash_(parent, tokens);
  uint64_t h = mix64(parent ^ 0x2545f4914f6cdd1dull);
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 1));
  return h;
}

void BlockAllocator::evict(int32_t b) {
  Block& blk = blocks_[b];
  auto [lo, hi] = by_key_.equal_range(blk.key);
  for (auto it = lo; it != hi; ++it)
    if (it->second == b) {
      by_key_.erase(it);
      break;
    }
  lru_.erase(blk.lru);
  blk.registered = false;
  blk.tokens.clear();
}

bool BlockAllocator::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n > n_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      std::pop_heap(free_.begin(), free_.end(), std::greater<int32_t>());
      b = free_.back();
      free_.pop_back();
    } else {
      b = lru_.front();  // the least recently used cached block
      evict(b);
    }
    blocks_[b].refs = 1;
    out->push_back(b);
  }
  return true;
}

void BlockAllocator::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    LTM_ASSERT(b >= 0 && b < n_total_, "block ", b, " out of range");
    Block& blk = blocks_[b];
    LTM_ASSERT(blk.refs > 0, "block ", b, " was released twice");
    if (--blk.refs > 0) continue;
    if (blk.registered) {
      blk.lru = lru_.insert(lru_.end(), b);
    } else {
      free_.push_back(b);
      std::push_heap(free_.begin(), free_.end(), std::greater<int32_t>());
    }
  }
}

const BlockAllocator::Block* BlockAllocator::find(uint64_t key, const Chain& parent,
                                                  std::span<const int32_t> tokens) const {
  auto [lo, hi] = by_key_.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    const Block& blk = blocks_[it->second];
    if (blk.parent_serial == parent.serial && blk.salt == parent.salt &&
        std::equal(tokens.begin(), tokens.end(), blk.tokens.begin(), blk.tokens.end()))
      return &blk;
  }
  return nullptr;
}

std::vector<int32_t> BlockAllocator::lookup(std::span<const int32_t> tokens, int32_t block_size,
                                            int32_t max_blocks, Chain* chain) const {
  std::vector<int32_t> out;
  const int32_t whole = static_cast<int32_t>(tokens.size()) / block_size;
  for (int32_t i = 0; i < std::min(whole, max_blocks); ++i) {
    const auto ids = tokens.subspan(static_cast<size_t>(i) * block_size, block_size);
    const uint64_t key = hash(chain->key, ids);
    const Block* blk = find(key, *chain, ids);
    if (blk == nullptr) break;
    out.push_back(static_cast<int32_t>(blk - blocks_.data()));
    *chain = Chain{key, blk->serial, chain->salt};
  }
  return out;
}

int32_t BlockAllocator::n_unheld(const std::vector<int32_t>& blocks) const {
  int32_t n = 0;
  for (int32_t b : blocks) n += blocks_[b].refs == 0;
  return n;
}

void BlockAllocator::acquire(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    Block& blk = blocks_[b];
    LTM_ASSERT(blk.registered, "block ", b, " is not cached");
    if (blk.refs++ == 0) lru_.erase(blk.lru);
  }
}

bool BlockAllocator::register_block(int32_t block, std::span<const int32_t> tokens, Chain* chain) {
  const uint64_t key = hash(chain->key, tokens);
  if (const Block* same = find(key, *chain, tokens)) {
    *chain = Chain{key, same->serial, chain->salt};
    return false;
  }
  Block& blk = blocks_[block];
  LTM_ASSERT(blk.refs > 0 && !blk.registered, "block ", block, " cannot be registered");
  blk.registered = true;
  blk.key = key;
  blk.serial = next_serial_++;
  blk.parent_serial = chain->serial;
  blk.salt = chain->salt;
  blk.tokens.assign(tokens.begin(), tokens.end());
  by_key_.emplace(key, block);
  *chain = Chain{key, blk.serial, chain->salt};
  return true;
}

}  // namespace ltm
