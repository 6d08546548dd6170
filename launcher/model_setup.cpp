#include "launcher/model_setup.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/memory.h"
#include "common/check.h"
#include "common/logging.h"
#include "parallel/devsim_communicator.h"
#include "parallel/partition.h"
#ifdef LTM_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif
#include "runtime/backend/devsim_backend.h"
#include "launcher/lora_setup.h"
#include "runtime/model/capacity_plan.h"
#include "runtime/model/load_guard.h"
#include "runtime/model/load_progress.h"

namespace ltm {

RankSetup::~RankSetup() {
  engine.reset();
  cache.reset();
  model.reset();
  source.reset();
  tp_device = pp_device = nullptr;
  tp_device_owned.reset();  // NCCL's finalize is collective, like the MPI communicators' frees
  pp_device_owned.reset();
  backend.reset();
  world.reset();
}

absl::StatusOr<ModelConfig> load_config_for(const std::string& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(model, ec)) return load_model_config((fs::path(model) / "config.json").string());
  if (fs::is_regular_file(model, ec)) return load_model_config(model);
  return absl::NotFoundError(absl::StrCat("--model ", model, ": no such folder or config file"));
}

absl::StatusOr<Precisions> choose_precisions(
    const WorkerOptions& o, std::optional<DType> checkpoint_dtype,
    const std::function<Precision(Precision)>& activations) {
  Precisions p;
  if (!o.weight_dtype.empty()) {
    if (!parse_precision(o.weight_dtype, &p.weights))
      return absl::InvalidArgumentError(absl::StrCat("--weight-dtype '", o.weight_dtype, "'"));
  } else if (checkpoint_dtype == DType::kBF16) {
    p.weights = Precision::kBF16;
  } else if (checkpoint_dtype == DType::kF16) {
    p.weights = Precision::kF16;
  }
  if (!o.kv_dtype.empty()) {
    if (!parse_precision(o.kv_dtype, &p.kv) || p.kv == Precision::kInt8)
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-dtype '", o.kv_dtype, "' (f32, bf16 or fp16)"));
  } else {
    p.kv = default_kv_precision(p.weights, activations(p.weights));
  }
  return p;
}

