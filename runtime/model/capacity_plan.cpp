#include "runtime/model/capacity_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "parallel/partition.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/load_guard.h"
#include "runtime/model/model.h"

namespace ltm {
namespace {

constexpr double kGB = 1e9;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;

std::vector<DeviceSpec> make_table() {
  std::vector<DeviceSpec> t;
  {
    // This machine (2-core Sapphire Rapids VM, 24 GiB), measured with ltm-bench --threads 2 on
    // 2026-12-01: read bandwidth 27.9-32.6 GB/s (its "limits" line; 2 threads x 4 streams). The
    // FLOP rates are what ltm's own GEMMs reach in ltm-bench's 512-token prefill (f32 ~210
    // GFLOP/s in GPT-2-124M, 0.58 of the OpenBLAS sgemm peak of 360 GFLOP/s it measures; the
    // same rate puts GPT-3 1.3B within 20%). bf16 on AMX depends more on the width: ~410 GFLOP/s
    // in GPT-2-124M (d 768) and ~700 in GPT-3 1.3B (d 2048) on a quiet machine; the table takes
    // 575, between them, which puts both within 30% (the model has one rate per dtype).
    // Link: MPI over shared memory, allreduce_latency_bench (2 ranks): 2.9-3.7 us for 768 floats,
    // ~1 GB/s for 4 MiB. Overhead: a CPU rank's resident memory besides weights and KV cache
    // (libraries, OpenMP and OpenBLAS pools, the load's chunk buffers): 32-40 MiB measured with
    // ltm-worker's memory report at start-up (GPT-2-124M bf16, 1 rank and tp 2 / pp 2 ranks).
    DeviceSpec d;
    d.name = "cpu";
    d.memory_bytes = 24683652LL * 1024;  // MemTotal
    d.memory_bandwidth = 30 * kGB;
    d.flops_f32 = 210 * kGB;
    d.flops_16 = 575 * kGB;
    d.link_bandwidth = 1 * kGB;
    d.link_latency_s = 3.5e-6;
    d.network_bandwidth = d.link_bandwidth;
    d.network_latency_s = d.link_latency_s;
    d.devices_per_node = 1;
    d.overhead_bytes = 36 * kMiB;
    d.usable_fraction = 0.9;  // leave the OS and page cache room
    d.shared_by_ranks = true;
    d.source =
        "this 2-core VM measured by ltm-bench (read bandwidth; GEMM rate of ltm's kernels in its "
        "GPT-2-124M prefill) and allreduce_latency_bench (MPI shared memory), 2026-12-01";
    t.push_back(d);
  }
  // GPUs: NVIDIA's data sheets (dense figures, i.e. half the "with sparsity" ones). f32 weights
  // run as cuBLAS FP32 (no TF32), 16-bit weights on the tensor cores. link = NVLink per direction
  // (half the bidirectional total); network = one InfiniBand NIC per GPU as in NVIDIA's DGX
  // systems (A100: HDR 200 Gb/s; H100/H200: NDR 400 Gb/s). Latencies and the per-rank overhead
  // (CUDA context, cuBLAS workspace, activations) are our assumptions, not data-sheet figures.
  {
    DeviceSpec d;
    d.name = "a100-80gb";
    d.memory_bytes = 80 * int64_t{1000000000};
    d.memory_bandwidth = 2039 * kGB;
    d.flops_f32 = 19.5e12;
    d.flops_16 = 312e12;
    d.link_bandwidth = 300 * kGB;
    d.link_latency_s = 10e-6;
    d.network_bandwidth = 25 * kGB;
    d.network_latency_s = 20e-6;
    d.devices_per_node = 8;
    d.overhead_bytes = kGpuRuntimeBytes;
    d.usable_fraction = 0.95;
    d.source =
        "NVIDIA A100 Tensor Core GPU data sheet (80 GB HBM2e, 2,039 GB/s, FP32 19.5 TFLOPS, "
        "BF16 312 TFLOPS dense, NVLink 600 GB/s); DGX A100: 8 GPUs, HDR 200 Gb/s per GPU";
    t.push_back(d);
  }
  {
    DeviceSpec d;
    d.name = "h100-sxm";
    d.memory_bytes = 80 * int64_t{1000000000};
    d.memory_bandwidth = 3350 * kGB;
    d.flops_f32 = 67e12;
    d.flops_16 = 989e12;
    d.link_bandwidth = 450 * kGB;
    d.link_latency_s = 8e-6;
    d.network_bandwidth = 50 * kGB;
    d.network_latency_s = 15e-6;
    d.devices_per_node = 8;
    d.overhead_bytes = kGpuRuntimeBytes;
    d.usable_fraction = 0.95;
    d.source =
        "NVIDIA H100 Tensor Core GPU data sheet, SXM (80 GB HBM3, 3.35 TB/s, FP32 67 TFLOPS, "
        "BF16 989 TFLOPS dense, NVLink 900 GB/s); DGX H100: 8 GPUs, NDR 400 Gb/s per GPU";
    t.push_back(d);
  }
  {
    DeviceSpec d;
    d.name = "h200";
    d.memory_bytes = 141 * int64_t{1000000000};
    d.memory_bandwidth = 4800 * kGB;
    d.flops_f32 = 67e12;
    d.flops_16 = 989e12;
    d.link_bandwidth = 450 * kGB;
    d.link_latency_s = 8e-6;
    d.network_bandwidth = 50 * kGB;
    d.network_latency_s = 15e-6;
    d.devices_per_node = 8;
    d.overhead_bytes = kGpuRuntimeBytes;
    d.usable_fraction = 0.95;
    d.source =
        "NVIDIA H200 Tensor Core GPU data sheet, SXM (141 GB HBM3e, 4.8 TB/s, FP32 67 TFLOPS, "
        "BF16 989 TFLOPS dense, NVLink 900 GB/s); DGX H200: 8 GPUs, NDR 400 Gb/s per GPU";
    t.push_back(d);
  }
  return t;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Cost of one ring all-reduce of `bytes` over tp ranks.
double all_reduce_s(double bytes, int tp, double latency, double bandwidth) {
  if (tp <= 1) return 0;
  return latency + 2.0 * (tp - 1) / tp * bytes / bandwidth;
}

struct Costs {  // per rank of the layout
  double bandwidth, flops, tp_latency, tp_bandwidth, hop_latency, hop_bandwidth;
};

// The per-rank work of one stage for `rows` tokens at a context of `ctx` (decode: each row at
// ctx; prefill: rows = the chunk, ctx unused, causal attention over the chunk).
struct StageWork {
  double read_bytes = 0;   // weights read once per step (what decode streams)
  double matrix_elems = 0; // per token, layers' matrices
  double head_elems = 0;   // the LM head's (last stage)
  int64_t kv_per_token = 0;
  int64_t layers = 0;
  bool first = false, last = false;
};

}  // namespace

const std::vector<DeviceSpec>& builtin_devices() {
  static const std::vector<DeviceSpec> table = make_table();
  return table;
}

std::optional<DeviceSpec> find_device(const std::string& name) {
  const std::string n = lower(name);
  for (const DeviceSpec& d : builtin_devices())
    if (d.name == n) return d;
  return std::nullopt;
}

namespace {

std::string gib(double b) { return absl::StrFormat("%.2f GiB", b / kGiB); }

std::string human_bytes(double b) {
  if (b >= kGiB) return gib(b);
  if (b >= kMiB) return absl::StrFormat("%.1f MiB", b / kMiB);
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024);
  return absl::StrFormat("%.0f B", b);
}

}  // namespace

int32_t draft_max_sequences(int32_t spec_max_batch, int32_t max_running) {
  return std::max(1, std::min(spec_max_batch, max_running)) + 1;
}

DraftMemory draft_memory(const ModelConfig& c, Precision weights, int32_t block_size,
                         int32_t max_sequences) {
  DraftMemory m;
  m.weights = weights;
  m.kv = default_kv_precision(weights, Precision::kF32);  // its bytes: 16-bit types alike
  m.parameters = c.parameter_count();
  m.weight_bytes = weight_bytes_per_rank(c, ShardSpec{}, weights);
  m.max_sequences = std::max(1, max_sequences);
  m.kv_blocks = m.max_sequences * blocks_for(c.n_positions, std::max(1, block_size));
  m.kv_bytes = static_cast<int64_t>(m.kv_blocks) *
               KvCache::block_bytes(c.n_layer, c.kv_heads(), c.head_dim(), std::max(1, block_size),
                                    m.kv);
  return m;
}

Precision draft_weight_precision(const Checkpoint& ckpt, const ModelConfig& c) {
  const DType dt = ckpt.dtype(c.is_llama() ? "model.embed_tokens.weight" : "wte.weight");
  if (dt == DType::kBF16) return Precision::kBF16;
  if (dt == DType::kF16) return Precision::kF16;
  return Precision::kF32;
}

absl::StatusOr<Precision> draft_weight_precision(const std::string& dir, const ModelConfig& c) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Precision::kF32;
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::open(dir);
  if (!ckpt.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--draft-model ", dir, ": ", ckpt.status().message()));
  return draft_weight_precision(*ckpt, c);
}

int64_t draft_device_extra_bytes(const ModelConfig& c, const DraftMemory& m) {
  const int64_t rows = static_cast<int64_t>(std::max(1, m.max_sequences)) * c.n_positions;
  return gpu_activation_bytes(c.n_embd, c.n_inner, c.vocab_size, 1, rows, m.max_sequences) +
         kGpuDraftRuntimeBytes;
}

int64_t draft_device_bytes(const ModelConfig& c, const DraftMemory& m) {
  return m.total_bytes() + draft_device_extra_bytes(c, m);
}

absl::StatusOr<Plan> make_plan(const PlanInput& in) {
  const ModelConfig& c = in.config;
  const DeviceSpec& dev = in.device;
  if (in.world_size < 1) return absl::InvalidArgumentError("world size must be >= 1");
  if (in.batch < 1) return absl::InvalidArgumentError("--batch must be >= 1");
  if (in.prefill_chunk < 1) return absl::InvalidArgumentError("--prefill-chunk must be >= 1");
  if (in.block_size < 1) return absl::InvalidArgumentError("--block-size must be >= 1");
  if (dev.memory_bytes <= 0 || dev.memory_bandwidth <= 0 || dev.flops_f32 <= 0 ||
      dev.flops_16 <= 0 || dev.link_bandwidth <= 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "device '", dev.name, "' needs memory, memory bandwidth, FLOP rates and link bandwidth > 0"));
  if (in.kv == Precision::kInt8)
    return absl::InvalidArgumentError("--kv-dtype int8: the KV cache holds f32, bf16 or fp16");
  if (in.context < 0 || in.context > c.n_positions)
    return absl::InvalidArgumentError(absl::StrCat("--context ", in.context, " is outside [1, ",
                                                   c.n_positions, "] (the model's context)"));
  Plan plan;
  plan.input = in;
  plan.context = in.context > 0 ? in.context : c.n_positions;
  const int64_t C = plan.context, d = c.n_embd, ff = c.n_inner, L = c.n_layer, V = c.vocab_size;
  plan.parameters = c.parameter_count();
  plan.parameters_12ld2 = 12 * L * d * d;
  // Multiply-adds per token of one layer's matrices: Q, K, V and O, then the MLP (GELU: 2, SwiGLU:
  // 3 matrices of d x d_ff). Grouped-query attention makes K and V narrower.
  const double q_cols = double(c.q_width()), kv_cols = double(c.kv_width());
  const double layer_matrix = d * (2.0 * q_cols + 2.0 * kv_cols) + (c.is_llama() ? 3.0 : 2.0) * d * ff;
  // Untied head: V d more parameters read, the same work per token.
  plan.flops_per_token = 2.0 * (L * layer_matrix + double(V) * d) + 4.0 * L * d * C;
  const double wbytes = weight_element_bytes(in.weights);
  const double rate = in.weights == Precision::kF32 ? dev.flops_f32 : dev.flops_16;
  const int W = in.world_size;
  const double share = dev.shared_by_ranks ? W : 1;
  if (in.draft) {
    if (in.draft_config.vocab_size != V)
      return absl::InvalidArgumentError(absl::StrCat(
          "--draft-model has a vocabulary of ", in.draft_config.vocab_size,
          " tokens and the target (--model) one of ", V,
          ": a draft model must use the target's tokenizer"));
    if (in.spec_max_batch < 1) return absl::InvalidArgumentError("--spec-max-batch must be >= 1");
    plan.has_draft = true;
    plan.draft = draft_memory(in.draft_config, in.draft_weights, in.block_size,
                              draft_max_sequences(in.spec_max_batch, in.max_running));
    const bool on_gpu = !dev.shared_by_ranks && in.draft_on_device;
    if (on_gpu)
      plan.draft.device_extra_bytes = draft_device_extra_bytes(in.draft_config, plan.draft);
    plan.draft_counted = dev.shared_by_ranks || on_gpu;
  }
  // What rank 0 holds besides its stage, against its share of memory.
  const int64_t rank0_extra =
      plan.draft_counted ? plan.draft.held_bytes() : 0;

