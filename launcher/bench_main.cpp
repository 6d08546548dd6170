// ltm-bench: prefill and decode speed of one request on this machine, each figure printed beside
// the machine's limit (decode: weight bytes / measured memory bandwidth; prefill: FLOPs / measured
// OpenBLAS sgemm peak). Runs alone or under mpirun with --tp/--pp like ltm-worker.
//
//   ltm-bench [--model configs/gpt2-124m.json] [--threads 2] [--prompt-tokens 512]
//             [--new-tokens 128] [--tp T --pp P] [--json]
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <vector>

#include <boost/program_options.hpp>
#include "parallel/watchdog.h"
#include "launcher/cli_parse.h"

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "common/exit_codes.h"
#include "common/memory.h"
#include "common/logging.h"
#include "common/openmp_wait.h"
#include "common/version.h"
#include "launcher/lora_setup.h"
#include "launcher/model_setup.h"
#include "launcher/step_cost.h"
#include "runtime/sched/scheduler.h"

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Read bandwidth (bytes/s): every thread streams its share of a buffer of at least 1 GiB and 8x
// the last-level cache (as 4 concurrent streams), XOR-folding 64-bit words (integer folding vectorises without reordering
// rules, so the loop is bound by memory, not by an add chain). Best of 5 passes.
// (OpenBLAS's sasum, used before, reached only about half of the streaming bandwidth on Zen 3.)
double measure_read_bandwidth(int threads) {
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = 32l << 20;
  const size_t bytes = std::max<size_t>(size_t{1} << 30, 8 * static_cast<size_t>(llc));
  const size_t n = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;  // each thread its pages
  double best = 0;
  uint64_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    uint64_t folded = 0;
    // Each thread walks 4 parts of its share at once: one sequential stream per core leaves
    // the memory system idle part of the time (the decode kernel streams 4 panels likewise).
    const size_t per_thread = n / threads, part = per_thread / 4;
#pragma omp parallel num_threads(threads) reduction(^ : folded)
    {
      const uint64_t* p = buf.get() + per_thread * omp_get_thread_num();
      uint64_t f0 = 0, f1 = 0, f2 = 0, f3 = 0;
#pragma omp simd reduction(^ : f0, f1, f2, f3)
      for (size_t i = 0; i < part; ++i) {
        f0 ^= p[i];
        f1 ^= p[part + i];
        f2 ^= p[2 * part + i];
        f3 ^= p[3 * part + i];
      }
      folded ^= f0 ^ f1 ^ f2 ^ f3;
    }
    const double s = secs(t0, Clock::now());
    sink ^= folded;
    best = std::max(best, bytes / s);
  }
  if (sink == 42) std::printf(" ");  // keep the reads
  return best;
}

