// Paged KV cache storage for this rank's layers and heads, and how many blocks a rank holds.
// (Which block a sequence gets is rank 0's business: runtime/sched/block_allocator.h.)
//
// Storage (every rank): per local layer, K and V each [n_blocks, n_head_local, block_size, d_k]
// (device memory), elements of `precision` (f32, or bf16/fp16: half the bytes to read per
// attention step and twice the tokens per megabyte). Which blocks a sequence uses is decided by the scheduler on rank 0 and sent in
// every step plan as a block table, so all ranks agree without talking.
// Threading: single-threaded (the step thread).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

#include "runtime/backend/backend.h"
#include "runtime/model/model_config.h"

namespace ltm {

class KvCache {
 public:
  KvCache(Backend& backend, int64_t n_layers_local, int64_t n_head_local, int64_t head_dim,
          int32_t block_size, int32_t n_blocks, Precision precision = Precision::kF32);
  void* k(int64_t layer) { return k_[layer].data(); }  // layer: index within this stage
  void* v(int64_t layer) { return v_[layer].data(); }
  int32_t block_size() const { return block_size_; }
  int32_t n_blocks() const { return n_blocks_; }
  Precision precision() const { return precision_; }

  // Bytes one block takes across `n_layers` layers, K and V.
  static int64_t block_bytes(int64_t n_layers, int64_t n_head_local, int64_t head_dim,
                             int32_t block_size, Precision precision = Precision::kF32);

 private:
  int32_t block_size_, n_blocks_;
  Precision precision_;
  std::vector<DeviceBuffer> k_, v_;
};

// Blocks needed to hold `n_tokens` tokens.
inline int32_t blocks_for(int64_t n_tokens, int32_t block_size) {
  return static_cast<int32_t>((n_tokens + block_size - 1) / block_size);
}

// The KV sizing policy: how many blocks every rank of a layout holds (the same count on every
// rank, sized for the stage with the most layers). `kv_memory_mb` is the per-rank budget
// (--kv-memory-mb); 0 means the default: 1024 MB when serving, else one full context (the
// one-shot command runs one sequence). A budget below one context is honoured when given (the
// scheduler preempts) but never chosen by default. InvalidArgument when the budget holds no
// block. Capped at 2^30 blocks.
struct KvSizing {
  int64_t n_layers_local = 0;  // layers of the largest stage (parallel::max_stage_layers)
  int64_t n_head_local = 0;
  int64_t head_dim = 0;
  int64_t n_positions = 0;     // the context length
  int32_t block_size = 16;
  int64_t kv_memory_mb = 0;
  bool serving = false;
  Precision precision = Precision::kF32;
};
absl::StatusOr<int32_t> plan_kv_blocks(const KvSizing& sizing);

}  // namespace ltm