  for (int tp = 1; tp <= W; ++tp) {
    if (W % tp != 0) continue;
    const int pp = W / tp;
    LayoutPlan lp;
    lp.tp = tp;
    lp.pp = pp;
    const absl::Status valid = parallel::validate_layout(W, tp, pp, c.n_head, c.kv_heads(), L, ff);
    if (!valid.ok()) {
      lp.invalid = std::string(valid.message());
      plan.layouts.push_back(lp);
      continue;
    }
    // The cache holds KV heads: this rank's share, or one replicated head when tp exceeds them.
    const int64_t n_head_local = c.is_llama() ? parallel::kv_head_range(c.kv_heads(), tp, 0).size()
                                              : c.n_head / tp;
    lp.tp_crosses_nodes = !dev.shared_by_ranks && tp > dev.devices_per_node;
    const bool hops_cross = !dev.shared_by_ranks && W > dev.devices_per_node;
    const Costs k{dev.memory_bandwidth / share, rate / share,
                  lp.tp_crosses_nodes ? dev.network_latency_s : dev.link_latency_s,
                  lp.tp_crosses_nodes ? dev.network_bandwidth : dev.link_bandwidth,
                  hops_cross ? dev.network_latency_s : dev.link_latency_s,
                  hops_cross ? dev.network_bandwidth : dev.link_bandwidth};
    lp.memory_per_rank = static_cast<int64_t>(dev.memory_bytes * dev.usable_fraction / share);

    // What ltm-worker allocates (model_setup.cpp): the same blocks on every rank.
    KvSizing sizing;
    sizing.n_layers_local = parallel::max_stage_layers(L, V, d, pp);
    sizing.n_head_local = n_head_local;
    sizing.head_dim = c.head_dim();
    sizing.n_positions = c.n_positions;
    sizing.block_size = in.block_size;
    sizing.kv_memory_mb = in.kv_memory_mb;
    sizing.serving = in.serving;
    sizing.precision = in.kv;
    if (!dev.shared_by_ranks) {  // a GPU: what is left of its memory (kv_cache.h)
      sizing.device_memory_bytes = dev.memory_bytes;
      sizing.gpu_memory_fraction = in.gpu_memory_fraction;
      for (int s = 0; s < pp; ++s)
        sizing.weight_bytes = std::max(
            sizing.weight_bytes, weight_bytes_per_rank(c, ShardSpec{tp, 0, pp, s}, in.weights));
      sizing.activation_bytes = gpu_activation_bytes(d, c.n_inner, parallel::padded_vocab(V, tp),
                                                     tp, in.prefill_chunk, in.max_running);
      if (in.weights == Precision::kInt8)
        sizing.activation_bytes +=
            gpu_int8_scratch_bytes(d, c.n_inner, parallel::padded_vocab(V, tp), tp);
      sizing.graph_bytes = kGpuGraphBytes;
      sizing.overhead_bytes = dev.overhead_bytes;
      sizing.draft_bytes = rank0_extra;  // the worker reserves the draft's bytes on every rank
    }
    const absl::StatusOr<int32_t> blocks = plan_kv_blocks(sizing);
    if (blocks.ok()) {
      lp.worker_kv_blocks = *blocks;
    } else if (sizing.device_memory_bytes > 0 && in.kv_memory_mb == 0) {
      lp.worker_kv_blocks = 0;  // the worker refuses to start: no room for one context
    } else {
      return blocks.status();
    }

    const int64_t vpad_local = parallel::padded_vocab(V, tp) / tp;
    std::vector<StageWork> work;
    int64_t kv_fit = -1, kv_fit_without_draft = -1;
    for (int s = 0; s < pp; ++s) {
      StageWork w;
      w.layers = parallel::stage_layers(L, V, d, pp, s).size();
      w.first = s == 0;
      w.last = s == pp - 1;
      const int64_t wb = weight_bytes_per_rank(c, ShardSpec{tp, 0, pp, s}, in.weights);
      w.kv_per_token = KvCache::block_bytes(w.layers, n_head_local, c.head_dim(), 1, in.kv);
      w.matrix_elems = w.layers * layer_matrix / tp;
      w.head_elems = w.last ? double(vpad_local) * d : 0;
      // Decode reads every weight once, but only a few rows of wte (a stage that does not run
      // the head) and of wpe.
      w.read_bytes = static_cast<double>(wb);
      const bool untied = c.is_llama() && !c.tied_lm_head;  // the embedding is not the head
      if (w.first && (!w.last || untied)) w.read_bytes -= double(vpad_local) * d * wbytes;
      if (w.first && c.position_embedding == PositionEmbedding::kLearned)
        w.read_bytes -= double(c.n_positions) * d * 4;
      StagePlan sp;
      sp.pp_rank = s;
      sp.layers = w.layers;
      sp.weight_bytes = wb;
      sp.flops_per_token = 2.0 * (w.matrix_elems + w.head_elems) + 4.0 * w.layers * (c.q_width() / tp) * C;
      const int64_t stage_kv = static_cast<int64_t>(lp.worker_kv_blocks) *
                               KvCache::block_bytes(w.layers, n_head_local, c.head_dim(),
                                                    in.block_size, in.kv);
      sp.worker_kv_bytes = stage_kv;
      // Rank 0 (stage 0) also holds the draft, when it counts against this memory.
      const int64_t extra = s == 0 ? rank0_extra : 0;
      const int64_t extra_weights = s == 0 && plan.draft_counted ? plan.draft.weight_bytes : 0;
      // --kv-resident on host memory: the cache is faulted in at start-up.
      const int64_t kv_at_load = in.kv_resident && dev.shared_by_ranks ? stage_kv : 0;
      sp.resident_at_load_bytes = wb + extra_weights + kv_at_load + dev.overhead_bytes;
      if (s == 0)
        lp.rank0_bytes = wb + stage_kv +
                         (plan.has_draft ? plan.draft.held_bytes() : 0);
      lp.weight_bytes_per_rank = std::max(lp.weight_bytes_per_rank, wb);
      lp.kv_bytes_per_token = std::max(lp.kv_bytes_per_token, w.kv_per_token);
      lp.worker_kv_bytes = std::max(lp.worker_kv_bytes, stage_kv);
      lp.resident_bytes = std::max(lp.resident_bytes, wb + stage_kv + extra + dev.overhead_bytes);
      lp.resident_at_load_bytes = std::max(lp.resident_at_load_bytes, sp.resident_at_load_bytes);
      lp.flops_per_token = std::max(lp.flops_per_token, sp.flops_per_token);
      const int64_t free_bytes = lp.memory_per_rank - dev.overhead_bytes - wb;
      const int64_t fit = free_bytes - extra > 0 ? (free_bytes - extra) / w.kv_per_token : 0;
      kv_fit = kv_fit < 0 ? fit : std::min(kv_fit, fit);
      const int64_t fit0 = free_bytes > 0 ? free_bytes / w.kv_per_token : 0;
      kv_fit_without_draft = kv_fit_without_draft < 0 ? fit0 : std::min(kv_fit_without_draft, fit0);
      lp.stages.push_back(sp);
      work.push_back(w);
    }
    lp.kv_tokens_fit = std::max<int64_t>(0, kv_fit);
    lp.batch_at_context = lp.kv_tokens_fit / C;
    lp.fits = lp.batch_at_context >= 1;
    lp.draft_pushes_over = !lp.fits && rank0_extra > 0 && kv_fit_without_draft / C >= 1;
    lp.allreduce_payload_bytes = 2 * d * int64_t{sizeof(float)};
    lp.allreduce_bytes_moved = lp.allreduce_payload_bytes * 2.0 * (tp - 1) / tp;

    // One stage's time for `rows` tokens: decode (each at context ctx) or a prefill chunk.
    auto stage_s = [&](const StageWork& w, double rows, bool prefill, double* compute,
                       double* comm, double* mem) {
      const double attn = prefill ? 4.0 * w.layers * (double(c.q_width()) / tp) * rows * (rows + 1) / 2
                                  : 4.0 * w.layers * (double(c.q_width()) / tp) * C * rows;
      const double head_rows = prefill ? 1 : rows;  // prefill's logits: the last position only
      const double flops = 2.0 * (w.matrix_elems * rows + w.head_elems * head_rows) + attn;
      const double bytes = w.read_bytes + (prefill ? 0.0 : rows * C * double(w.kv_per_token));
      const double act = rows * d * sizeof(float);
      const int n_ar = 2 * static_cast<int>(w.layers) + (w.first ? 1 : 0);
      double cm = n_ar * all_reduce_s(act, tp, k.tp_latency, k.tp_bandwidth);
      if (w.last && tp > 1) cm += k.tp_latency;  // the greedy candidates' all-gather
      *mem = bytes / k.bandwidth;
      *compute = flops / k.flops;
      *comm = cm;
      return std::max(*mem, *compute) + cm;
    };
    auto hop_s = [&](double rows) {
      return pp > 1 ? k.hop_latency + rows * d * sizeof(float) / k.hop_bandwidth : 0.0;
    };
    // Decode, one sequence: the stages run one after the other, then the token returns to rank 0.
    double mem_sum = 0, compute_sum = 0, comm_sum = 0, latency = 0;
    for (size_t s = 0; s < work.size(); ++s) {
      double compute, comm, mem;
      latency += stage_s(work[s], 1, false, &compute, &comm, &mem);
      lp.stages[s].decode_compute_s = std::max(compute, mem);
      mem_sum += mem;
      compute_sum += compute;
      comm_sum += comm;
    }
    latency += pp * hop_s(1);
    comm_sum += pp * hop_s(1);
    lp.comm_s_per_step = comm_sum;
    lp.decode_s_per_token = latency;
    lp.bound = comm_sum > std::max(mem_sum, compute_sum)
                   ? "communication"
                   : (mem_sum >= compute_sum ? "memory bandwidth" : "compute");
    // Decode, `batch` sequences in min(pp, batch) micro-batches (the server's default): each
    // stage works on one micro-batch while the others work on the rest.
    const int m = std::min(pp, in.batch);
    const double rows = std::ceil(double(in.batch) / m);
    double slowest = 0, round_trip = 0;
    for (const StageWork& w : work) {
      double compute, comm, mem;
      const double t = stage_s(w, rows, false, &compute, &comm, &mem) + hop_s(rows);
      slowest = std::max(slowest, t);
      round_trip += t;
    }
    const double round = std::max(m * slowest, round_trip);
    lp.decode_tokens_per_s_batch = in.batch / round;
    // Prefill: one prompt chunk through the stages.
    const double P = std::min<int64_t>(in.prefill_chunk, C);
    double prefill = 0;
    for (size_t s = 0; s < work.size(); ++s) {
      double compute, comm, mem;
      prefill += stage_s(work[s], P, true, &compute, &comm, &mem);
      lp.stages[s].prefill_compute_s = std::max(compute, mem);
    }
    prefill += pp * hop_s(P);
    lp.prefill_s_per_token = prefill / P;
    plan.layouts.push_back(lp);
  }

