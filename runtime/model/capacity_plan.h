// Capacity planning (ltm-plan): for a model, a device kind, a weight dtype and a world size, what
// every tp x pp layout holds per rank and how fast it should run, and which layout to use.
//
// Memory figures come from the functions the worker itself sizes with (weight_bytes_per_rank,
// parallel::stage_layers / max_stage_layers, plan_kv_blocks, KvCache::block_bytes), so that the
// plan and ltm-worker's start-up memory report agree by construction; what the plan adds is a
// per-rank runtime overhead (libraries, thread pools, load buffers) taken from the device table.
//
// Time figures are a roofline per pipeline stage, max(bytes read / memory bandwidth, FLOPs /
// FLOP rate), plus an all-reduce cost model: each of the two all-reduces per block (after
// attention's W^O and after the second FFN matrix; one more for the embedding lookup) costs
// latency + 2 (tp - 1) / tp x bytes / link bandwidth (a ring all-reduce moves that share of the
// payload in and out of every rank); a pipeline hop costs latency + activation bytes / link
// bandwidth. One sequence (or one decode batch) goes through the stages one after the other, so
// the stages' times add up.
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/backend/backend.h"
#include "runtime/model/model_config.h"

namespace ltm {

class Checkpoint;

// One device kind. Per device (one GPU, or the whole host for "cpu"), except where noted.
struct DeviceSpec {
  std::string name;
  int64_t memory_bytes = 0;          // device (or host) memory
  double memory_bandwidth = 0;       // bytes/s, reading
  double flops_f32 = 0;              // FLOP/s of GEMMs with f32 weights
  double flops_16 = 0;               // FLOP/s of GEMMs with bf16/fp16 weights
  double link_bandwidth = 0;         // bytes/s per direction between devices of one node
  double link_latency_s = 0;         // one collective or message between them
  double network_bandwidth = 0;      // bytes/s per device between nodes
  double network_latency_s = 0;
  int devices_per_node = 8;          // a TP group wider than this crosses the network
  int64_t overhead_bytes = 0;        // per rank, besides weights and KV cache
  double usable_fraction = 1.0;      // of memory_bytes the plan may fill
  // True for "cpu": every rank of the world runs on this one host and shares its memory,
  // bandwidth and FLOP rate equally (a rank gets 1/world of each).
  bool shared_by_ranks = false;
  std::string source;                // where each figure comes from
};

// The built-in table: "cpu" (this machine, as measured by ltm-bench), "a100-80gb", "h100-sxm",
// "h200" (NVIDIA's data sheets). Names are matched case-insensitively.
const std::vector<DeviceSpec>& builtin_devices();
std::optional<DeviceSpec> find_device(const std::string& name);

// --speculative draft: the draft model rank 0 holds beside its share of the target, on its CPU
// or (--draft-device device) on its GPU (runtime/spec/draft_model.h): its weights, whole, and a
// paged KV cache of its own with a full context for each of max_sequences sequences.
// DraftModelProposer::load sizes itself with draft_memory, so the plan and the worker's memory
// report agree by construction.
struct DraftMemory {
  Precision weights = Precision::kF32;  // the checkpoint's 16-bit type, else f32
  Precision kv = Precision::kF32;       // f32 with f32 weights, else fp16 (as the target's default)
  int64_t parameters = 0;
  int64_t weight_bytes = 0;
  int32_t max_sequences = 0;
  int32_t kv_blocks = 0;
  int64_t kv_bytes = 0;
  // On a GPU (--draft-device device, draft_device_bytes): its activations and its backend's
  // workspaces too. 0 on a CPU.
  int64_t device_extra_bytes = 0;
  int64_t total_bytes() const { return weight_bytes + kv_bytes; }
  int64_t held_bytes() const { return total_bytes() + device_extra_bytes; }  // all it holds
};
// The sequences whose draft K/V rank 0 keeps at once: those that speculate at once
// (--spec-max-batch, at most --max-running) and one more (a state dropped is recomputed).
int32_t draft_max_sequences(int32_t spec_max_batch, int32_t max_running);
DraftMemory draft_memory(const ModelConfig& draft, Precision weights, int32_t block_size,
                         int32_t max_sequences);
// The draft's weight type as DraftModelProposer::load picks it: a checkpoint folder's 16-bit
// type (of its token embedding), else f32 (a config .json: random f32 weights). InvalidArgument
// naming --draft-model when the folder's checkpoint cannot be read.
absl::StatusOr<Precision> draft_weight_precision(const std::string& dir, const ModelConfig& draft);
// The same for a checkpoint already open (DraftModelProposer::load).
Precision draft_weight_precision(const Checkpoint& ckpt, const ModelConfig& draft);
// What the draft's own backend on a GPU holds besides weights and KV cache: cuBLAS(Lt)
// workspaces and scratch (the CUDA context is the process's, counted in kGpuRuntimeBytes).
inline constexpr int64_t kGpuDraftRuntimeBytes = int64_t{256} << 20;
// The draft's bytes on rank 0's GPU (--draft-device device): m.total_bytes(), the activations of
// a pass over every kept sequence's whole context (a sequence's first pass runs its prompt
// whole) and kGpuDraftRuntimeBytes. The worker reserves them before it sizes the target's KV
// cache (KvSizing::draft_bytes), and ltm-plan counts them against rank 0's memory.
int64_t draft_device_bytes(const ModelConfig& draft, const DraftMemory& m);
// draft_device_bytes less m.total_bytes(): the activations and workspaces alone.
int64_t draft_device_extra_bytes(const ModelConfig& draft, const DraftMemory& m);

struct PlanInput {
  ModelConfig config;
  DeviceSpec device;
  Precision weights = Precision::kF32;
  Precision kv = Precision::kF32;
  int world_size = 1;
  int64_t context = 0;          // tokens of context for the decode estimate and capacity (0: n_positions)
  int batch = 32;               // sequences decoded together: throughput estimate, recommendation
  int64_t prefill_chunk = 512;  // prompt tokens per prefill step (--max-batch-tokens)
  // What ltm-worker would allocate for the KV cache (plan_kv_blocks): --kv-memory-mb, --block-size,
  // serving (--listen) or one-shot.
  int64_t kv_memory_mb = 0;
  int32_t block_size = 16;
  bool serving = true;
  // --kv-resident: on a device shared by the ranks (the CPU) the worker's KV cache is resident
  // from start-up, so resident_at_load_bytes counts it (no effect on a GPU).
  bool kv_resident = false;
  // On a GPU (a device not shared_by_ranks) the worker's default KV budget (kv_cache.h,
  // gpu_kv_budget_bytes): --gpu-memory-fraction, and --max-running for the activations.
  double gpu_memory_fraction = 0.9;
  int max_running = 64;
  // --speculative draft --draft-model DIR: rank 0 also holds the draft (draft_memory with
  // draft_weights and draft_max_sequences(spec_max_batch, max_running), block_size). On a device
  // shared by the ranks (cpu) it counts against rank 0's share of memory; on a GPU, with
  // draft_on_device (--draft-device device), against rank 0's GPU (draft_device_bytes, reserved
  // before the KV cache as the worker does), else it lives in rank 0's host memory (the draft runs
  // on the CPU) and is reported, not counted against the GPU.
  bool draft = false;
  ModelConfig draft_config;
  Precision draft_weights = Precision::kF32;
  bool draft_on_device = false;
  int spec_max_batch = 4;
};

struct StagePlan {
  int pp_rank = 0;
  int64_t layers = 0;
  int64_t weight_bytes = 0;          // per rank of this stage
  int64_t worker_kv_bytes = 0;       // what ltm-worker allocates for this stage's layers
  int64_t resident_at_load_bytes = 0;  // weights + overhead (+ the KV cache: kv_resident)
  double flops_per_token = 0;        // per rank, decode at the context
  double decode_compute_s = 0;       // per step, this stage's roofline (no communication)
  double prefill_compute_s = 0;      // per prefill chunk
};

struct LayoutPlan {
  int tp = 1, pp = 1;
  std::string invalid;               // non-empty: why this layout cannot run (then nothing else is set)
  std::vector<StagePlan> stages;
  int64_t weight_bytes_per_rank = 0; // the largest stage's
  int64_t kv_bytes_per_token = 0;    // per rank, on the stage with the most layers
  int64_t memory_per_rank = 0;       // what a rank may use (device memory x usable fraction, shared)
  int64_t kv_tokens_fit = 0;         // tokens of KV cache that fit beside the weights (0: none)
  int64_t batch_at_context = 0;      // sequences of `context` tokens that fit
  bool fits = false;                 // weights + overhead + one context of KV fit
  // With a draft counted against rank 0 (PlanInput::draft on a shared device): the layout fits
  // without it but not with it, i.e. the draft is what pushes rank 0 over its memory.
  bool draft_pushes_over = false;
  // What ltm-worker allocates for this layout with the input's KV settings.
  int32_t worker_kv_blocks = 0;
  int64_t worker_kv_bytes = 0;       // per rank (the largest stage)
  // Resident memory per rank (largest stage): at start-up, weights + overhead (the KV cache is
  // allocated but its pages become resident only as sequences fill them, unless
  // PlanInput::kv_resident on the CPU: then it is counted too); with the worker's
  // whole KV cache in use, + worker_kv_bytes. On a shared device with a draft, rank 0's figures
  // (stage 0) include the draft's weights (at start-up) and its weights and KV cache (full).
  int64_t resident_at_load_bytes = 0;
  int64_t resident_bytes = 0;
  // Rank 0's bytes in all: its stage's weights and worker KV cache, plus the draft's weights and
  // KV cache when there is one (wherever it lives), without the runtime overhead.
  int64_t rank0_bytes = 0;
  double flops_per_token = 0;        // per rank (largest stage)
  int64_t allreduce_payload_bytes = 0;    // the two all-reduces of one block, one token: 2 x d x 4
  double allreduce_bytes_moved = 0;       // per rank: payload x 2 (tp - 1) / tp
  bool tp_crosses_nodes = false;
  double comm_s_per_step = 0;        // decode, one sequence: all-reduces + pipeline hops
  double decode_s_per_token = 0;     // decode, one sequence: time per token (stages in turn)
  double decode_tokens_per_s_batch = 0;  // `batch` sequences in min(pp, batch) micro-batches
  double prefill_s_per_token = 0;
  std::string bound;                 // "memory bandwidth", "compute" or "communication" (decode)
};

struct Plan {
  PlanInput input;
  int64_t context = 0;
  int64_t parameters = 0;            // exact
  int64_t parameters_12ld2 = 0;      // 12 n_layer d^2
  double flops_per_token = 0;        // whole model, one token at the context (2 per weight + attention)
  std::vector<LayoutPlan> layouts;   // every tp x pp = world, tp ascending
  bool has_draft = false;            // PlanInput::draft
  DraftMemory draft;                 // its figures
  bool draft_counted = false;        // against rank 0's memory share (a shared device)
  int recommended = -1;              // index into layouts; -1: none fits
  std::string reason;
};

// InvalidArgument for a world size < 1, a batch < 1 or a device without its figures.
absl::StatusOr<Plan> make_plan(const PlanInput& input);

std::string plan_text(const Plan& plan);
std::string plan_json(const Plan& plan);  // one JSON object

}  // namespace ltm