// sgemm FLOP/s on square 2048 matrices, best of 3.
double measure_sgemm_peak(int threads) {
  const int64_t m = 2048;
  std::vector<float> a(m * m, 0.5f), b(m * m, 0.25f), c(m * m);
  omp_set_num_threads(threads);
  ltm::kernels::cpu::set_blas_threads(threads);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    ltm::kernels::cpu::gemm(a.data(), b.data(), c.data(), m, m, m, false, 0.0f);
    best = std::max(best, 2.0 * m * m * m / secs(t0, Clock::now()));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  ltm::parallel::watch_broken_pipes();  // a lost peer: the group abort, not SIGPIPE (watchdog.h)
  ltm::bound_openmp_spin(argv);  // first: may exec this program again (common/openmp_wait.h)
  ltm::log_to_stderr();
  namespace po = boost::program_options;
  ltm::WorkerOptions o;
  int prompt_tokens = 512, new_tokens = 128, batch = 1, compare_rounds = 0;
  bool json = false, skip_limits = false, step_cost = false;
  ltm::StepCostOptions sc;
  po::options_description desc("ltm-bench options");
  desc.add_options()
      ("model", po::value(&o.model)->default_value(LTM_SOURCE_DIR "/configs/gpt2-124m.json"), "checkpoint folder or config .json (random weights)")
      ("threads", po::value(&o.threads)->default_value(0), "CPU threads per rank (0: cores / ranks)")
      ("tp", po::value(&o.tp)->default_value(1), "tensor-parallel ranks")
      ("pp", po::value(&o.pp)->default_value(1), "pipeline stages")
      ("device", po::value(&o.device)->default_value("cpu"), "cpu | cuda")
      ("prompt-tokens", po::value(&prompt_tokens)->default_value(512), "prompt length (prefill)")
      ("new-tokens", po::value(&new_tokens)->default_value(128), "tokens to decode")
      ("batch", po::value(&batch)->default_value(1), "sequences prefilled and decoded together")
      ("kv-memory-mb", po::value(&o.kv_memory_mb)->default_value(0), "KV cache per rank (0: what the batch needs)")
      ("weight-dtype", po::value(&o.weight_dtype), "f32 | bf16 | fp16 | int8 (default: the checkpoint's; f32 for a config)")
      ("kv-dtype", po::value(&o.kv_dtype), "f32 | bf16 | fp16 (default: f32 with f32 weights, else fp16)")
      ("cuda-graphs", po::value(&o.cuda_graphs), "on | off: decode steps as CUDA graphs (default: on with --device cuda)")
      ("lora", po::value(&o.lora)->composing(), "NAME=DIR: a LoRA adapter (repeatable); sequence b runs with the (b mod n)-th")
      ("lora-merge", po::bool_switch(&o.lora_merge), "fold the one --lora adapter into the weights instead")
      ("lora-max-rank", po::value(&o.lora_max_rank)->default_value(64), "adapters of a higher rank are refused")
      ("compare-base", po::value(&compare_rounds)->default_value(0), "with unmerged --lora: N rounds, each the batch on the base model then on the adapters")
      ("step-cost", po::bool_switch(&step_cost), "instead: a forward step's time against its rows (speculative decoding's token_cost; launcher/step_cost.h)")
      ("step-cost-context", po::value(&sc.context)->default_value(96), "--step-cost: tokens in the cache before the step")
      ("step-cost-rows", po::value(&sc.max_rows)->default_value(9), "--step-cost: rows 1 .. this")
      ("step-cost-rounds", po::value(&sc.rounds)->default_value(200), "--step-cost: steps of each row count")
      ("step-cost-batch", po::bool_switch(&sc.batch), "--step-cost: also r sequences of one row")
      ("skip-limits", po::bool_switch(&skip_limits), "do not measure bandwidth and sgemm peak")
      ("json", po::bool_switch(&json), "print one JSON line per measurement (limits, prefill, decode)")
      ("help,h", "this help")
      ("version", "print the version and exit");
  po::variables_map vm;
  try {
    if (ltm::parse_cli(argc, argv, desc, "", "ltm-bench", &vm) == ltm::CliStart::kDone)
      return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ltm-bench: %s\n", e.what());
    return 2;
  }
  if (std::string e = ltm::check_lora_options(o); !e.empty()) {
    std::fprintf(stderr, "ltm-bench: %s\n", e.c_str());
    return 2;
  }
  if (prompt_tokens < 1 || new_tokens < 1 || batch < 1 || batch > 1024) {
    std::fprintf(stderr, "ltm-bench: --prompt-tokens and --new-tokens must be >= 1, --batch in [1, 1024]\n");
    return 2;
  }
  if (step_cost && (o.tp != 1 || o.pp != 1)) {
    std::fprintf(stderr, "ltm-bench: --step-cost runs on one rank (--tp 1 --pp 1)\n");
    return 2;
  }
  if (step_cost) batch = std::max(batch, sc.batch ? sc.max_rows : 1);
  o.has_prompt_ids = true;
  o.max_batch_tokens = std::max(prompt_tokens, 512);
  o.max_running = batch;
  if (o.kv_memory_mb == 0 && batch > 1) {
    // Room for every sequence's whole context (a one-shot rank otherwise holds one context).
    auto config = ltm::load_config_for(o.model);
    if (config.ok()) {
      const int64_t per_token = 2 * config->n_layer * config->kv_width() * 4;  // K and V heads
      o.kv_memory_mb = std::max<int64_t>(
          1, (static_cast<int64_t>(batch) * (prompt_tokens + new_tokens + o.block_size) * per_token >> 20) + 1);
    }
  }
  auto setup = ltm::setup_rank(o, &argc, &argv);
  if (!setup.ok()) {
    std::fprintf(stderr, "ltm-bench: %s\n", std::string(setup.status().message()).c_str());
    return ltm::exit_code_for_setup(setup.status());
  }
  ltm::RankSetup& rs = **setup;
  const ltm::ModelConfig& c = rs.model->config();
  if (step_cost) {
    sc.json = json;
    const int code = ltm::run_step_cost(rs, o.block_size, sc);
    rs.engine->shutdown();
    return code;
  }
  // Weight bytes over all ranks, and the slowest rank's communication time.
  float stats[2] = {static_cast<float>(rs.model->weight_bytes()), 0};
  rs.world->world().all_reduce_sum(stats, 1);
  const double total_weight_bytes = stats[0];
  if (rs.world->rank() != 0) {
    rs.engine->follow();
    double comm = rs.engine->comm_seconds();
    rs.world->world().send(&comm, sizeof(comm), 0, 900);
    return 0;
  }
  if (prompt_tokens + new_tokens > c.n_positions) {
    std::fprintf(stderr, "ltm-bench: prompt + new tokens exceed the context (%lld)\n",
                 static_cast<long long>(c.n_positions));
    rs.engine->shutdown();
    return 2;
  }
  ltm::SchedulerOptions sopts;
  sopts.max_batch_tokens = o.max_batch_tokens;
  sopts.max_running = batch;
  sopts.max_queue = batch;  // every sequence is queued before the run
  sopts.micro_batches = 1;
  // Every pass sends the same prompts: the bench measures computing them, not reusing them.
  sopts.prefix_cache = false;
  sopts.lora_max_rank = o.lora_max_rank;
  sopts.lora_max_adapters = std::max<int32_t>(16, static_cast<int32_t>(o.lora.size()));
  ltm::Scheduler scheduler(*rs.engine, nullptr, c, rs.n_blocks, o.block_size, sopts);
  if (absl::Status st = ltm::load_startup_adapters(o, scheduler); !st.ok()) {
    std::fprintf(stderr, "ltm-bench: --lora: %s\n", std::string(st.message()).c_str());
    rs.engine->shutdown();
    return 2;
  }
  // Unmerged adapters: the batch's sequences spread over them (one batch mixes them all).
  std::vector<std::string> adapter_names;
  if (!o.lora_merge)
    for (const ltm::LoraSpec& spec : ltm::lora_specs(o)) adapter_names.push_back(spec.name);
  // `batch` requests of the same length with different prompts; a token's time is when the
  // scheduler hands it out. Prefill ends when every sequence has its first token.
  struct Pass {
    double prefill_s = 0, decode_s = 0, prefill_tps = 0, decode_tps = 0;
    double cpu_s = 0;  // CPU time of the whole pass, every thread of the process
    double stage_s = 0, lora_s = 0;  // rank 0's Model::run_stage time, and its LoRA products
    int64_t generated = 0;
  };
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  auto run_batch = [&](bool with_adapters) -> std::optional<Pass> {
    std::vector<Clock::time_point> first(batch), last(batch);
    int64_t generated = 0;
    const auto t0 = Clock::now();
    const double cpu0 = cpu_now();
    const double stage0 = rs.model->stage_seconds(), lora0 = rs.model->lora_seconds();
    for (int b = 0; b < batch; ++b) {
      ltm::GenerationRequest req;
      for (int i = 0; i < prompt_tokens; ++i)
        req.prompt_ids.push_back(static_cast<int32_t>((i * 7919 + 13 + b * 104729) % c.vocab_size));
      req.max_new_tokens = new_tokens;
      req.ignore_eos = true;
      req.sampling.temperature = 0;
      if (with_adapters && !adapter_names.empty()) req.adapter = adapter_names[b % adapter_names.size()];
      bool seen = false;
      auto st = scheduler.submit(std::move(req), [&, b, seen](ltm::GenerationEvent ev) mutable {
        if (ev.token_ids.empty()) return;
        const auto now = Clock::now();
        if (!seen) first[b] = now;
        seen = true;
        last[b] = now;
        generated += static_cast<int64_t>(ev.token_ids.size());
      });
      if (!st.ok()) {
        std::fprintf(stderr, "ltm-bench: %s\n", std::string(st.message()).c_str());
        return std::nullopt;
      }
    }
    scheduler.run_until_idle();
    Pass p;
    p.cpu_s = cpu_now() - cpu0;
    p.stage_s = rs.model->stage_seconds() - stage0;
    p.lora_s = rs.model->lora_seconds() - lora0;
    const auto prefill_end = *std::max_element(first.begin(), first.end());
    const auto decode_end = *std::max_element(last.begin(), last.end());
    p.prefill_s = secs(t0, prefill_end);
    p.decode_s = secs(prefill_end, decode_end);
    p.prefill_tps = static_cast<double>(batch) * prompt_tokens / p.prefill_s;
    p.decode_tps = p.decode_s > 0 ? (generated - batch) / p.decode_s : 0;
    p.generated = generated;
    return p;
  };
  // --compare-base: the same batch on the base model and on the adapters, alternating, a ratio
  // per round (this machine's speed drifts; a ratio within a round does not).
  std::vector<std::pair<Pass, Pass>> compared;
  for (int r = 0; r < compare_rounds; ++r) {
    std::optional<Pass> base = run_batch(false), lora = run_batch(true);
    if (!base || !lora) {
      rs.engine->shutdown();
      return 2;
    }
    compared.emplace_back(*base, *lora);
    std::fprintf(stderr,
                 "ltm-bench: round %d: decode base %.1f, adapters %.1f tokens/s (%.3f); CPU time "
                 "of the pass base %.2f s, adapters %.2f s (%.3f); LoRA products %.1f%% of the "
                 "adapters pass's stage time (%.2f of %.2f s)\n",
                 r + 1, base->decode_tps, lora->decode_tps, lora->decode_tps / base->decode_tps,
                 base->cpu_s, lora->cpu_s, lora->cpu_s / base->cpu_s,
                 100 * lora->lora_s / lora->stage_s, lora->lora_s, lora->stage_s);
  }
  std::optional<Pass> pass;
  if (compared.empty()) pass = run_batch(true);
  else pass = compared.back().second;
  if (!pass) {
    rs.engine->shutdown();
    return 2;
  }
  rs.engine->shutdown();
  double comm_max = rs.engine->comm_seconds();
  for (int r = 1; r < rs.world->size(); ++r) {
    double comm = 0;
    rs.world->world().recv(&comm, sizeof(comm), r, 900);
    comm_max = std::max(comm_max, comm);
  }
  const int64_t generated = pass->generated;
  const double prefill_tps = pass->prefill_tps;
  const double decode_tps = pass->decode_tps;
  const uint64_t peak_rss = ltm::peak_resident_bytes();

  // Limits. A decode step reads every weight once (the LM head's E included) plus each
  // sequence's K and V so far; prefill does 2 FLOPs per weight per token plus attention
  // (QK^T and PV over the causal half).
  const int64_t d = c.n_embd, L = c.n_layer;
  // A layer's matrices: Q, K, V, O (K and V narrower with grouped-query attention) and the MLP
  // (GELU: 2 matrices of d x d_ff, SwiGLU: 3); 12 d^2 + 13 d for GPT-2.
  const double layer_params = double(d) * (2.0 * c.q_width() + 2.0 * c.kv_width()) +
                              (c.is_llama() ? 3.0 : 2.0) * d * c.n_inner +
                              (c.is_llama() ? 0.0 : 13.0 * d);
  const double prefill_flops = batch * (2.0 * layer_params * L * prompt_tokens +
                                        2.0 * 2.0 * L * c.q_width() * (double(prompt_tokens) * (prompt_tokens + 1) / 2) +
                                        2.0 * c.vocab_size * d);
  const double kv_bytes_per_position = 2.0 * L * c.kv_width() * ltm::precision_size(rs.kv_precision);
  const double mean_context = prompt_tokens + new_tokens / 2.0;
  const double decode_step_bytes = total_weight_bytes + batch * mean_context * kv_bytes_per_position;
  double bandwidth = 0, peak = 0;
  const int threads_total = rs.threads * rs.world->size();
  if (!skip_limits) {
    bandwidth = measure_read_bandwidth(threads_total);
    peak = measure_sgemm_peak(threads_total);
  }
  const double decode_limit = bandwidth > 0 ? batch * bandwidth / decode_step_bytes : 0;
  const double prefill_limit = peak > 0 ? peak / prefill_flops * batch * prompt_tokens : 0;
  const double comm_per_token_ms = generated > 0 ? 1e3 * comm_max / generated : 0;
  if (json) {
    const nlohmann::json common = {
        {"model", o.model}, {"n_layer", L}, {"n_embd", d}, {"n_head", c.n_head},
        {"vocab_size", c.vocab_size}, {"weight_dtype", ltm::precision_name(rs.model->weight_precision())},
        {"kv_dtype", ltm::precision_name(rs.kv_precision)},
        {"backend", rs.backend->describe()}, {"isa", ltm::kernels::cpu::isa_name()},
        {"amx", ltm::kernels::cpu::amx_enabled()},
        {"dpbf16", ltm::kernels::cpu::dpbf16_enabled()}, {"tp", o.tp}, {"pp", o.pp},
        {"threads_per_rank", rs.threads}, {"batch", batch}, {"prompt_tokens", prompt_tokens},
        {"new_tokens", new_tokens}, {"weight_bytes", total_weight_bytes},
        {"lora_adapters", o.lora}, {"lora_merge", o.lora_merge},
        {"peak_rss_bytes", peak_rss}};
    auto line = [&](nlohmann::json j) {
      j.update(common);
      std::printf("%s\n", j.dump().c_str());
    };
    if (!skip_limits)
      line({{"measurement", "limits"}, {"threads", threads_total},
            {"read_bandwidth_gb_s", bandwidth / 1e9}, {"sgemm_peak_gflop_s", peak / 1e9}});
    line({{"measurement", "prefill"}, {"tokens_per_s", prefill_tps},
          {"limit_tokens_per_s", prefill_limit},
          {"ratio", prefill_limit > 0 ? prefill_tps / prefill_limit : 0.0}});
    for (size_t r = 0; r < compared.size(); ++r)
      line({{"measurement", "lora_compare"}, {"round", r + 1},
            {"base_decode_tokens_per_s", compared[r].first.decode_tps},
            {"lora_decode_tokens_per_s", compared[r].second.decode_tps},
            {"ratio", compared[r].second.decode_tps / compared[r].first.decode_tps},
            {"base_cpu_s", compared[r].first.cpu_s}, {"lora_cpu_s", compared[r].second.cpu_s},
            {"lora_stage_s", compared[r].second.stage_s},
            {"lora_products_s", compared[r].second.lora_s}});
    line({{"measurement", "decode"}, {"tokens_per_s", decode_tps},
          {"limit_tokens_per_s", decode_limit},
          {"ratio", decode_limit > 0 ? decode_tps / decode_limit : 0.0},
          {"pass_cpu_s", pass->cpu_s},
          {"comm_ms_per_token", comm_per_token_ms}});
    return 0;
  }
  std::printf("model %s: %lld layers, d=%lld, %.1f M parameters, %.0f MB of weights over %d rank(s)\n",
              o.model.c_str(), static_cast<long long>(L), static_cast<long long>(d),
              c.parameter_count() / 1e6, total_weight_bytes / 1e6, rs.world->size());
  std::printf("layout tp=%d pp=%d, %d thread(s) per rank, batch %d, weights %s, KV cache %s, %s\n",
              o.tp, o.pp, rs.threads, batch, ltm::precision_name(rs.model->weight_precision()),
              ltm::precision_name(rs.kv_precision), rs.backend->describe().c_str());
  std::printf("prefill %d x %d tokens: %8.1f tokens/s", batch, prompt_tokens, prefill_tps);
  if (peak > 0)
    std::printf("   limit %8.1f tokens/s (sgemm peak %.1f GFLOP/s)  ratio %.2f", prefill_limit,
                peak / 1e9, prefill_tps / prefill_limit);
  std::printf("\ndecode  %d x %d tokens: %8.1f tokens/s", batch, new_tokens, decode_tps);
  if (bandwidth > 0)
    std::printf("   limit %8.1f tokens/s (read bandwidth %.1f GB/s)  ratio %.2f", decode_limit,
                bandwidth / 1e9, decode_tps / decode_limit);
  std::printf("\ncommunication: %.3f ms per token (slowest rank); peak RSS %.1f MiB (rank 0)\n",
              comm_per_token_ms, peak_rss / 1048576.0);
  return 0;
}