  // The recommendation: of the layouts that fit, the highest decode throughput at `batch`; within
  // 3% of it, the lowest per-token latency.
  double best_tps = 0;
  for (const LayoutPlan& lp : plan.layouts)
    if (lp.invalid.empty() && lp.fits) best_tps = std::max(best_tps, lp.decode_tokens_per_s_batch);
  int fitting = 0;
  for (size_t i = 0; i < plan.layouts.size(); ++i) {
    const LayoutPlan& lp = plan.layouts[i];
    if (!lp.invalid.empty() || !lp.fits) continue;
    ++fitting;
    if (lp.decode_tokens_per_s_batch < 0.97 * best_tps) continue;
    if (plan.recommended < 0 ||
        lp.decode_s_per_token < plan.layouts[plan.recommended].decode_s_per_token)
      plan.recommended = static_cast<int>(i);
  }
  if (plan.recommended < 0) {
    int64_t least = -1;
    for (const LayoutPlan& lp : plan.layouts)
      if (lp.invalid.empty())
        least = least < 0 ? lp.weight_bytes_per_rank : std::min(least, lp.weight_bytes_per_rank);
    int pushed = 0;
    for (const LayoutPlan& lp : plan.layouts) pushed += lp.draft_pushes_over ? 1 : 0;
    plan.reason =
        pushed > 0
            ? absl::StrFormat(
                  "no layout fits with the draft model: rank 0 also holds --draft-model's %s "
                  "(weights %s + KV cache %s for %d sequences%s), and that is what pushes it "
                  "over its %s in %d of the layouts, which fit without it; use a smaller draft, "
                  "a lower --spec-max-batch, more ranks%s or --speculative ngram",
                  human_bytes(rank0_extra), human_bytes(plan.draft.weight_bytes),
                  human_bytes(plan.draft.kv_bytes), plan.draft.max_sequences,
                  plan.draft.device_extra_bytes > 0
                      ? absl::StrCat(" + activations and workspaces ",
                                     human_bytes(plan.draft.device_extra_bytes))
                      : std::string(),
                  human_bytes(static_cast<double>(dev.memory_bytes) * dev.usable_fraction / share),
                  pushed, plan.draft.device_extra_bytes > 0 ? ", --draft-device cpu" : "")
        : least < 0 ? "no valid layout for this world size (see each layout's reason)"
                  : absl::StrFormat(
                        "no layout fits: the smallest share of the weights is %.2f GiB per rank, "
                        "plus %.2f GiB overhead and one %lld-token context of KV cache, against "
                        "%.2f GiB per rank; use more ranks or 16-bit weights",
                        least / double(kGiB), dev.overhead_bytes / double(kGiB),
                        static_cast<long long>(C),
                        static_cast<double>(dev.memory_bytes) * dev.usable_fraction / share / kGiB);
  } else {
    const LayoutPlan& r = plan.layouts[plan.recommended];
    std::string why = absl::StrFormat(
        "tp %d x pp %d: %d of %d layouts fit (%.2f GiB of weights per rank, room for %lld "
        "sequences of %lld tokens); it decodes a batch of %d fastest (%.3g tokens/s estimated)",
        r.tp, r.pp, fitting, static_cast<int>(plan.layouts.size()), r.weight_bytes_per_rank / double(kGiB),
        static_cast<long long>(r.batch_at_context), static_cast<long long>(C), in.batch,
        r.decode_tokens_per_s_batch);
    if (plan.layouts.size() > 1)
      absl::StrAppend(&why, absl::StrFormat(", with %.2f ms per token for one sequence",
                                            r.decode_s_per_token * 1e3));
    if (!dev.shared_by_ranks && W > dev.devices_per_node)
      absl::StrAppend(&why, r.tp_crosses_nodes
                                ? "; its TP group crosses nodes"
                                : absl::StrFormat("; the TP group stays inside a node of %d "
                                                  "devices (NVLink) and only pipeline hops "
                                                  "between stages cross the network",
                                                  dev.devices_per_node));
    absl::StrAppend(&why, "; decode is bound by ", r.bound);
    plan.reason = why;
  }
  return plan;
}

