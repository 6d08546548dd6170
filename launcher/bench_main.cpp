// ltm-bench: prefill and decode speed of one request on this machine, each figure printed beside
// the machine's limit (decode: weight bytes / measured memory bandwidth; prefill: FLOPs / measured
// OpenBLAS sgemm peak). Runs alone or under mpirun with --tp/--pp like ltm-worker.
//
//   ltm-bench [--model configs/gpt2-124m.json] [--threads 2] [--prompt-tokens 512]
//             [--new-tokens 128] [--tp T --pp P] [--json]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include <boost/program_options.hpp>

#include "kernels/cpu/gemm.h"
#include "launcher/model_setup.h"
#include "runtime/serve/scheduler.h"

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Read bandwidth (bytes/s) over 1 GiB, far larger than the caches: OpenBLAS's vectorised,
// threaded sasum reads every byte once. Best of 5.
double measure_read_bandwidth(int threads) {
  const size_t n = size_t{1} << 28;
  std::vector<float> buf(n, 1.0f);
  omp_set_num_threads(threads);  // OpenBLAS's OpenMP build is bounded by OpenMP's thread count
  ltm::kernels::cpu::set_blas_threads(threads);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    const float total = cblas_sasum(static_cast<blasint>(n), buf.data(), 1);
    const double s = secs(t0, Clock::now());
    if (total < 0) std::printf("?");  // keep the call
    best = std::max(best, n * sizeof(float) / s);
  }
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
  namespace po = boost::program_options;
  ltm::WorkerOptions o;
  int prompt_tokens = 512, new_tokens = 128;
  bool json = false, skip_limits = false;
  po::options_description desc("ltm-bench options");
  desc.add_options()
      ("model", po::value(&o.model)->default_value(LTM_SOURCE_DIR "/configs/gpt2-124m.json"), "checkpoint folder or config .json (random weights)")
      ("threads", po::value(&o.threads)->default_value(0), "CPU threads per rank (0: cores / ranks)")
      ("tp", po::value(&o.tp)->default_value(1), "tensor-parallel ranks")
      ("pp", po::value(&o.pp)->default_value(1), "pipeline stages")
      ("device", po::value(&o.device)->default_value("cpu"), "cpu | cuda")
      ("prompt-tokens", po::value(&prompt_tokens)->default_value(512), "prompt length (prefill)")
      ("new-tokens", po::value(&new_tokens)->default_value(128), "tokens to decode")
      ("skip-limits", po::bool_switch(&skip_limits), "do not measure bandwidth and sgemm peak")
      ("json", po::bool_switch(&json), "print one JSON object")
      ("help,h", "this help");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ltm-bench: %s\n", e.what());
    return 2;
  }
  if (prompt_tokens < 1 || new_tokens < 1) {
    std::fprintf(stderr, "ltm-bench: --prompt-tokens and --new-tokens must be >= 1\n");
    return 2;
  }
  o.has_prompt_ids = true;
  o.max_batch_tokens = std::max(prompt_tokens, 512);
  auto setup = ltm::setup_rank(o, &argc, &argv);
  if (!setup.ok()) {
    std::fprintf(stderr, "ltm-bench: %s\n", std::string(setup.status().message()).c_str());
    return 2;
  }
  ltm::RankSetup& rs = **setup;
  const ltm::ModelConfig& c = rs.model->config();
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
  ltm::Scheduler scheduler(*rs.engine, nullptr, c, rs.n_blocks, o.block_size,
                           ltm::SchedulerOptions{o.max_batch_tokens, 1, 1});
  ltm::GenerationRequest req;
  for (int i = 0; i < prompt_tokens; ++i) req.prompt_ids.push_back((i * 7919 + 13) % c.vocab_size);
  req.max_new_tokens = new_tokens;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  std::vector<Clock::time_point> stamps;
  const auto t0 = Clock::now();
  auto st = scheduler.submit(std::move(req), [&](ltm::GenerationEvent ev) {
    for (size_t i = 0; i < ev.token_ids.size(); ++i) stamps.push_back(Clock::now());
  });
  if (!st.ok()) {
    std::fprintf(stderr, "ltm-bench: %s\n", std::string(st.message()).c_str());
    rs.engine->shutdown();
    return 2;
  }
  scheduler.run_until_idle();
  rs.engine->shutdown();
  double comm_max = rs.engine->comm_seconds();
  for (int r = 1; r < rs.world->size(); ++r) {
    double comm = 0;
    rs.world->world().recv(&comm, sizeof(comm), r, 900);
    comm_max = std::max(comm_max, comm);
  }
  const double prefill_s = secs(t0, stamps.front());
  const double decode_s = secs(stamps.front(), stamps.back());
  const double prefill_tps = prompt_tokens / prefill_s;
  const double decode_tps = (stamps.size() - 1) / decode_s;

  // Limits. Decode reads every weight once per token (the LM head's E included); prefill does
  // 2 FLOPs per weight per token plus attention (QK^T and PV over the causal half).
  const int64_t d = c.n_embd, L = c.n_layer;
  const double layer_params = 12.0 * d * d + 13.0 * d;
  const double prefill_flops = 2.0 * layer_params * L * prompt_tokens +
                               2.0 * 2.0 * L * d * (double(prompt_tokens) * (prompt_tokens + 1) / 2) +
                               2.0 * c.vocab_size * d;
  double bandwidth = 0, peak = 0;
  const int threads_total = rs.threads * rs.world->size();
  if (!skip_limits) {
    bandwidth = measure_read_bandwidth(threads_total);
    peak = measure_sgemm_peak(threads_total);
  }
  const double decode_limit = bandwidth > 0 ? bandwidth / total_weight_bytes : 0;
  const double prefill_limit = peak > 0 ? peak / prefill_flops * prompt_tokens : 0;
  const double comm_per_token_ms = 1e3 * comm_max / (stamps.size());
  if (json) {
    nlohmann::json j = {{"model", o.model}, {"tp", o.tp}, {"pp", o.pp}, {"threads_per_rank", rs.threads},
                        {"prompt_tokens", prompt_tokens}, {"new_tokens", new_tokens},
                        {"prefill_tokens_per_s", prefill_tps}, {"decode_tokens_per_s", decode_tps},
                        {"weight_bytes", total_weight_bytes}, {"read_bandwidth_gb_s", bandwidth / 1e9},
                        {"sgemm_peak_gflop_s", peak / 1e9},
                        {"decode_limit_tokens_per_s", decode_limit},
                        {"prefill_limit_tokens_per_s", prefill_limit},
                        {"comm_ms_per_token", comm_per_token_ms}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s: %lld layers, d=%lld, %.1f M parameters, %.0f MB of weights over %d rank(s)\n",
              o.model.c_str(), static_cast<long long>(L), static_cast<long long>(d),
              c.parameter_count() / 1e6, total_weight_bytes / 1e6, rs.world->size());
  std::printf("layout tp=%d pp=%d, %d thread(s) per rank\n", o.tp, o.pp, rs.threads);
  std::printf("prefill %d tokens: %8.1f tokens/s", prompt_tokens, prefill_tps);
  if (peak > 0)
    std::printf("   limit %8.1f tokens/s (sgemm peak %.1f GFLOP/s)  ratio %.2f", prefill_limit,
                peak / 1e9, prefill_tps / prefill_limit);
  std::printf("\ndecode  %d tokens: %8.1f tokens/s", new_tokens, decode_tps);
  if (bandwidth > 0)
    std::printf("   limit %8.1f tokens/s (read bandwidth %.1f GB/s)  ratio %.2f", decode_limit,
                bandwidth / 1e9, decode_tps / decode_limit);
  std::printf("\ncommunication: %.3f ms per token (slowest rank)\n", comm_per_token_ms);
  return 0;
}
