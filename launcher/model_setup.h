// Everything a rank holds once started: the MPI world and groups, the backend, this rank's model
// slices, the KV cache and the engine. Shared by ltm-worker and ltm-bench.
#pragma once

#include <array>
#include <memory>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/worker_options.h"
#include "parallel/world.h"
#include "runtime/backend/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/model/dtype.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/lora.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"

namespace ltm {

struct RankSetup {
  std::unique_ptr<parallel::MpiWorld> world;
  std::unique_ptr<Backend> backend;
  // The device communicators of the TP and PP groups (runtime/engine/engine.h, Comms): set by
  // setup_rank; they point at world's MPI communicators on the CPU backend, else at these.
  std::unique_ptr<parallel::Communicator> tp_device_owned, pp_device_owned;
  parallel::Communicator* tp_device = nullptr;
  parallel::Communicator* pp_device = nullptr;
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Engine> engine;
  int32_t n_blocks = 0;
  std::optional<DType> checkpoint_dtype;  // of wte.weight; none for a config-only model
  Precision kv_precision = Precision::kF32;
  int threads = 1;
  int device_index = 0;  // the GPU of this rank with --device cuda (local rank modulo the GPUs)
  double load_seconds = 0;
  std::vector<uint64_t> bytes_read_per_rank;  // checkpoint bytes each world rank read
  // This rank's memory once loaded: weights and KV cache as allocated, and the resident set
  // (the KV cache's pages are counted once used), now and at its peak so far.
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t resident_bytes = 0;
  uint64_t peak_resident_bytes = 0;
  // The four figures above of every world rank, gathered at load (rank order).
  std::vector<std::array<uint64_t, 4>> memory_per_rank;
  std::optional<LoraSummary> merged_lora;  // --lora-merge: the adapter in the weights
  // engine, cache and model go first, then the device communicators, the backend and the world
  // (MPI_Finalize)
  ~RankSetup();
};

// The element types of the weights and the KV cache for these flags and this checkpoint
// (see WorkerOptions::weight_dtype / kv_dtype), on a backend whose activations for given weights
// are `activations(weights)` (Backend::activation_precision): the cache's default is
// default_kv_precision's.
struct Precisions {
  Precision weights = Precision::kF32;
  Precision kv = Precision::kF32;
};
absl::StatusOr<Precisions> choose_precisions(
    const WorkerOptions& o, std::optional<DType> checkpoint_dtype,
    const std::function<Precision(Precision)>& activations);

// Starts MPI, checks the layout against the model before reading any weight (InvalidArgument
// naming the numbers), loads this rank's slices and sizes the KV cache. Errors: InvalidArgument
// for bad flags/layouts/configs, other codes for unreadable or corrupt checkpoints.
absl::StatusOr<std::unique_ptr<RankSetup>> setup_rank(const WorkerOptions& options, int* argc,
                                                      char*** argv);

// "rank 0 (tp 0, pp 0): weights 498.0 MiB, KV cache 72.0 MiB (48 blocks of 16 tokens), resident
// 590.1 MiB (peak 602.3 MiB)": the start-up memory report of a rank.
// With prefix_cache, the KV part says that free blocks may hold cached prefixes (a server's
// ltm_kv_blocks_cached and GetModelInfo's kv_blocks_cached count them as it runs).
std::string memory_report(const RankSetup& rs, int block_size, bool prefix_cache = false);

// The model config named by --model: DIR/config.json, or a .json file (random weights).
absl::StatusOr<ModelConfig> load_config_for(const std::string& model);

}  // namespace ltm