std::string plan_text(const Plan& p) {
  const PlanInput& in = p.input;
  const ModelConfig& c = in.config;
  std::string s;
  absl::StrAppendFormat(&s, "model: %s%lld layers, d %lld, %lld heads, vocab %lld, context %lld\n",
                        c.is_llama() ? c.architecture + ", " : std::string(),
                        static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd),
                        static_cast<long long>(c.n_head), static_cast<long long>(c.vocab_size),
                        static_cast<long long>(c.n_positions));
  if (c.is_llama() && c.kv_heads() != c.n_head)
    absl::StrAppendFormat(&s, "grouped-query attention: %lld KV heads (the KV cache is %lldx "
                              "smaller than with one per query head)\n",
                          static_cast<long long>(c.kv_heads()),
                          static_cast<long long>(c.n_head / c.kv_heads()));
  absl::StrAppendFormat(&s, "parameters: %lld exact (%.3f B); 12 n_layer d^2 = %lld (%.3f B)\n",
                        static_cast<long long>(p.parameters), p.parameters / 1e9,
                        static_cast<long long>(p.parameters_12ld2), p.parameters_12ld2 / 1e9);
  absl::StrAppendFormat(&s, "FLOPs per token: %.4g (2 per weight incl. the LM head + attention at %lld tokens)\n",
                        p.flops_per_token, static_cast<long long>(p.context));
  absl::StrAppendFormat(&s, "device: %s x %d ranks%s: %s memory, %.0f GB/s, %.4g FLOP/s (%s weights), link %.0f GB/s\n",
                        in.device.name, in.world_size,
                        in.device.shared_by_ranks ? " (sharing one host)" : "",
                        gib(in.device.memory_bytes), in.device.memory_bandwidth / kGB,
                        in.weights == Precision::kF32 ? in.device.flops_f32 : in.device.flops_16,
                        precision_name(in.weights), in.device.link_bandwidth / kGB);
  absl::StrAppendFormat(&s, "  source: %s\n", in.device.source);
  absl::StrAppendFormat(&s, "weights %s, KV cache %s, decode estimate at %lld tokens of context, batch %d\n",
                        precision_name(in.weights), precision_name(in.kv),
                        static_cast<long long>(p.context), in.batch);
  if (p.has_draft) {
    const DraftMemory& dm = p.draft;
    absl::StrAppendFormat(
        &s, "draft model (--speculative draft, on rank 0's %s): %lld parameters, weights %s %s, "
            "KV cache %s %s (%d blocks of %d tokens: a full context for %d sequences), %s in all%s; %s\n",
        dm.device_extra_bytes > 0 ? "GPU" : "CPU",
        static_cast<long long>(dm.parameters), human_bytes(dm.weight_bytes),
        precision_name(dm.weights), human_bytes(dm.kv_bytes), precision_name(dm.kv), dm.kv_blocks,
        in.block_size, dm.max_sequences, human_bytes(dm.total_bytes()),
        dm.device_extra_bytes > 0
            ? absl::StrCat(" and ", human_bytes(dm.device_extra_bytes),
                           " of activations and workspaces")
            : std::string(),
        p.draft_counted ? "counted in rank 0's memory below"
                        : "held in rank 0's host memory, not on the GPU (not counted against it)");
  }
  absl::StrAppend(&s, "\n");
  for (const LayoutPlan& l : p.layouts) {
    absl::StrAppendFormat(&s, "tp %d x pp %d", l.tp, l.pp);
    if (!l.invalid.empty()) {
      absl::StrAppend(&s, ": invalid (", l.invalid, ")\n\n");
      continue;
    }
    absl::StrAppend(&s, l.fits ? "" : "  DOES NOT FIT",
                    l.draft_pushes_over
                        ? absl::StrCat(" (the draft model is what pushes rank 0 over: ",
                                       human_bytes(p.draft.held_bytes()),
                                       " more)")
                        : "",
                    "\n");
    std::string stages;
    for (const StagePlan& sp : l.stages)
      absl::StrAppend(&stages, stages.empty() ? "" : " + ", sp.layers);
    absl::StrAppendFormat(&s, "  weights per rank   %s (largest stage; layers per stage %s)\n",
                          gib(l.weight_bytes_per_rank), stages);
    absl::StrAppendFormat(&s, "  KV per token/rank  %s; room for %lld tokens = %lld x %lld (of %s per rank)\n",
                          human_bytes(l.kv_bytes_per_token), static_cast<long long>(l.kv_tokens_fit),
                          static_cast<long long>(l.batch_at_context),
                          static_cast<long long>(p.context), gib(l.memory_per_rank));
    absl::StrAppendFormat(&s, "  ltm-worker         KV %s (%d blocks); resident ~%s at start-up%s, ~%s with the cache full\n",
                          human_bytes(l.worker_kv_bytes), l.worker_kv_blocks,
                          gib(l.resident_at_load_bytes),
                          p.input.kv_resident && p.input.device.shared_by_ranks
                              ? " (the KV cache too: --kv-resident)"
                              : "",
                          gib(l.resident_bytes));
    if (p.has_draft)
      absl::StrAppendFormat(&s, "  rank 0 in all      %s: weights %s + KV %s + draft %s (weights %s + KV %s%s)%s\n",
                            human_bytes(l.rank0_bytes), human_bytes(l.stages[0].weight_bytes),
                            human_bytes(l.stages[0].worker_kv_bytes),
                            human_bytes(p.draft.held_bytes()),
                            human_bytes(p.draft.weight_bytes), human_bytes(p.draft.kv_bytes),
                            p.draft.device_extra_bytes > 0
                                ? absl::StrCat(" + activations and workspaces ",
                                               human_bytes(p.draft.device_extra_bytes))
                                : std::string(),
                            p.draft_counted ? "" : "; the draft in host memory");
    absl::StrAppendFormat(&s, "  FLOPs/token/rank   %.4g\n", l.flops_per_token);
    absl::StrAppendFormat(&s, "  all-reduces/block  2 x %s per token; %s in and out per rank%s\n",
                          human_bytes(l.allreduce_payload_bytes / 2.0),
                          human_bytes(l.allreduce_bytes_moved),
                          l.tp == 1 ? " (none: tp 1)" : (l.tp_crosses_nodes ? " (across nodes)" : ""));
    absl::StrAppendFormat(&s, "  decode             %.3f ms/token (%.1f tokens/s, %s-bound, comm %.3f ms); batch %d: %.3g tokens/s\n",
                          l.decode_s_per_token * 1e3, 1.0 / l.decode_s_per_token, l.bound,
                          l.comm_s_per_step * 1e3, in.batch, l.decode_tokens_per_s_batch);
    absl::StrAppendFormat(&s, "  prefill            %.4f ms/token (%.0f tokens/s)\n\n",
                          l.prefill_s_per_token * 1e3, 1.0 / l.prefill_s_per_token);
  }
  absl::StrAppend(&s, "recommended: ", p.reason, "\n");
  return s;
}