namespace {

int local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

// The device communicator of one group over its host one `host` (engine.h, Comms): `host`
// itself when the backend computes in host memory (CPU), the devsim communicator over it on the
// emulated device, NCCL on a device backend (a group of one needs none: a SoloCommunicator).
absl::StatusOr<std::unique_ptr<parallel::Communicator>> device_comm(
    const WorkerOptions& o, Backend& backend, parallel::MpiCommunicator& host, int device,
    const parallel::WatchdogOptions& wopts) {
  if (!backend.comm_on_device()) return nullptr;  // use `host`
  if (o.device == "devsim") {
    auto* sim = static_cast<DevsimBackend*>(&backend);
    return std::make_unique<parallel::DevsimCommunicator>(
        host, [sim](const void* p, size_t bytes) { return sim->owns(p, bytes); },
        [sim] { sim->synchronize(); },
        [sim](std::function<void()> op) { return sim->record_if_capturing(std::move(op)); });
  }
  if (host.size() == 1) return std::make_unique<parallel::SoloCommunicator>(host.name());
#ifdef LTM_HAVE_NCCL
  return std::make_unique<parallel::NcclCommunicator>(host, device, backend.stream(), wopts);
#else
  (void)device;
  (void)wopts;
  return absl::UnimplementedError(absl::StrCat(
      "--device ", o.device, " with more than one rank in a group needs NCCL; this ltm was built "
      "without it"));
#endif
}

// --draft-device device on a GPU: what rank 0's draft model will hold on its GPU
// (draft_device_bytes), taken off every rank's KV budget as ltm-plan does (the ranks hold the
// same blocks). Rank 0 reads the draft's config (the other ranks may not see its folder) and
// every rank takes its figure; an error of rank 0's is every rank's, after the exchange.
absl::StatusOr<int64_t> reserve_draft_device_bytes(const WorkerOptions& o,
                                                   parallel::MpiWorld& world) {
  absl::Status error;
  int64_t mine = 0;
  if (world.rank() == 0) {
    absl::StatusOr<ModelConfig> c = load_config_for(o.draft_model);
    absl::StatusOr<Precision> w =
        c.ok() ? draft_weight_precision(o.draft_model, *c)  // its errors name --draft-model
               : absl::InvalidArgumentError(
                     absl::StrCat("--draft-model ", o.draft_model, ": ", c.status().message()));
    if (w.ok()) {
      const DraftMemory m = draft_memory(*c, *w, o.block_size,
                                         draft_max_sequences(o.spec_max_batch, o.max_running));
      mine = draft_device_bytes(*c, m);
    } else {
      error = w.status();
      mine = -1;
    }
  }
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.world().all_gather(&mine, all.data(), sizeof(int64_t));
  if (!error.ok()) return error;
  if (all[0] < 0) return absl::InvalidArgumentError("rank 0 could not read --draft-model");
  return all[0];
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankSetup>> setup_rank(const WorkerOptions& o, int* argc,
                                                      char*** argv) {
  const auto t0 = std::chrono::steady_clock::now();
  auto rs = std::make_unique<RankSetup>();
  parallel::WatchdogOptions wopts;
  wopts.timeout_s = o.collective_timeout_s;
  rs->world = std::make_unique<parallel::MpiWorld>(argc, argv, wopts);
  set_log_rank(rs->world->rank());

  // The model's shape first: a layout that cannot work is refused before any weight is read.
  LTM_ASSIGN_OR_RETURN(ModelConfig config, load_config_for(o.model));
  LTM_RETURN_IF_ERROR(parallel::validate_layout(rs->world->size(), o.tp, o.pp, config.n_head,
                                                config.kv_heads(), config.n_layer, config.n_inner));
  LTM_ASSIGN_OR_RETURN(parallel::WorldLayout layout, rs->world->create_groups(o.tp, o.pp));

  rs->threads = o.threads > 0 ? o.threads
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                                local_ranks());
  const int device = layout.rank % std::max(1, local_ranks());
  rs->device_index = device;
  if (o.device == "cuda") {
    std::string error;
    rs->backend = make_cuda_backend(device, &error);
    if (!rs->backend) return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", error));
  } else if (o.device == "devsim") {
    rs->backend = make_devsim_backend(rs->threads);  // the emulated device (tests only)
  } else {
    rs->backend = make_cpu_backend(rs->threads);
  }
  if (!o.cuda_graphs.empty() && o.cuda_graphs != "on" && o.cuda_graphs != "off")
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-graphs must be on or off, not '", o.cuda_graphs, "'"));
  if (o.cuda_graphs == "on" && !rs->backend->supports_graphs())
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda-graphs on needs --device cuda: the ", o.device,
        " backend runs each op as it is called and has no graphs to capture"));
  // Two communicators per group: the host ones (world's MPI) and the device ones for activations.
  LTM_ASSIGN_OR_RETURN(rs->tp_device_owned,
                       device_comm(o, *rs->backend, rs->world->tp(), device, wopts));
  LTM_ASSIGN_OR_RETURN(rs->pp_device_owned,
                       device_comm(o, *rs->backend, rs->world->pp(), device, wopts));
  rs->tp_device = rs->tp_device_owned ? rs->tp_device_owned.get() : &rs->world->tp();
  rs->pp_device = rs->pp_device_owned ? rs->pp_device_owned.get() : &rs->world->pp();

  ShardSpec shard{o.tp, layout.tp_rank(), o.pp, layout.pp_rank()};
  std::error_code ec;
  // --init random: the folder's shape (config.json) with random weights; its files are not read.
  const bool folder = std::filesystem::is_directory(o.model, ec) && o.init != "random";
  if (o.init == "checkpoint" && !folder)
    return absl::InvalidArgumentError(absl::StrCat(
        "--init checkpoint: --model ", o.model, " is a config file, not a checkpoint folder"));
  std::optional<Checkpoint> ckpt;
  std::vector<FileStamp> stamps;
  if (folder) {
    stamps = stamp_checkpoint_files(o.model);  // before opening: a change while loading shows
    LTM_ASSIGN_OR_RETURN(Checkpoint opened, Checkpoint::open(o.model));
    rs->checkpoint_dtype =
        opened.dtype(config.is_llama() ? "model.embed_tokens.weight" : "wte.weight");
    spdlog::info("opened checkpoint {}: {} layers, n_embd {}, vocab {}, {} weights",
                 o.model, config.n_layer, config.n_embd, config.vocab_size,
                 dtype_name(*rs->checkpoint_dtype));
    ckpt.emplace(std::move(opened));
  }
  const Backend& backend = *rs->backend;
  LTM_ASSIGN_OR_RETURN(
      const Precisions precisions,
      choose_precisions(o, rs->checkpoint_dtype,
                        [&](Precision w) { return backend.activation_precision(w); }));
  if (!rs->backend->supports(precisions.weights, precisions.kv))
    return absl::InvalidArgumentError(absl::StrCat(
        "--weight-dtype ", precision_name(precisions.weights), " --kv-dtype ",
        precision_name(precisions.kv), ": ", rs->backend->describe(),
        " does not hold weights and caches of these types"));
  rs->kv_precision = precisions.kv;
  if (config.is_llama() && !rs->backend->supports_llama())
    return absl::InvalidArgumentError(absl::StrCat(
        o.model, " is a ", config.architecture, " (Llama family): --device ", o.device,
        " has no RMSNorm/RoPE/SwiGLU kernels yet; run it with --device cpu"));
  if (int64_t max_dim = 0; !rs->backend->supports_head_dim(config.head_dim(), &max_dim))
    return absl::InvalidArgumentError(absl::StrCat(
        o.model, ": n_head ", config.n_head, " makes heads of ", config.head_dim(),
        " dimensions (n_embd ", config.n_embd, " / n_head, or head_dim); the attention kernels of ",
        rs->backend->describe(), " take at most ", max_dim,
        max_dim > 128 ? " (a multiple of 4 above 128 on cuda)" : ""));
  // Weights that would not fit in memory are refused before anything is allocated.
  const int64_t expected_bytes = weight_bytes_per_rank(config, shard, precisions.weights);
  if (o.device != "cuda")  // the CPU backend, or the emulated device over it
    LTM_RETURN_IF_ERROR(check_host_memory(expected_bytes, local_ranks(), available_host_memory()));
  std::unique_ptr<WeightSource> inner;
  if (folder) {
    inner = make_checkpoint_source(std::make_shared<const Checkpoint>(std::move(*ckpt)), o.model);
  } else {
    inner = make_random_source(config, o.init_seed, o.init_std);
  }
  // Progress of the read (a status line on rank 0's terminal, else one line when done).
  inner = make_progress_source(
      std::move(inner),
      static_cast<uint64_t>(weight_bytes_per_rank(config, shard, Precision::kF32) / 4),
      rs->checkpoint_dtype ? static_cast<int>(dtype_size(*rs->checkpoint_dtype)) : 4,
      rs->world->rank() == 0 && stderr_is_terminal());
  ProgressSource* progress = static_cast<ProgressSource*>(inner.get());
  // Every weight is copied at load (none used in place), so a checkpoint file that is truncated
  // or rewritten later cannot SIGBUS a serving rank (runtime/model/load_guard.h).
  std::unique_ptr<GuardedSource> guarded = make_guarded_source(std::move(inner), o.check_weights);
  const GuardedSource* guard = guarded.get();
  rs->source = std::move(guarded);
  ModelOptions mopts;
  mopts.weights = precisions.weights;
  std::optional<LoraAdapter> merge;
  if (o.lora_merge) {  // --lora-merge: W += s A^T B^T for this rank's slices, at load
    for (const LoraSpec& spec : lora_specs(o)) {
      LTM_ASSIGN_OR_RETURN(LoraAdapter a, LoraAdapter::open(spec.dir, config, o.lora_max_rank));
      rs->merged_lora = LoraSummary{a.rank(), a.alpha(), a.modules()};
      merge.emplace(std::move(a));
    }
    mopts.merge = &*merge;
  }
  try {
    LTM_ASSIGN_OR_RETURN(rs->model,
                         Model::load(*rs->source, *rs->backend, shard, *rs->tp_device, mopts));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory while loading the weights (", expected_bytes, " bytes on this rank)"));
  }
  progress->finish();
  LTM_RETURN_IF_ERROR(guard->status());
  LTM_RETURN_IF_ERROR(verify_unchanged(stamps));

  const uint64_t my_bytes = rs->source->bytes_read();
  rs->bytes_read_per_rank.resize(rs->world->size());
  rs->world->world().all_gather(&my_bytes, rs->bytes_read_per_rank.data(), sizeof(uint64_t));
  // Every weight has been copied into the backend's memory (Model::load): close the checkpoint,
  // so that its mapping holds no memory and a file changed on disk cannot reach this rank.
  rs->source.reset();
  rs->weight_bytes = rs->model->weight_bytes();

  // KV cache: the same block count on every rank (runtime/model/kv_cache.h, plan_kv_blocks).
  KvSizing sizing;
  sizing.n_layers_local = parallel::max_stage_layers(config.n_layer, config.vocab_size,
                                                     config.n_embd, o.pp);
  sizing.n_head_local = rs->model->n_kv_head_local();  // the cache holds KV heads
  sizing.head_dim = config.head_dim();
  sizing.n_positions = config.n_positions;
  // --perplexity runs windows of up to n_positions tokens (+ the one sampled after each), 8 at a
  // time by default: size the one-shot cache for that.
  if (!o.perplexity.empty()) sizing.n_positions = 8 * (config.n_positions + o.block_size);
  sizing.block_size = o.block_size;
  sizing.kv_memory_mb = o.kv_memory_mb;
  sizing.serving = !o.listen.empty();
  sizing.precision = rs->kv_precision;
  if (const int64_t device_memory = rs->backend->device_memory_bytes(); device_memory > 0) {
    // A GPU: the same inputs as ltm-plan's (capacity_plan.cpp), the largest stage's weights.
    sizing.device_memory_bytes = device_memory;
    sizing.gpu_memory_fraction = o.gpu_memory_fraction;
    for (int s = 0; s < o.pp; ++s)
      sizing.weight_bytes = std::max(sizing.weight_bytes,
                                     weight_bytes_per_rank(config, ShardSpec{o.tp, 0, o.pp, s},
                                                           precisions.weights));
    sizing.activation_bytes = gpu_activation_bytes(
        config.n_embd, config.n_inner, parallel::padded_vocab(config.vocab_size, o.tp), o.tp,
        o.max_batch_tokens, o.max_running);
    if (precisions.weights == Precision::kInt8)
      sizing.activation_bytes += gpu_int8_scratch_bytes(
          config.n_embd, config.n_inner, parallel::padded_vocab(config.vocab_size, o.tp), o.tp);
    sizing.graph_bytes = kGpuGraphBytes;
    sizing.overhead_bytes = kGpuRuntimeBytes;
    if (o.speculative == "draft" && o.draft_device == "device") {
      LTM_ASSIGN_OR_RETURN(sizing.draft_bytes, reserve_draft_device_bytes(o, *rs->world));
    }
  }
  LTM_ASSIGN_OR_RETURN(rs->n_blocks, plan_kv_blocks(sizing));
  rs->kv_bytes = static_cast<uint64_t>(rs->n_blocks) *
                 KvCache::block_bytes(rs->model->layers().size(), rs->model->n_kv_head_local(),
                                      config.head_dim(), o.block_size, rs->kv_precision);
  // --kv-resident on host memory: the whole cache is faulted in below, so it must fit now. Every
  // rank checks once all have loaded their weights and before any cache is resident (a rank's
  // resident cache would count against the others' MemAvailable twice), and none goes on unless
  // all passed.
  const bool kv_resident = o.kv_resident && o.device != "cuda";
  if (kv_resident) {
    rs->world->world().barrier();
    const absl::Status fits = check_resident_kv_memory(
        static_cast<int64_t>(rs->kv_bytes), local_ranks(), available_host_memory());
    const uint8_t mine = fits.ok() ? 1 : 0;
    std::vector<uint8_t> all(rs->world->size());
    rs->world->world().all_gather(&mine, all.data(), 1);
    LTM_RETURN_IF_ERROR(fits);
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r] == 0)
        return absl::ResourceExhaustedError(absl::StrCat(
            "--kv-resident: rank ", r, " has not the memory for its KV cache (its error above)"));
  }
  try {
    rs->cache = std::make_unique<KvCache>(*rs->backend, rs->model->layers().size(),
                                          rs->model->n_kv_head_local(), config.head_dim(),
                                          o.block_size, rs->n_blocks, rs->kv_precision,
                                          kv_resident);
  } catch (const std::exception& e) {  // make_resident: the kernel could not provide it
    return absl::ResourceExhaustedError(absl::StrCat("the KV cache (", rs->kv_bytes,
                                                     " bytes on this rank): ", e.what()));
  }
  rs->engine = std::make_unique<Engine>(*rs->model, *rs->backend, *rs->cache,
                                        Comms{rs->world->world(), rs->world->tp(), rs->world->pp(),
                                              *rs->tp_device, *rs->pp_device});
  // Decode steps as captured graphs, by default wherever the backend has them (CUDA; the
  // emulated device records and replays its queue the same way).
  if (o.cuda_graphs == "on" || (o.cuda_graphs.empty() && rs->backend->supports_graphs()))
    rs->engine->enable_decode_graphs(o.max_running);
  rs->load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rs->resident_bytes = resident_bytes();
  rs->peak_resident_bytes = peak_resident_bytes();
  const std::array<uint64_t, 4> mine = {rs->weight_bytes, rs->kv_bytes, rs->resident_bytes,
                                        rs->peak_resident_bytes};
  rs->memory_per_rank.resize(rs->world->size());
  rs->world->world().all_gather(mine.data(), rs->memory_per_rank.data(), sizeof(mine));
  return rs;
}

std::string memory_report(const RankSetup& rs, int block_size, bool prefix_cache) {
  const auto mib = [](uint64_t b) { return absl::StrFormat("%.1f MiB", b / 1048576.0); };
  const parallel::WorldLayout& l = rs.world->layout();
  return absl::StrCat("rank ", rs.world->rank(), " (tp ", l.tp_rank(), ", pp ", l.pp_rank(),
                      "): weights ", mib(rs.weight_bytes), " ",
                      precision_name(rs.model->weight_precision()), ", KV cache ",
                      mib(rs.kv_bytes), " ", precision_name(rs.kv_precision), " (",
                      rs.n_blocks, " blocks of ", block_size, " tokens",
                      prefix_cache ? "; prefix cache on: free blocks keep full prefixes until "
                                     "they are needed" : "",
                      "), resident ",
                      mib(rs.resident_bytes), " (peak ", mib(rs.peak_resident_bytes), "), loaded in ",
                      absl::StrFormat("%.1f s", rs.load_seconds));
}

}  // namespace ltm
