#include "launcher/worker_run.h"

#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/version.h"
#include "common/memory.h"
#include "launcher/lora_setup.h"
#include "launcher/model_setup.h"
#include "launcher/perplexity.h"
#include "runtime/model/capacity_plan.h"
#include "parallel/group_abort.h"
#ifndef LTM_GPU_ONLY  // the GPU-only build (cmake/gpu_only.cmake) has no front doors
#include "runtime/serve/auth.h"
#include "runtime/serve/descriptor_budget.h"
#include "runtime/serve/grpc_server.h"
#include "runtime/serve/http_server.h"
#include "runtime/serve/loading_responder.h"
#endif
#include "runtime/sched/metrics.h"
#include "runtime/model/npy.h"
#include "runtime/sched/scheduler.h"
#include "runtime/spec/draft_model.h"
#include "runtime/text/tokenizer.h"
#include "spdlog/spdlog.h"

namespace ltm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

SpecOptions spec_options(const WorkerOptions& o, std::shared_ptr<Proposer> draft) {
  SpecOptions spec;
  spec.mode = *parse_spec_mode(o.speculative);  // validated with the command line
  spec.max_tokens = o.spec_tokens;
  spec.max_batch = o.spec_max_batch;
  spec.token_cost = o.spec_token_cost;
  spec.proposer = std::move(draft);  // --speculative draft's; ngram makes its own
  return spec;
}

// --speculative draft: the draft model, on rank 0's CPU or (--draft-device device) on its
// --device: its GPU, or the emulated device (runtime/spec/draft_model.h).
absl::StatusOr<std::shared_ptr<Proposer>> load_draft(const WorkerOptions& o, const RankSetup& rs) {
  DraftModelOptions d;
  d.dir = o.draft_model;
  d.target_vocab = rs.model->config().vocab_size;
  d.threads = rs.threads;
  if (o.draft_device == "device" && o.device == "cuda") {
    const int gpu = rs.device_index;
    d.make_backend = [gpu](std::string* error) { return make_cuda_backend(gpu, error); };
  } else if (o.draft_device == "device" && o.device == "devsim") {
    const int threads = rs.threads;
    d.make_backend = [threads](std::string*) { return make_devsim_backend(threads); };
  }
  d.block_size = o.block_size;
  // The sequences that speculate at once, and one more (a state dropped is recomputed): as
  // ltm-plan and the reservation on a GPU count them.
  d.max_sequences = draft_max_sequences(o.spec_max_batch, o.max_running);
  d.init_seed = o.init_seed;
  d.init_std = o.init_std;
  LTM_ASSIGN_OR_RETURN(std::unique_ptr<DraftModelProposer> p, DraftModelProposer::load(d));
  spdlog::info("draft model (--speculative draft): {}", p->describe());
  // Rank 0's memory report, continued: the draft is rank 0's too (ltm-plan counts it the same
  // way, capacity_plan.h's draft_memory).
  if (!o.listen.empty() || o.verbose) {
    const auto mib = [](uint64_t b) { return absl::StrFormat("%.1f MiB", b / 1048576.0); };
    const uint64_t draft_bytes = static_cast<uint64_t>(p->weight_bytes() + p->kv_bytes());
    spdlog::info("rank 0 draft model: weights {} {}, KV cache {} {} ({} blocks of {} tokens); "
                 "rank 0 in all: weights and KV caches {} (target {} + draft {})",
                 mib(p->weight_bytes()), precision_name(p->weight_precision()), mib(p->kv_bytes()),
                 precision_name(p->kv_precision()), p->blocks_total(), o.block_size,
                 mib(rs.weight_bytes + rs.kv_bytes + draft_bytes), mib(rs.weight_bytes + rs.kv_bytes),
                 mib(draft_bytes));
  }
  return std::shared_ptr<Proposer>(std::move(p));
}

