// ltm-bench: prefill and decode speed of one request (or a batch) on this machine, each figure
// printed beside the machine's limits measured in the same run (launcher/bench_limits.h): the read
// rate of memory and the FMA rate of the cores, probed before and after the pass; decode is
// bounded by bytes / read rate and by FLOPs / FMA rate, prefill by FLOPs / FMA rate. Runs alone
// or under mpirun with --tp/--pp like ltm-worker. --limits-only measures the limits and prints the
// model's FLOPs without loading weights (scripts/bench_serve uses it).
//
//   ltm-bench [--model configs/gpt2-124m.json] [--threads 2] [--prompt-tokens 512]
//             [--new-tokens 128] [--batch B] [--tp T --pp P] [--json] [--limits-only]
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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
#include "common/exit_codes.h"
#include "common/memory.h"
#include "common/logging.h"
#include "common/openmp_wait.h"
#include "common/version.h"
#include "launcher/bench_limits.h"
#include "launcher/bench_window.h"
#include "launcher/lora_setup.h"
#include "launcher/model_setup.h"
#include "launcher/step_cost.h"
#include "runtime/model/flop_count.h"
#include "runtime/sched/scheduler.h"

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}


// The limits line's fields (JSON), and the work of one request of the bench's shape.
nlohmann::json limits_json(const ltm::MachineLimits& m) {
  std::vector<double> read_gb, fma_gflop;
  for (double r : m.read_rounds) read_gb.push_back(r / 1e9);
  for (double f : m.fma_rounds) fma_gflop.push_back(f / 1e9);
  return {{"measurement", "limits"}, {"threads", m.threads}, {"probe_isa", m.isa},
          {"read_bandwidth_gb_s", m.read_bytes_per_s / 1e9}, {"read_rounds_gb_s", read_gb},
          {"fma_peak_gflop_s", m.fma_flops / 1e9}, {"fma_rounds_gflop_s", fma_gflop},
          {"bf16_dot_peak_gflop_s", m.bf16_dot_flops / 1e9},
          {"sgemm_peak_gflop_s", m.sgemm_flops / 1e9}};
}

nlohmann::json request_work_json(const ltm::ModelConfig& c, int prompt_tokens, int new_tokens) {
  const double request = ltm::request_flops(c, prompt_tokens, new_tokens);
  return {{"prefill_gflop", ltm::prefill_flops(c, prompt_tokens) / 1e9},
          {"decode_gflop", ltm::decode_flops(c, prompt_tokens, new_tokens) / 1e9},
          {"request_gflop", request / 1e9},
          {"gflop_per_generated_token", request / new_tokens / 1e9}};
}

