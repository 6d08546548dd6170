// What the coordinator's GetModelInfo reports: a fixed description of the model and deployment,
// filled once by the engine at start-up, plus a callback for the live numbers.
//
// Ownership: the coordinator (GrpcServer) keeps its own copy. `stats` is called from gRPC threads,
// possibly concurrently, for every GetModelInfo call, so it must be thread-safe and cheap (read a
// few atomics or take a short lock); it must stay callable for the lifetime of the server. When it
// is empty, the live numbers are reported as 0.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model/model_config.h"
#include "runtime/sched/adapters.h"

namespace ltm {

// Live numbers, sampled at the time of the call.
struct EngineStats {
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;   // cached ones included
  int64_t kv_blocks_cached = 0; // free blocks kept for prefix reuse (evicted when needed)
  int32_t kv_block_size = 0;    // tokens per KV block
  int32_t queue_depth = 0;      // requests waiting to be admitted
  int32_t running = 0;          // sequences in the running batch
  int64_t requests_served = 0;  // requests finished since start-up (any finish reason)
};

struct EngineInfo {
  std::string model_name;     // e.g. the checkpoint folder's name, "gpt2-medium"
  ModelConfig model;          // shape and vocabulary size, from the checkpoint
  int64_t context_length = 0; // tokens per sequence (prompt + generated); 0: model.n_positions
  int32_t tp = 1;             // tensor-parallel ranks per stage
  int32_t pp = 1;             // pipeline stages
  std::string dtype = "f32";  // the weights' element type as loaded: "f32", "bf16", "fp16"
  std::string kv_dtype = "f32";  // the KV cache's
  std::function<EngineStats()> stats;
  // LoRA adapters: the resident ones (thread-safe, cheap), and how to load or unload one (queues
  // the op; its done callback answers later, from another thread). Empty: the server has none.
  std::function<std::vector<AdapterStatus>()> adapters;
  std::function<void(AdapterOp)> adapter_op;
  std::string lora_dir;  // --lora-dir: where LoadAdapter finds adapters by name ("" = none)

  // The context the coordinator validates requests against.
  int64_t max_context() const { return context_length > 0 ? context_length : model.n_positions; }
};

}  // namespace ltm