// One-shot generation on rank 0. Returns the exit code.
int one_shot(const WorkerOptions& o, RankSetup& rs, const Tokenizer* tokenizer,
             std::shared_ptr<Proposer> draft) {
  const std::shared_ptr<Proposer> draft_for_report = draft;  // the memory figures
  const ModelConfig& config = rs.model->config();
  GenerationRequest req;
  if (o.has_prompt) {
    if (!tokenizer) {
      std::fprintf(stderr, "ltm-worker: --prompt needs a tokenizer: %s has no tokenizer.json or "
                           "vocab.json/merges.txt (give --tokenizer DIR, or --prompt-ids)\n",
                   o.model.c_str());
      return 2;
    }
    if (!is_valid_utf8(o.prompt)) {
      std::fprintf(stderr, "ltm-worker: --prompt is not valid UTF-8\n");
      return 2;
    }
    req.prompt_ids = tokenizer->encode_prompt(o.prompt);
  } else {
    req.prompt_ids = o.prompt_ids;
  }
  if (req.prompt_ids.empty()) {
    std::fprintf(stderr, "ltm-worker: the prompt is empty (it encodes to no tokens)\n");
    return 2;
  }
  for (int32_t id : req.prompt_ids) {
    if (id < 0 || id >= config.vocab_size) {
      std::fprintf(stderr, "ltm-worker: prompt token id %d is outside the vocabulary [0, %lld)\n",
                   id, static_cast<long long>(config.vocab_size));
      return 2;
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(req.prompt_ids.size());
  if (n_prompt + o.max_new_tokens > config.n_positions) {
    std::fprintf(stderr,
                 "ltm-worker: the prompt (%lld tokens) + --max-new-tokens (%d) exceeds the model's "
                 "context window of %lld tokens\n",
                 static_cast<long long>(n_prompt), o.max_new_tokens,
                 static_cast<long long>(config.n_positions));
    return 2;
  }
  req.max_new_tokens = o.max_new_tokens;
  req.sampling.temperature = o.temperature;
  req.sampling.top_k = o.top_k;
  req.sampling.top_p = o.top_p;
  req.sampling.repetition_penalty = o.repetition_penalty;
  req.sampling.seed = o.seed;
  if (absl::Status st = validate(req.sampling); !st.ok()) {
    std::fprintf(stderr, "ltm-worker: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  req.stop = o.stop;
  req.ignore_eos = o.ignore_eos;
  req.return_logprobs = o.output == "json";  // only the JSON output reports them
  req.return_full_logits = !o.dump_logits.empty();
  req.return_prompt_logits = !o.dump_prompt_logits.empty();
  req.adapter = o.adapter;
  const std::vector<int32_t> prompt_ids = req.prompt_ids;

  SchedulerOptions sopts = scheduler_options(o);
  sopts.max_queue = 1;
  sopts.spec = spec_options(o, std::move(draft));
  Scheduler scheduler(*rs.engine, tokenizer, config, rs.n_blocks, o.block_size, sopts);
  if (absl::Status st = load_startup_adapters(o, scheduler); !st.ok()) {
    std::fprintf(stderr, "ltm-worker: --lora: %s\n", std::string(st.message()).c_str());
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::vector<int32_t> generated;
  std::vector<float> logprobs, logits, prompt_logits;
  std::string text;
  GenerationEvent final_event;
  const Clock::time_point t0 = Clock::now();
  double ttft = 0;
  absl::Status st = scheduler.submit(std::move(req), [&](GenerationEvent ev) {
    if (generated.empty() && !ev.token_ids.empty()) ttft = seconds_since(t0);
    generated.insert(generated.end(), ev.token_ids.begin(), ev.token_ids.end());
    logprobs.insert(logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    logits.insert(logits.end(), ev.full_logits.begin(), ev.full_logits.end());
    prompt_logits.insert(prompt_logits.end(), ev.prompt_logits.begin(), ev.prompt_logits.end());
    text += ev.text;
    if (o.output == "text" && !ev.text.empty()) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev.finished) final_event = std::move(ev);
  });
  if (!st.ok()) {
    std::fprintf(stderr, "ltm-worker: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  scheduler.run_until_idle();
  const double total = seconds_since(t0);
  if (final_event.finish_reason == FinishReason::kError) {
    std::fprintf(stderr, "ltm-worker: generation failed: %s\n", final_event.status.ToString().c_str());
    return 1;
  }
  const int64_t V = config.vocab_size;
  if (!o.dump_logits.empty()) {
    absl::Status w = write_npy_f32(o.dump_logits, logits,
                                   {static_cast<int64_t>(logits.size()) / V, V});
    if (!w.ok()) {
      std::fprintf(stderr, "ltm-worker: --dump-logits: %s\n", std::string(w.message()).c_str());
      return 1;
    }
  }
  if (!o.dump_prompt_logits.empty()) {
    absl::Status w = write_npy_f32(o.dump_prompt_logits, prompt_logits,
                                   {static_cast<int64_t>(prompt_logits.size()) / V, V});
    if (!w.ok()) {
      std::fprintf(stderr, "ltm-worker: --dump-prompt-logits: %s\n",
                   std::string(w.message()).c_str());
      return 1;
    }
  }
  const double decode_s = total - ttft;
  const double decode_tps = generated.size() > 1 && decode_s > 0 ? (generated.size() - 1) / decode_s : 0;
  if (o.output == "json") {
    nlohmann::json j;
    j["prompt_ids"] = prompt_ids;
    j["generated_ids"] = generated;
    j["logprobs"] = logprobs;
    j["text"] = text;
    j["finish_reason"] = finish_reason_name(final_event.finish_reason);
    j["timings"] = {{"load_s", rs.load_seconds},
                    {"time_to_first_token_s", ttft},
                    {"total_s", total},
                    {"prefill_tokens_per_s", ttft > 0 ? prompt_ids.size() / ttft : 0},
                    {"decode_tokens_per_s", decode_tps}};
    // Speculative decoding (--speculative): drafts verified and accepted for this request.
    const int64_t proposed = final_event.spec_proposed_tokens;
    const int64_t accepted = final_event.spec_accepted_tokens;
    j["speculative"] = {{"mode", o.speculative},
                        {"proposed_tokens", proposed},
                        {"accepted_tokens", accepted},
                        {"acceptance_rate", proposed > 0 ? static_cast<double>(accepted) / proposed : 0.0}};
    j["layout"] = {{"tp", o.tp}, {"pp", o.pp}, {"threads", rs.threads},
                   {"weight_dtype", precision_name(rs.model->weight_precision())},
                   {"kv_dtype", precision_name(rs.kv_precision)},
                   {"backend", rs.backend->describe()}};
    // --speculative draft: where rank 0 runs the draft model (--draft-device).
    if (const auto* d = dynamic_cast<const DraftModelProposer*>(draft_for_report.get()))
      j["layout"]["draft_backend"] = d->backend_describe();
    j["bytes_read_per_rank"] = rs.bytes_read_per_rank;
    // Rank 0's decode graphs (--cuda-graphs): captured once per padded batch size, then replayed.
    j["decode_graphs"] = {{"captured", rs.engine->decode_graphs()},
                          {"replays", rs.engine->decode_graph_replays()}};
    // Rank 0's memory at the end of the run (its peak covers the whole generation), and every
    // rank's as it stood once loaded.
    j["memory"] = {{"weight_bytes", rs.weight_bytes},
                   {"kv_cache_bytes", rs.kv_bytes},
                   {"resident_bytes", resident_bytes()},
                   {"peak_resident_bytes", peak_resident_bytes()}};
    // --speculative draft: rank 0 also holds the draft model (its weights and KV cache), loaded
    // after the figures of memory_per_rank_at_load were taken.
    const auto* dm = dynamic_cast<const DraftModelProposer*>(draft_for_report.get());
    if (dm) {
      j["memory"]["draft_weight_bytes"] = dm->weight_bytes();
      j["memory"]["draft_kv_cache_bytes"] = dm->kv_bytes();
      j["memory"]["draft_kv_blocks"] = dm->blocks_total();
    }
    nlohmann::json per_rank = nlohmann::json::array();
    for (const auto& m : rs.memory_per_rank)
      per_rank.push_back({{"weight_bytes", m[0]}, {"kv_cache_bytes", m[1]},
                          {"resident_bytes", m[2]}, {"peak_resident_bytes", m[3]}});
    if (dm && !per_rank.empty()) {
      per_rank[0]["draft_weight_bytes"] = dm->weight_bytes();
      per_rank[0]["draft_kv_cache_bytes"] = dm->kv_bytes();
    }
    j["memory_per_rank_at_load"] = per_rank;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    if (o.verbose)
      std::fprintf(stderr, "ltm-worker: %zu prompt + %zu new tokens, first token %.3f s, %.1f tokens/s\n",
                   prompt_ids.size(), generated.size(), ttft, decode_tps);
  }
  return 0;
}

#ifndef LTM_GPU_ONLY
std::atomic<int> g_signal{0};
sem_t g_signal_wake;  // posted by the handler (sem_post is async-signal-safe) and at the end
void on_signal(int sig) {
  g_signal.store(sig);
  sem_post(&g_signal_wake);
}

// Serving on rank 0. Returns the exit code.
int serve(const WorkerOptions& o, RankSetup& rs, const Tokenizer& tokenizer,
          std::unique_ptr<LoadingResponder> loading, const DescriptorPlan& descriptors,
          std::shared_ptr<Proposer> draft) {
  spdlog::info("{}", descriptors.summary);
  const ModelConfig& config = rs.model->config();
  ServeMetrics metrics;
  SchedulerOptions sopts = scheduler_options(o);
  sopts.micro_batches = o.micro_batches;
  sopts.keepalive_s = o.keepalive_s;
  sopts.metrics = &metrics;
  sopts.prefix_cache = o.prefix_cache == "on";
  sopts.spec = spec_options(o, std::move(draft));
  const std::string kv_name = precision_name(rs.kv_precision);
  sopts.cache_salt = hash_bytes(kv_name.data(), kv_name.size());
  sopts.admission = o.admission == "deadline";
  sopts.request_timeout_s = o.request_timeout_s;
  Scheduler scheduler(*rs.engine, &tokenizer, config, rs.n_blocks, o.block_size, sopts);
  if (absl::Status st = load_startup_adapters(o, scheduler); !st.ok()) {
    std::fprintf(stderr, "ltm-worker: --lora: %s\n", std::string(st.message()).c_str());
    return st.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitRuntimeError;
  }
  EngineInfo info;
  info.model_name = std::filesystem::path(o.model).filename().string();
  info.model = config;
  info.tp = o.tp;
  info.pp = o.pp;
  info.dtype = precision_name(rs.model->weight_precision());
  info.kv_dtype = precision_name(rs.kv_precision);
  metrics.set_build_info({version(), absl::StrCat("tp", o.tp, "pp", o.pp), info.dtype,
                          info.kv_dtype});
  metrics.set_stats_source([&scheduler] {
    const SchedulerStats s = scheduler.stats();
    LiveStats l;
    l.engine.kv_blocks_total = s.kv_blocks_total;
    l.engine.kv_blocks_free = s.kv_blocks_free;
    l.engine.kv_blocks_cached = s.kv_blocks_cached;
    l.engine.kv_block_size = s.block_size;
    l.engine.queue_depth = s.queue_depth;
    l.engine.running = s.running;
    l.engine.requests_served = s.requests_served;
    l.preemptions = s.preemptions;
    l.steps = s.steps;
    l.prefix_cache_query_tokens = s.prefix_cache_query_tokens;
    l.prefix_cache_hit_tokens = s.prefix_cache_hit_tokens;
    l.spec_proposed_tokens = s.spec_proposed_tokens;
    l.spec_accepted_tokens = s.spec_accepted_tokens;
    l.spec_steps = s.spec_steps;
    return l;
  });
  info.stats = [&scheduler] {
    const SchedulerStats s = scheduler.stats();
    EngineStats e;
    e.kv_blocks_total = s.kv_blocks_total;
    e.kv_blocks_free = s.kv_blocks_free;
    e.kv_blocks_cached = s.kv_blocks_cached;
    e.kv_block_size = s.block_size;
    e.queue_depth = s.queue_depth;
    e.running = s.running;
    e.requests_served = s.requests_served;
    return e;
  };
  add_lora_info(o, rs, scheduler, info);
  // The chat template and end tokens (runtime/serve/chat_format.h): a broken one stops the start.
  const std::string tok_dir = !o.tokenizer.empty() ? o.tokenizer : o.model;
  absl::StatusOr<std::shared_ptr<const ChatFormat>> chat =
      ChatFormat::load(std::filesystem::is_directory(tok_dir) ? tok_dir : std::string(), o.model,
                       o.chat_template, tokenizer, config.vocab_size);
  if (!chat.ok()) {
    std::fprintf(stderr, "ltm-worker: %s\n", std::string(chat.status().message()).c_str());
    return kExitUsage;
  }
  if ((*chat)->has_template())
    spdlog::info("chat template from {}", (*chat)->template_origin());
  GrpcServerOptions gopts;
  gopts.chat = *chat;
  gopts.address = o.listen;
  gopts.max_receive_message_bytes = o.max_message_bytes;  // validated: 0 or [1 KiB, 1 GiB]
  gopts.max_concurrent_streams = o.max_streams_per_connection;
  gopts.request_memory_bytes = o.request_memory_mb << 20;
  gopts.tls_cert_file = o.tls_cert;
  gopts.tls_key_file = o.tls_key;
  gopts.tls_client_ca_file = o.tls_client_ca;
  gopts.reflection = o.reflection;
  gopts.metrics = &metrics;
  if (!o.api_key_file.empty()) {
    absl::StatusOr<std::string> key = read_api_key_file(o.api_key_file);
    if (!key.ok()) {
      std::fprintf(stderr, "ltm-worker: %s\n", std::string(key.status().message()).c_str());
      return 2;
    }
    gopts.api_key = std::move(*key);
  }
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::start(gopts, scheduler, tokenizer, info);
  if (!server.ok()) {
    std::fprintf(stderr, "ltm-worker: cannot serve on %s: %s\n", o.listen.c_str(),
                 std::string(server.status().message()).c_str());
    return 1;
  }
  // The HTTP front door (runtime/serve/http_server.h): /health says ready once a warm-up
  // request has run a step on every rank.
  std::atomic<bool> warm{false};
  std::unique_ptr<HttpServer> http;
  if (!o.http.empty()) {
    HttpServerOptions hopts;
    hopts.address = o.http;
    hopts.threads = o.http_threads;
    hopts.idle_timeout_s = o.http_idle_timeout_s;
    hopts.max_connections = descriptors.http_max_connections;
    hopts.api_key = gopts.api_key;
    hopts.metrics = &metrics;
    hopts.chat = *chat;
    hopts.ready = [&warm] { return warm.load(); };
    hopts.adapters = [&scheduler] {
      std::vector<std::string> names;
      for (const AdapterStatus& a : scheduler.adapters())
        if (a.loaded && !a.unloading) names.push_back(a.name);
      return names;
    };
    loading.reset();  // releases the address for the real front door
    absl::StatusOr<std::unique_ptr<HttpServer>> h = HttpServer::start(hopts, scheduler, tokenizer, info);
    if (!h.ok()) {
      std::fprintf(stderr, "ltm-worker: cannot serve HTTP on %s: %s\n", o.http.c_str(),
                   std::string(h.status().message()).c_str());
      return 1;
    }
    http = std::move(*h);
    GenerationRequest warmup;
    warmup.request_id = "warmup";
    warmup.prompt_ids = {config.eos_token_id >= 0 && config.eos_token_id < config.vocab_size
                             ? static_cast<int32_t>(config.eos_token_id) : 0};
    warmup.max_new_tokens = 1;
    warmup.sampling.temperature = 0;
    warmup.ignore_eos = true;
    absl::Status ws = scheduler.submit(std::move(warmup), [&warm](GenerationEvent ev) {
      if (ev.finished) warm.store(ev.finish_reason != FinishReason::kError);
    });
    if (!ws.ok()) spdlog::warn("warm-up request: {}", ws.ToString());
  }
  // --insecure-public (worker_options.cpp): said at every start, where an operator looks.
  if (!is_loopback_address(o.listen) && o.tls_cert.empty() && o.api_key_file.empty())
    spdlog::warn("--insecure-public: the gRPC API on {} is open to anyone who can reach it "
                 "(no TLS, no API key)", (*server)->address());
  if (http && !is_loopback_address(o.http) && o.api_key_file.empty())
    spdlog::warn("--insecure-public: the HTTP API on {} is open to anyone who can reach it "
                 "(plaintext, no API key)", http->address());
  spdlog::info("serving {} on {}{}{} (tp {}, pp {}, {} KV blocks of {} tokens)", info.model_name,
               (*server)->address(), http ? ", HTTP on " : "", http ? http->address() : "", o.tp,
               o.pp, rs.n_blocks, o.block_size);

  // SIGTERM, SIGINT or SIGUSR1 (what mpirun forwards to every rank; launcher/ltm-mpirun turns
  // its own SIGTERM into it): stop taking requests, finish (or after --drain-timeout cancel) the
  // rest, release the other ranks and exit 0.
  sem_init(&g_signal_wake, 0, 0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  // If the group goes down (a rank died, a collective timed out), answer every request in flight
  // UNAVAILABLE before the process ends, so clients retry elsewhere instead of seeing a reset.
  const std::thread::id step_thread = std::this_thread::get_id();
  parallel::set_abort_hook([&scheduler, step_thread](std::string_view message) {
    if (std::this_thread::get_id() != step_thread) return;  // the scheduler is the step thread's
    scheduler.fail_all(absl::UnavailableError(absl::StrCat("the engine failed (", std::string(message), ")")));
    std::this_thread::sleep_for(std::chrono::milliseconds(800));  // let gRPC send the answers
  });
  std::atomic<bool> done{false};
  std::optional<Clock::time_point> drain_deadline;  // set by the watcher, read after join()
  std::thread watcher([&] {
    // Woken at once: a drain that starts late (this was a 50 ms poll) lets calls in after the
    // signal and, when the running calls end meanwhile, leaves no drain window at all.
    while (!done.load() && g_signal.load() == 0) {
      if (sem_wait(&g_signal_wake) != 0 && errno != EINTR) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    if (done.load()) return;
    spdlog::info("signal {}: draining (up to {:.1f} s)", g_signal.load(), o.drain_timeout_s);
    const auto drain = std::chrono::duration<double>(o.drain_timeout_s);
    (*server)->begin_drain();
    if (http) http->begin_drain();
    drain_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(drain);
    scheduler.stop(*drain_deadline);
  });
  scheduler.serve();
  done.store(true);
  sem_post(&g_signal_wake);
  watcher.join();
  // The engine is done, but a front door may still hold what it produced: a slow reader (or, on a
  // loaded machine, a connection thread that fell behind the step thread) gets until the drain
  // deadline to take the rest, at least 5 s. A fixed 5 s cut drained streams short under ASan.
  const Clock::time_point flush_from = Clock::now();
  const auto flush_for = std::max<Clock::duration>(
      std::chrono::seconds(5), drain_deadline ? *drain_deadline - flush_from : Clock::duration{});
  (*server)->shutdown(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(flush_for));
  if (http) http->shutdown(flush_from + flush_for);  // the same deadline, not another flush_for
  parallel::set_abort_hook(nullptr);  // the scheduler goes out of scope
  spdlog::info("drained, exiting");
  return 0;
}

#endif  // LTM_GPU_ONLY

}  // namespace

SchedulerOptions scheduler_options(const WorkerOptions& o) {
  SchedulerOptions sopts;
  sopts.max_batch_tokens = o.max_batch_tokens;
  sopts.max_running = o.max_running;
  sopts.max_queue = o.max_queue;
  sopts.lora_max_rank = o.lora_max_rank;
  sopts.lora_max_adapters = o.lora_max_adapters;
  return sopts;
}

int run_worker(const WorkerOptions& o, int* argc, char*** argv) {
  // SIGUSR1 asks a server to drain; mpirun forwards it to every rank, and its default action
  // (terminate) must not kill a rank that has no handler (only a serving rank 0 installs one).
  signal(SIGUSR1, SIG_IGN);
#ifdef LTM_GPU_ONLY
  if (!o.listen.empty() || !o.http.empty()) {
    std::fprintf(stderr, "ltm-worker: this is the GPU-only build (-DLTM_GPU_ONLY=ON), which runs "
                         "one-shot generation only; serving (--listen, --http) needs the full "
                         "build (docs/operations.md)\n");
    return 2;
  }
#else
  // A server's connections and MPI's links need more descriptors than the soft default
  // (runtime/serve/descriptor_budget.h); a cap that does not fit is refused before loading.
  const DescriptorLimit fds = raise_descriptor_limit();
  DescriptorPlan descriptors;
  if (!o.listen.empty()) {
    absl::StatusOr<DescriptorPlan> plan =
        plan_descriptors(fds, o.tp * o.pp, o.http_max_connections, !o.http.empty());
    if (!plan.ok()) {
      std::fprintf(stderr, "ltm-worker: %s\n", std::string(plan.status().message()).c_str());
      return exit_code_for_setup(plan.status());
    }
    descriptors = std::move(*plan);
  }
  // A server's HTTP port answers 503 "loading" while rank 0 loads (runtime/serve/loading_responder.h).
  std::unique_ptr<LoadingResponder> loading;
  if (!o.http.empty() && !o.listen.empty() && launcher_rank() == 0) {
    absl::StatusOr<std::unique_ptr<LoadingResponder>> l = LoadingResponder::start(o.http);
    if (l.ok()) {
      loading = std::move(*l);
    } else {
      spdlog::warn("{}", std::string(l.status().message()));  // the front door says it again
    }
  }
#endif  // LTM_GPU_ONLY
  absl::StatusOr<std::unique_ptr<RankSetup>> setup = setup_rank(o, argc, argv);
  if (!setup.ok()) {
    std::fprintf(stderr, "ltm-worker: %s\n", std::string(setup.status().message()).c_str());
    return exit_code_for_setup(setup.status());
  }
  RankSetup& rs = **setup;
  // Each rank reports its memory at start-up when serving (or asked to be verbose).
  if (!o.listen.empty() || o.verbose)
    spdlog::info("{}", memory_report(rs, o.block_size,
                                     !o.listen.empty() && o.prefix_cache == "on"));
  if (rs.world->rank() != 0) {
    if (!o.listen.empty()) {
      // A server's other ranks stop when rank 0 releases them after draining; the signals that
      // start a drain (forwarded to every rank by mpirun or srun) must not kill them first.
      signal(SIGTERM, SIG_IGN);
      signal(SIGINT, SIG_IGN);
      // Rank 0 sends a plan or a keep-alive at least every --keepalive-s, unless it is inside a
      // step, which ends within --collective-timeout: silence beyond both means it is stuck.
      rs.engine->set_idle_timeout(o.collective_timeout_s + 3 * o.keepalive_s);
    }
    rs.engine->follow();
    return 0;
  }
  // Rank 0: the tokenizer (optional for one-shot with --prompt-ids).
  std::optional<Tokenizer> tokenizer;
  const std::string tok_dir = !o.tokenizer.empty() ? o.tokenizer
                              : std::filesystem::is_directory(o.model) ? o.model : std::string();
  int code = 0;
  if (!tok_dir.empty() && Tokenizer::folder_has_tokenizer(tok_dir)) {
    absl::StatusOr<Tokenizer> t = Tokenizer::load(tok_dir);
    if (!t.ok()) {
      std::fprintf(stderr, "ltm-worker: %s\n", std::string(t.status().message()).c_str());
      code = 1;
    } else {
      tokenizer = std::move(*t);
    }
  } else if (!o.tokenizer.empty()) {
    std::fprintf(stderr, "ltm-worker: --tokenizer %s has no tokenizer.json or vocab.json\n",
                 o.tokenizer.c_str());
    code = 2;
  }
  std::shared_ptr<Proposer> draft;
  if (code == 0 && o.speculative == "draft" && o.perplexity.empty()) {
    absl::StatusOr<std::shared_ptr<Proposer>> d = load_draft(o, rs);
    if (d.ok()) {
      draft = std::move(*d);
    } else {
      std::fprintf(stderr, "ltm-worker: %s\n", std::string(d.status().message()).c_str());
      code = exit_code_for_setup(d.status());
    }
  }
  if (code == 0) {
    if (!o.listen.empty()) {
      if (!tokenizer) {
        std::fprintf(stderr, "ltm-worker: serving needs a tokenizer (tokenizer.json, or vocab.json "
                             "+ merges.txt, in the model folder, or --tokenizer DIR)\n");
        code = 2;
      } else {
#ifndef LTM_GPU_ONLY
        code = serve(o, rs, *tokenizer, std::move(loading), descriptors, std::move(draft));
#endif
      }
    } else if (!o.perplexity.empty()) {
      code = perplexity_mode(o, rs, tokenizer ? &*tokenizer : nullptr);
    } else {
      code = one_shot(o, rs, tokenizer ? &*tokenizer : nullptr, std::move(draft));
    }
  }
  rs.engine->shutdown();
  return code;
}

}  // namespace ltm
