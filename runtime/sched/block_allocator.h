// Rank 0's KV cache blocks: which are free, which sequences hold which, and which full blocks
// are kept for reuse by later requests with the same prefix (automatic prefix caching). The
// scheduler decides which blocks a sequence uses and sends them in every step plan's block
// tables, so all ranks agree without talking.
//
// Prefix caching. A full block (block_size computed tokens) can be registered under a key
// chained from its parent's: key_i = hash(key_{i-1}, token ids of block i, salt), the salt being
// everything else that changes K/V (the adapter and its load, the KV dtype). A registered block
// stays cached after its sequences release it: with no holder it is on an LRU list, counted as
// free, and evicted (unregistered, oldest first) only when allocate() finds no plain free block.
// lookup() finds the longest run of cached blocks for a token list; a hit is trusted only when
// the block's own token ids, salt and parent match (every registration gets a fresh serial that
// its children record), so a 64-bit hash collision can never hand out wrong K/V. A held block
// is reference-counted: several sequences may read a cached block; none writes it (a sequence
// only writes positions after the blocks it reused).
// Threading: single-threaded (the scheduler's step thread).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace ltm {

class BlockAllocator {
 public:
  // A position in a chain of full blocks: the key and serial of the last block matched or
  // registered (the root: key = salt, serial = 0), and the chain's salt.
  struct Chain {
    uint64_t key = 0;
    uint64_t serial = 0;
    uint64_t salt = 0;
  };

  explicit BlockAllocator(int32_t n_blocks);
  int32_t n_total() const { return n_total_; }
  // Blocks allocate() can hand out: plain free ones plus cached ones nobody holds.
  int32_t n_free() const { return static_cast<int32_t>(free_.size() + lru_.size()); }
  int32_t n_cached() const { return static_cast<int32_t>(lru_.size()); }  // cached, unheld
  int32_t n_registered() const { return static_cast<int32_t>(by_key_.size()); }
  // Takes n blocks (refcount 1): the lowest free ids first, then cached ones evicted oldest
  // first. False (nothing taken) when short.
  bool allocate(int32_t n, std::vector<int32_t>* out);
  // Drops one reference to each block; a block nobody holds becomes free, or cached when it is
  // registered.
  void release(const std::vector<int32_t>& blocks);

  // The chain's root for `salt`.
  static Chain root(uint64_t salt) { return Chain{salt, 0, salt}; }
  // The longest run of registered blocks that continue `chain` with `tokens` (whole blocks of
  // block_size ids; a trailing partial block is ignored), at most max_blocks of them. Takes
  // nothing: acquire() the blocks to hold them. `chain` is advanced past the run.
  std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t block_size,
                              int32_t max_blocks, Chain* chain) const;
  // How many of `blocks` nobody holds (acquiring them takes that many from n_free()).
  int32_t n_unheld(const std::vector<int32_t>& blocks) const;
  // One more reference to each (cached, possibly unheld) block.
  void acquire(const std::vector<int32_t>& blocks);
  // Registers `block` (held, full, its K/V computed) as the child of `chain` holding `tokens`
  // (block_size ids), and advances `chain` to it. When an equal block is registered already,
  // `block` stays unregistered, `chain` advances to that one, and the answer is false. Keys
  // that collide are kept side by side (lookup tells them apart by their token ids).
  bool register_block(int32_t block, std::span<const int32_t> tokens, Chain* chain);

  // Tests: replaces the key hash (to force collisions).
  void set_hash_for_testing(std::function<uint64_t(uint64_t, std::span<const int32_t>)> h) {
    hash_ = std::move(h);
  }

 private:
  struct Block {
    int32_t refs = 0;
    bool registered = false;
    uint64_t key = 0, serial = 0, parent_serial = 0, salt = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru;  // valid when registered and refs == 0
  };
  uint64_t hash(uint64_t parent, std::span<const int32_t> tokens) const;
  const Block* find(uint64_t key, const Chain& parent, std::span<const int32_t> tokens) const;
  void evict(int32_t b);

  int32_t n_total_;
  // Min-heap of free ids (std::greater): the lowest free id comes out first, and a release costs
  // O(log n) per block instead of re-sorting the whole free list.
  std::vector<int32_t> free_;
  std::vector<Block> blocks_;
  std::list<int32_t> lru_;  // cached blocks nobody holds, least recently released first
  std::unordered_multimap<uint64_t, int32_t> by_key_;
  uint64_t next_serial_ = 1;
  std::function<uint64_t(uint64_t, std::span<const int32_t>)> hash_;
};

// A 64-bit hash of a string (adapter names in a chain's salt).
uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0);

}  // namespace ltm