void print_limits_text(const ltm::MachineLimits& m) {
  std::printf("limits (%d thread(s), %s path): read %.1f GB/s (rounds", m.threads, m.isa.c_str(),
              m.read_bytes_per_s / 1e9);
  for (double r : m.read_rounds) std::printf(" %.1f", r / 1e9);
  std::printf("), FMA %.1f GFLOP/s (rounds", m.fma_flops / 1e9);
  for (double f : m.fma_rounds) std::printf(" %.1f", f / 1e9);
  std::printf(")");
  if (m.bf16_dot_flops > 0) std::printf(", bf16 dot %.1f GFLOP/s", m.bf16_dot_flops / 1e9);
  if (m.sgemm_flops > 0) std::printf(", OpenBLAS sgemm %.1f GFLOP/s", m.sgemm_flops / 1e9);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  ltm::parallel::watch_broken_pipes();  // a lost peer: the group abort, not SIGPIPE (watchdog.h)
  ltm::bound_openmp_spin(argv);  // first: may exec this program again (common/openmp_wait.h)
  ltm::log_to_stderr();
  namespace po = boost::program_options;
  ltm::WorkerOptions o;
  int prompt_tokens = 512, new_tokens = 128, batch = 1, compare_rounds = 0, rounds = 1;
  int warmup = -1;  // -1: 1 with --device cuda, else 0
  bool json = false, skip_limits = false, limits_only = false, step_cost = false;
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
      ("kv-dtype", po::value(&o.kv_dtype), "f32 | bf16 | fp16 (default: f32 with f32 weights, bf16 with bf16 weights on CUDA, else fp16)")
      ("cuda-graphs", po::value(&o.cuda_graphs), "on | off: decode steps as CUDA graphs (default: on with --device cuda)")
      ("lora", po::value(&o.lora)->composing(), "NAME=DIR: a LoRA adapter (repeatable); sequence b runs with the (b mod n)-th")
      ("lora-merge", po::bool_switch(&o.lora_merge), "fold the one --lora adapter into the weights instead")
      ("lora-max-rank", po::value(&o.lora_max_rank)->default_value(64), "adapters of a higher rank are refused")
      ("rounds", po::value(&rounds)->default_value(1), "passes, each followed by a round of the limit probes; the best pass is reported beside the best limits")
      ("warmup", po::value(&warmup)->default_value(-1), "unmeasured passes before the first measured one (-1: 1 with --device cuda, where the first pass loads each kernel's module, picks cuBLASLt's algorithms and captures the CUDA graphs; 0 on the CPU)")
      ("compare-base", po::value(&compare_rounds)->default_value(0), "with unmerged --lora: N rounds, each the batch on the base model then on the adapters")
      ("step-cost", po::bool_switch(&step_cost), "instead: a forward step's time against its rows (speculative decoding's token_cost; launcher/step_cost.h)")
      ("step-cost-context", po::value(&sc.context)->default_value(96), "--step-cost: tokens in the cache before the step")
      ("step-cost-rows", po::value(&sc.max_rows)->default_value(9), "--step-cost: rows 1 .. this")
      ("step-cost-rounds", po::value(&sc.rounds)->default_value(200), "--step-cost: steps of each row count")
      ("step-cost-batch", po::bool_switch(&sc.batch), "--step-cost: also r sequences of one row")
      ("step-cost-replay", po::value(&sc.replay)->composing(), "--step-cost: an ltm-worker --output json file of a greedy run (repeatable): its tokens replayed through prompt lookup at the measured costs (runtime/spec/replay.h)")
      ("skip-limits", po::bool_switch(&skip_limits), "do not measure the read rate, FMA rate and sgemm peak")
      ("limits-only", po::bool_switch(&limits_only), "measure the limits with --threads and print the model's FLOPs for --prompt-tokens/--new-tokens; no weights loaded")
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
  if (rounds < 1 || rounds > 100 || (rounds > 1 && compare_rounds > 0)) {
    std::fprintf(stderr, "ltm-bench: --rounds must be in [1, 100], and 1 with --compare-base\n");
    return 2;
  }
  if (warmup < -1 || warmup > 10) {
    std::fprintf(stderr, "ltm-bench: --warmup must be in [0, 10] (or -1: by device)\n");
    return 2;
  }
  if (warmup == -1) warmup = o.device == "cuda" ? 1 : 0;
  if (prompt_tokens < 1 || new_tokens < 1 || batch < 1 || batch > 1024) {
    std::fprintf(stderr, "ltm-bench: --prompt-tokens and --new-tokens must be >= 1, --batch in [1, 1024]\n");
    return 2;
  }
  if (!sc.replay.empty() && !step_cost) {
    std::fprintf(stderr, "ltm-bench: --step-cost-replay needs --step-cost\n");
    return 2;
  }
  if (step_cost && (o.tp != 1 || o.pp != 1)) {
    std::fprintf(stderr, "ltm-bench: --step-cost runs on one rank (--tp 1 --pp 1)\n");
    return 2;
  }
  if (step_cost) batch = std::max(batch, sc.batch ? sc.max_rows : 1);
  if (limits_only) {
    auto config = ltm::load_config_for(o.model);
    if (!config.ok()) {
      std::fprintf(stderr, "ltm-bench: %s\n", std::string(config.status().message()).c_str());
      return 2;
    }
    ltm::MachineLimits m;
    m.threads = o.threads > 0 ? o.threads : omp_get_num_procs();
    m.measure(/*with_sgemm=*/false);
    nlohmann::json j = limits_json(m);
    j.update(request_work_json(*config, prompt_tokens, new_tokens));
    j.update({{"model", o.model}, {"prompt_tokens", prompt_tokens}, {"new_tokens", new_tokens}});
    if (json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      print_limits_text(m);
      std::printf("a request of %d + %d tokens: %.2f GFLOP (prefill %.2f, decode %.2f), %.3f GFLOP a generated token\n",
                  prompt_tokens, new_tokens, j["request_gflop"].get<double>(),
                  j["prefill_gflop"].get<double>(), j["decode_gflop"].get<double>(),
                  j["gflop_per_generated_token"].get<double>());
    }
    return 0;
  }
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
  // scheduler hands it out. Prefill ends when every sequence has its first token; decode is the
  // steps after that one (bench_window.h).
  struct Pass {
    double prefill_s = 0, decode_s = 0, prefill_tps = 0, decode_tps = 0;
    double decode_rows = 0;  // tokens a decode step (fewer than the batch where some finished)
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
    // Each sequence's events: when its tokens were handed out, and how many.
    std::vector<std::vector<std::pair<Clock::time_point, int>>> events(batch);
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
      auto st = scheduler.submit(std::move(req), [&, b](ltm::GenerationEvent ev) {
        if (ev.token_ids.empty()) return;
        const int n = static_cast<int>(ev.token_ids.size());
        events[b].emplace_back(Clock::now(), n);
        generated += n;
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
    const ltm::DecodeWindow w = ltm::decode_window(events);
    p.prefill_s = secs(t0, w.prefill_end);
    p.decode_s = secs(w.prefill_end, w.decode_end);
    p.prefill_tps = static_cast<double>(batch) * prompt_tokens / p.prefill_s;
    p.decode_tps = p.decode_s > 0 ? w.tokens / p.decode_s : 0;
    p.decode_rows = w.steps > 0 ? static_cast<double>(w.tokens) / w.steps : 0;
    p.generated = generated;
    return p;
  };
  // Unmeasured passes first: a cold first pass on a GPU times lazy module loads, cuBLASLt's
  // algorithm choice and graph captures, not the forward steps (--warmup).
  for (int r = 0; r < warmup; ++r) {
    const std::optional<Pass> w = run_batch(true);
    if (!w) {
      rs.engine->shutdown();
      return 2;
    }
    std::fprintf(stderr,
                 "ltm-bench: warm-up pass %d of %d (not counted): prefill %.1f, decode %.1f "
                 "tokens/s\n",
                 r + 1, warmup, w->prefill_tps, w->decode_tps);
  }
  // The limits are probed before the pass and after it (the best round counts); before it only
  // when this is the one rank (other ranks would wait in follow() beside the probe).
  ltm::MachineLimits limits;
  limits.threads = rs.threads * rs.world->size();
  if (!skip_limits && rs.world->size() == 1) limits.measure(/*with_sgemm=*/false);
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
  // --rounds: passes alternating with the probes (the last round's probe runs after shutdown).
  std::vector<Pass> passes;
  std::optional<Pass> pass;
  for (int r = 0; compared.empty() && r < rounds; ++r) {
    pass = run_batch(true);
    if (!pass) break;
    passes.push_back(*pass);
    if (r + 1 < rounds && !skip_limits && rs.world->size() == 1) limits.measure(/*with_sgemm=*/false);
  }
  if (!compared.empty()) pass = compared.back().second;
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
  double prefill_tps = pass->prefill_tps, decode_tps = pass->decode_tps;
  for (const Pass& p : passes) {  // the best of the rounds, as the limits are
    prefill_tps = std::max(prefill_tps, p.prefill_tps);
    decode_tps = std::max(decode_tps, p.decode_tps);
  }
  const uint64_t peak_rss = ltm::peak_resident_bytes();
  if (!skip_limits) limits.measure(/*with_sgemm=*/true);

  // The pass's work (runtime/model/flop_count.h) and bytes. A decode step reads every weight
  // once (the LM head's E included) plus each sequence's K and V so far.
  const int64_t d = c.n_embd, L = c.n_layer;
  const std::string wdtype = ltm::precision_name(rs.model->weight_precision());
  const double prefill_flops_per_token = ltm::prefill_flops(c, prompt_tokens) / prompt_tokens;
  const double decode_flops_per_token =
      new_tokens > 1 ? ltm::decode_flops(c, prompt_tokens, new_tokens) / (new_tokens - 1)
                     : ltm::decode_step_flops(c, prompt_tokens + 1);
  const double kv_bytes_per_position = 2.0 * L * c.kv_width() * ltm::precision_size(rs.kv_precision);
  const double mean_context = prompt_tokens + new_tokens / 2.0;
  // Rows a decode step: the batch, or fewer on average where the sequences that started first (in
  // an earlier prefill step) finished first (bench_window.h).
  const double rows = pass->decode_rows > 0 ? pass->decode_rows : batch;
  const double decode_step_bytes = total_weight_bytes + rows * mean_context * kv_bytes_per_position;
  const double bandwidth = limits.read_bytes_per_s;
  // Prefill: FLOPs over the compute rate of its GEMMs. Decode: each step reads its bytes and does
  // `rows` tokens' FLOPs, so the step takes at least the longer of the two times.
  const ltm::ComputeRoof prefill_roof = ltm::compute_roof(limits, wdtype, int64_t{batch} * prompt_tokens);
  const ltm::ComputeRoof decode_roof =
      ltm::compute_roof(limits, wdtype, std::max<int64_t>(1, std::llround(rows)));
  const double prefill_limit = prefill_roof.flops > 0 ? prefill_roof.flops / prefill_flops_per_token : 0;
  const double read_limit = bandwidth > 0 ? rows * bandwidth / decode_step_bytes : 0;
  const double decode_compute_limit = decode_roof.flops > 0 ? decode_roof.flops / decode_flops_per_token : 0;
  const double decode_limit = read_limit > 0 && decode_compute_limit > 0
                                  ? std::min(read_limit, decode_compute_limit)
                                  : std::max(read_limit, decode_compute_limit);
  const double decode_bytes_per_s = decode_tps / rows * decode_step_bytes;
  const double prefill_gflops = prefill_tps * prefill_flops_per_token / 1e9;
  const double decode_gflops = decode_tps * decode_flops_per_token / 1e9;
  const double fma = limits.fma_flops / 1e9;
  const double comm_per_token_ms = generated > 0 ? 1e3 * comm_max / generated : 0;
  auto frac = [](double x, double limit) { return limit > 0 ? x / limit : 0.0; };
  // A limit the pass beat by more than noise is no limit: say so rather than print a ratio > 1.
  if (bandwidth > 0 && decode_bytes_per_s > 1.05 * bandwidth)
    std::fprintf(stderr,
                 "ltm-bench: warning: decode moved %.1f GB/s, %.2f x the read probe's best %.1f GB/s "
                 "(caches hold part of the weights, or the probe ran on a busier machine)\n",
                 decode_bytes_per_s / 1e9, decode_bytes_per_s / bandwidth, bandwidth / 1e9);
  if (json) {
    const nlohmann::json common = {
        {"model", o.model}, {"n_layer", L}, {"n_embd", d}, {"n_head", c.n_head},
        {"vocab_size", c.vocab_size}, {"weight_dtype", wdtype},
        {"kv_dtype", ltm::precision_name(rs.kv_precision)},
        {"backend", rs.backend->describe()}, {"isa", ltm::kernels::cpu::isa_name()},
        {"amx", ltm::kernels::cpu::amx_enabled()},
        {"dpbf16", ltm::kernels::cpu::dpbf16_enabled()}, {"tp", o.tp}, {"pp", o.pp},
        {"threads_per_rank", rs.threads}, {"batch", batch}, {"prompt_tokens", prompt_tokens},
        {"new_tokens", new_tokens}, {"warmup_passes", warmup},
        {"weight_bytes", total_weight_bytes},
        {"lora_adapters", o.lora}, {"lora_merge", o.lora_merge},
        {"peak_rss_bytes", peak_rss}};
    auto line = [&](nlohmann::json j) {
      j.update(common);
      std::printf("%s\n", j.dump().c_str());
    };
    if (!skip_limits) line(limits_json(limits));
    for (size_t r = 0; passes.size() > 1 && r < passes.size(); ++r)
      line({{"measurement", "round"}, {"round", r + 1},
            {"prefill_tokens_per_s", passes[r].prefill_tps},
            {"decode_tokens_per_s", passes[r].decode_tps}});
    line({{"measurement", "prefill"}, {"tokens_per_s", prefill_tps},
          {"gflop_per_token", prefill_flops_per_token / 1e9}, {"gflop_s", prefill_gflops},
          {"fma_fraction", frac(prefill_gflops, fma)}, {"compute_roof", prefill_roof.name},
          {"limit_tokens_per_s", prefill_limit}, {"ratio", frac(prefill_tps, prefill_limit)}});
    for (size_t r = 0; r < compared.size(); ++r)
      line({{"measurement", "lora_compare"}, {"round", r + 1},
            {"base_decode_tokens_per_s", compared[r].first.decode_tps},
            {"lora_decode_tokens_per_s", compared[r].second.decode_tps},
            {"ratio", compared[r].second.decode_tps / compared[r].first.decode_tps},
            {"base_cpu_s", compared[r].first.cpu_s}, {"lora_cpu_s", compared[r].second.cpu_s},
            {"lora_stage_s", compared[r].second.stage_s},
            {"lora_products_s", compared[r].second.lora_s}});
    line({{"measurement", "decode"}, {"tokens_per_s", decode_tps}, {"rows_per_step", rows},
          {"gflop_per_token", decode_flops_per_token / 1e9}, {"gflop_s", decode_gflops},
          {"fma_fraction", frac(decode_gflops, fma)}, {"compute_roof", decode_roof.name},
          {"bytes_per_step", decode_step_bytes}, {"read_gb_s", decode_bytes_per_s / 1e9},
          {"read_fraction", frac(decode_bytes_per_s, bandwidth)},
          {"read_limit_tokens_per_s", read_limit},
          {"compute_limit_tokens_per_s", decode_compute_limit},
          {"limit_tokens_per_s", decode_limit}, {"ratio", frac(decode_tps, decode_limit)},
          {"pass_cpu_s", pass->cpu_s},
          {"comm_ms_per_token", comm_per_token_ms}});
    return 0;
  }
  std::printf("model %s: %lld layers, d=%lld, %.1f M parameters, %.0f MB of weights over %d rank(s)\n",
              o.model.c_str(), static_cast<long long>(L), static_cast<long long>(d),
              c.parameter_count() / 1e6, total_weight_bytes / 1e6, rs.world->size());
  std::printf("layout tp=%d pp=%d, %d thread(s) per rank, batch %d, weights %s, KV cache %s, %s\n",
              o.tp, o.pp, rs.threads, batch, wdtype.c_str(),
              ltm::precision_name(rs.kv_precision), rs.backend->describe().c_str());
  if (!skip_limits) print_limits_text(limits);
  for (size_t r = 0; passes.size() > 1 && r < passes.size(); ++r)
    std::printf("round %zu: prefill %.1f tokens/s, decode %.1f tokens/s\n", r + 1,
                passes[r].prefill_tps, passes[r].decode_tps);
  if (passes.size() > 1) std::printf("(below: the best round)\n");
  std::printf("prefill %d x %d tokens: %8.1f tokens/s, %.3f GFLOP a token, %.1f GFLOP/s", batch,
              prompt_tokens, prefill_tps, prefill_flops_per_token / 1e9, prefill_gflops);
  if (!skip_limits) {
    std::printf(" = %.2f of the FMA roofline", frac(prefill_gflops, fma));
    if (prefill_limit > 0)
      std::printf("; limit %.1f tokens/s (%s)  ratio %.2f", prefill_limit, prefill_roof.name,
                  prefill_tps / prefill_limit);
    else
      std::printf("; compute limit: %s", prefill_roof.name);
  }
  std::printf("\ndecode  %d x %d tokens: %8.1f tokens/s, %.3f GFLOP a token, %.1f GFLOP/s", batch,
              new_tokens, decode_tps, decode_flops_per_token / 1e9, decode_gflops);
  if (rows < batch - 0.05)  // the sequences that started first finished first
    std::printf(" (%.1f rows a step on average: the first sequences finished before the last)",
                rows);
  if (!skip_limits) {
    std::printf(" = %.2f of the FMA roofline; read %.1f GB/s = %.2f of the read rate", frac(decode_gflops, fma),
                decode_bytes_per_s / 1e9, frac(decode_bytes_per_s, bandwidth));
    std::printf("\n        limit %.1f tokens/s (read %.1f", decode_limit, read_limit);
    if (decode_compute_limit > 0) std::printf(", %s %.1f", decode_roof.name, decode_compute_limit);
    else std::printf(", compute: %s", decode_roof.name);
    std::printf(")  ratio %.2f", frac(decode_tps, decode_limit));
  }
  std::printf("\ncommunication: %.3f ms per token (slowest rank); peak RSS %.1f MiB (rank 0)\n",
              comm_per_token_ms, peak_rss / 1048576.0);
  return 0;
}
