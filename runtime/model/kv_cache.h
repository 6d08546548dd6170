// Paged KV cache storage for this rank's layers and heads, and how many blocks a rank holds.
// (Which block a sequence gets is rank 0's business: runtime/sched/block_allocator.h.)
//
// Storage (every rank): per local layer, K and V each [n_blocks, n_head_local, block_size, d_k]
// (n_head_local: the rank's KV heads, Model::n_kv_head_local: fewer than its query heads under
// grouped-query attention)
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
          int32_t block_size, int32_t n_blocks, Precision precision = Precision::kF32,
          bool resident = false);
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
// (--kv-memory-mb); 0 means the default:
// - serving on a GPU (device_memory_bytes > 0): gpu_kv_budget_bytes below, the memory left after
//   weights, activations, CUDA graphs and the runtime, times --gpu-memory-fraction;
// - serving on the CPU: 1024 MB (host memory is shared with everything else on the machine);
// - one-shot: one full context (the command runs one sequence).
// A budget below one context is honoured when given (the scheduler preempts) but never chosen by
// default. InvalidArgument when the budget holds no block. Capped at 2^30 blocks.
// ltm-worker (launcher/model_setup.cpp) and ltm-plan (capacity_plan.cpp) both size with this, so
// the plan and the worker's memory report show the same figure.
struct KvSizing {
  int64_t n_layers_local = 0;  // layers of the largest stage (parallel::max_stage_layers)
  int64_t n_head_local = 0;   // KV heads of the rank (Model::n_kv_head_local)
  int64_t head_dim = 0;
  int64_t n_positions = 0;     // the context length
  int32_t block_size = 16;
  int64_t kv_memory_mb = 0;
  bool serving = false;
  Precision precision = Precision::kF32;
  // The device, for the GPU default. 0: a CPU rank.
  int64_t device_memory_bytes = 0;  // the GPU's memory (cudaMemGetInfo's total)
  double gpu_memory_fraction = 0.9; // --gpu-memory-fraction
  int64_t weight_bytes = 0;         // the rank's weights (the largest stage's)
  int64_t activation_bytes = 0;     // gpu_activation_bytes
  int64_t graph_bytes = 0;          // kGpuGraphBytes
  int64_t overhead_bytes = 0;       // kGpuRuntimeBytes
  // Rank 0's draft model on its GPU (--draft-device device, capacity_plan.h's
  // draft_device_bytes), taken off every rank's budget: the ranks hold the same blocks.
  int64_t draft_bytes = 0;
};

// What a GPU rank holds besides weights and KV cache, as both the worker and the plan count it:
// the CUDA context, cuBLAS(Lt) workspaces and NCCL's buffers (kGpuRuntimeBytes, the figure the
// plan's device table has always used), and the captured decode graphs' executables (their
// buffers are the activation workspace, sized for the largest bucket: nothing allocated in
// capture).
inline constexpr int64_t kGpuRuntimeBytes = int64_t{2} << 30;
inline constexpr int64_t kGpuGraphBytes = int64_t{256} << 20;

// The activations of one step on a rank: `max_tokens` rows (--max-batch-tokens) through the
// widest layer of this rank's shard (the residual stream, its LayerNorm, Q/K/V, attention's
// output and the 4d MLP, f32) and the last rows' logits over this rank's vocabulary slice (one
// per sequence, at most `max_sequences`), twice over (the forward pass keeps its inputs while
// writing outputs, and the workspace is double-buffered for the pipeline).
int64_t gpu_activation_bytes(int64_t n_embd, int64_t n_inner, int64_t vocab_padded, int tp,
                             int64_t max_tokens, int64_t max_sequences);
// With int8 weights on a GPU, what a GEMM of more than a few rows dequantizes its weight into
// (kernels/cuda/int8_gemm.h): fp16 copies of the largest matrix of a rank, at most
// max(3 d^2, 2 d d_ff, vocab d) / tp elements (QKV, a SwiGLU's fused gate and up, the head).
int64_t gpu_int8_scratch_bytes(int64_t n_embd, int64_t n_inner, int64_t vocab_padded, int tp);

// fraction x (device memory - weights - activations - graphs - runtime - draft), at least 0.
int64_t gpu_kv_budget_bytes(const KvSizing& sizing);

absl::StatusOr<int32_t> plan_kv_blocks(const KvSizing& sizing);

}  // namespace ltm