std::string plan_json(const Plan& p) {
  using nlohmann::json;
  const PlanInput& in = p.input;
  json layouts = json::array();
  for (const LayoutPlan& l : p.layouts) {
    json j = {{"tp", l.tp}, {"pp", l.pp}, {"valid", l.invalid.empty()}};
    if (!l.invalid.empty()) {
      j["invalid"] = l.invalid;
      layouts.push_back(j);
      continue;
    }
    json stages = json::array();
    for (const StagePlan& sp : l.stages)
      stages.push_back({{"pp_rank", sp.pp_rank}, {"layers", sp.layers},
                        {"weight_bytes_per_rank", sp.weight_bytes},
                        {"worker_kv_bytes_per_rank", sp.worker_kv_bytes},
                        {"resident_at_load_bytes_per_rank", sp.resident_at_load_bytes},
                        {"flops_per_token_per_rank", sp.flops_per_token},
                        {"decode_compute_s", sp.decode_compute_s},
                        {"prefill_chunk_compute_s", sp.prefill_compute_s}});
    j.update({{"stages", stages},
              {"weight_bytes_per_rank", l.weight_bytes_per_rank},
              {"kv_bytes_per_token_per_rank", l.kv_bytes_per_token},
              {"memory_per_rank", l.memory_per_rank},
              {"kv_tokens_fit", l.kv_tokens_fit},
              {"batch_at_context", l.batch_at_context},
              {"fits", l.fits},
              {"draft_pushes_over", l.draft_pushes_over},
              {"rank0_bytes", l.rank0_bytes},
              {"worker_kv_blocks", l.worker_kv_blocks},
              {"worker_kv_bytes_per_rank", l.worker_kv_bytes},
              {"resident_at_load_bytes_per_rank", l.resident_at_load_bytes},
              {"resident_bytes_per_rank", l.resident_bytes},
              {"flops_per_token_per_rank", l.flops_per_token},
              {"allreduce_payload_bytes_per_block_per_token", l.allreduce_payload_bytes},
              {"allreduce_bytes_moved_per_rank_per_block_per_token", l.allreduce_bytes_moved},
              {"tp_crosses_nodes", l.tp_crosses_nodes},
              {"comm_s_per_token", l.comm_s_per_step},
              {"decode_s_per_token", l.decode_s_per_token},
              {"decode_tokens_per_s", 1.0 / l.decode_s_per_token},
              {"decode_tokens_per_s_batch", l.decode_tokens_per_s_batch},
              {"prefill_s_per_token", l.prefill_s_per_token},
              {"prefill_tokens_per_s", 1.0 / l.prefill_s_per_token},
              {"decode_bound", l.bound}});
    layouts.push_back(j);
  }
  const DeviceSpec& d = in.device;
  json out = {
      {"parameters", p.parameters},
      {"parameters_12_n_layer_d2", p.parameters_12ld2},
      {"flops_per_token", p.flops_per_token},
      {"context", p.context},
      {"batch", in.batch},
      {"world_size", in.world_size},
      {"weight_dtype", precision_name(in.weights)},
      {"kv_dtype", precision_name(in.kv)},
      {"device", {{"name", d.name}, {"memory_bytes", d.memory_bytes},
                  {"memory_bandwidth_bytes_s", d.memory_bandwidth},
                  {"flops_f32", d.flops_f32}, {"flops_16", d.flops_16},
                  {"link_bandwidth_bytes_s", d.link_bandwidth}, {"link_latency_s", d.link_latency_s},
                  {"network_bandwidth_bytes_s", d.network_bandwidth},
                  {"network_latency_s", d.network_latency_s},
                  {"devices_per_node", d.devices_per_node}, {"overhead_bytes", d.overhead_bytes},
                  {"usable_fraction", d.usable_fraction}, {"shared_by_ranks", d.shared_by_ranks},
                  {"source", d.source}}},
      {"layouts", layouts},
      {"recommended", p.recommended >= 0
                          ? json{{"tp", p.layouts[p.recommended].tp},
                                 {"pp", p.layouts[p.recommended].pp}}
                          : json(nullptr)},
      {"reason", p.reason}};
  if (p.has_draft)
    out["draft"] = {{"parameters", p.draft.parameters},
                    {"weight_dtype", precision_name(p.draft.weights)},
                    {"kv_dtype", precision_name(p.draft.kv)},
                    {"weight_bytes", p.draft.weight_bytes},
                    {"kv_blocks", p.draft.kv_blocks},
                    {"kv_bytes", p.draft.kv_bytes},
                    {"max_sequences", p.draft.max_sequences},
                    {"device_extra_bytes", p.draft.device_extra_bytes},
                    {"on_device", p.draft.device_extra_bytes > 0},
                    {"counted_against_rank0_memory", p.draft_counted}};
  return out.dump();
}

}  // namespace ltm
