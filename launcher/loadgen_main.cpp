// ltm-loadgen: load test of a running ltm server through the public streaming API.
//
//   ltm-loadgen --server HOST:PORT --concurrency 16 --duration-s 30 --prompt-tokens 128
//               --max-new-tokens 64 [--requests N] [--json]
//
// `concurrency` client threads each run GenerateStream calls back to back. No call starts after
// --duration-s or once --requests calls have started; calls in flight then finish (each bounded
// by --timeout-s), so a run takes at most duration + timeout. Prompts are random token ids (seeded,
// ids below the model's vocab size, read with GetModelInfo) of exactly --prompt-tokens tokens;
// --ignore-eos is on by default, so each successful call generates max_new_tokens tokens.
//
// Open loop (--rate R): instead of `concurrency` threads, calls start at Poisson arrival times
// (R calls/s on average, seeded by --seed), each on its own thread, whatever is in flight, until
// --duration-s or --requests; each call's deadline is --deadline (default --timeout-s).
//
// Reports: calls by status code, generated tokens/s and requests/s over the run's wall time, time
// to first token (call start -> first message with a token) and inter-token latency (gap between
// messages divided by the tokens in the later one), p50/p90/p99/mean in ms. Text, or --json.
// Goodput: tokens received within the run's window (--duration-s) by calls that completed (OK,
// hence within their deadline), per second of the window; beside it the window's throughput (all
// tokens received in it). Calls are also counted as completed, refused (RESOURCE_EXHAUSTED before
// any token), shed (the same, with "shed" in its message: dropped while waiting), missed after
// their first token (a token came, then the call failed: mostly DEADLINE_EXCEEDED), and missed
// before it.
// Exit codes: 0 the run completed (even with failed calls); 1 the server could not be reached;
// 2 bad command line.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include "common/signals.h"
#include "launcher/cli_parse.h"
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/version.h"
#include "launcher/client_connection.h"
#include "ltm/v1/ltm.grpc.pb.h"

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string server;
  int concurrency = 8;
  double duration_s = 10;
  int64_t requests = 0;  // 0: bounded by time only
  int prompt_tokens = 32;
  int max_new_tokens = 64;
  float temperature = 0;  // greedy: the cheapest sampling, and reproducible
  bool stop_at_eos = false;
  double timeout_s = 60;
  uint64_t seed = 1;
  bool json = false;
  std::vector<std::string> adapters;  // LoRA adapters: call thread t uses adapters[t % n] ("" = base)
  double rate = 0;                     // > 0: open loop, calls/s (Poisson arrivals)
  double deadline_s = 0;               // > 0: each call's deadline (else timeout_s)
};

const char* code_name(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",         "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",      "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN_CODE";
}

// What one thread measured; merged at the end.
struct Samples {
  std::vector<double> ttft_ms;
  std::vector<double> itl_ms;
  std::vector<double> request_ms;
  std::map<std::string, int64_t> by_code;
  int64_t generated_tokens = 0;
  int64_t ok = 0;
  // Goodput (see the head of this file).
  int64_t window_tokens = 0, good_window_tokens = 0;
  int64_t refused = 0, shed = 0, missed_after_first = 0, missed_before_first = 0, got_first = 0;
};

struct Summary {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  size_t n = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) {  // nearest rank
    size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
  };
  s.p50 = rank(0.50);
  s.p90 = rank(0.90);
  s.p99 = rank(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void run_one(ltm::v1::Generation::Stub& stub, const ltm::Connection& conn, const Options& o,
             int64_t vocab, std::mt19937_64& rng, Samples& out, const std::string& adapter,
             Clock::time_point window_end) {
  ltm::v1::GenerateRequest req;
  req.set_adapter(adapter);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  for (int i = 0; i < o.prompt_tokens; ++i) req.add_prompt_token_ids(id(rng));
  req.set_max_new_tokens(o.max_new_tokens);
  req.set_temperature(o.temperature);
  req.set_seed(rng());
  req.set_ignore_eos(!o.stop_at_eos);

  grpc::ClientContext ctx;
  const double deadline_s = o.deadline_s > 0 ? o.deadline_s : o.timeout_s;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(static_cast<int64_t>(deadline_s * 1e6)));
  conn.prepare(ctx);
  const Clock::time_point start = Clock::now();
  Clock::time_point prev = start;
  bool first = true;
  int64_t tokens = 0, in_window = 0;
  std::vector<double> ttft, itl;
  auto reader = stub.GenerateStream(&ctx, req);
  ltm::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    const Clock::time_point now = Clock::now();
    const int k = msg.token_ids_size();
    if (k == 0) continue;
    if (first) {
      ttft.push_back(ms(now - start));
      first = false;
      for (int i = 1; i < k; ++i) itl.push_back(0.0);  // arrived together with the first
    } else {
      for (int i = 0; i < k; ++i) itl.push_back(ms(now - prev) / k);
    }
    prev = now;
    tokens += k;
    if (now <= window_end) in_window += k;
  }
  const grpc::Status status = reader->Finish();
  out.by_code[code_name(status.error_code())]++;
  out.window_tokens += in_window;
  if (tokens > 0) out.got_first++;
  if (!status.ok()) {  // only successful calls go into the latency numbers
    if (tokens > 0)
      out.missed_after_first++;
    else if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED)
      out.missed_before_first++;
    else if (status.error_message().find("shed") != std::string::npos)
      out.shed++;
    else
      out.refused++;
    return;
  }
  out.good_window_tokens += in_window;
  out.ok++;
  out.generated_tokens += tokens;
  out.request_ms.push_back(ms(Clock::now() - start));
  out.ttft_ms.insert(out.ttft_ms.end(), ttft.begin(), ttft.end());
  out.itl_ms.insert(out.itl_ms.end(), itl.begin(), itl.end());
}

}  // namespace

int main(int argc, char** argv) {
  ltm::ignore_sigpipe();  // a vanished peer fails a send, not the process (common/signals.h)
  Options o;
  po::options_description desc(
      "Usage: ltm-loadgen --server HOST:PORT [--concurrency C] [--duration-s S] [--requests N]\n"
      "                   [--prompt-tokens P] [--max-new-tokens M] [--rate R] [--deadline S]\n"
      "                   [--json]\nOptions");
  ltm::ConnectionOptions conn_opts;
  ltm::add_connection_options(desc, &conn_opts);
  desc.add_options()
      ("help,h", "print this help")
      ("version", "print the version and exit")
      ("concurrency", po::value(&o.concurrency)->default_value(o.concurrency), "calls in flight")
      ("duration-s", po::value(&o.duration_s)->default_value(o.duration_s),
       "start no call after this many seconds (at most 86400)")
      ("requests", po::value(&o.requests)->default_value(o.requests),
       "start at most this many calls (0: no limit but the duration)")
      ("prompt-tokens", po::value(&o.prompt_tokens)->default_value(o.prompt_tokens),
       "prompt length in tokens")
      ("max-new-tokens", po::value(&o.max_new_tokens)->default_value(o.max_new_tokens),
       "tokens to generate per call")
      ("temperature", po::value(&o.temperature)->default_value(o.temperature),
       "sampling temperature (0 = greedy)")
      ("stop-at-eos", po::bool_switch(&o.stop_at_eos), "let calls end at end-of-text")
      ("timeout-s", po::value(&o.timeout_s)->default_value(o.timeout_s), "deadline of each call")
      ("seed", po::value(&o.seed)->default_value(o.seed), "seed of the prompts and sampling")
      ("json", po::bool_switch(&o.json), "print the report as JSON")
      ("rate", po::value(&o.rate)->default_value(0.0),
       "open loop: start calls at Poisson arrivals, this many per second on average "
       "(0: closed loop, --concurrency threads)")
      ("deadline", po::value(&o.deadline_s)->default_value(0.0),
       "each call's deadline in seconds (0: --timeout-s)")
      ("adapters", po::value<std::string>(), "LoRA adapters, comma-separated: call thread t names the (t mod n)-th (an empty entry: the base model)");
  try {
    po::variables_map vm;
    if (ltm::parse_cli(argc, argv, desc, "", "ltm-loadgen", &vm) == ltm::CliStart::kDone)
      return 0;
    if (o.concurrency < 1 || o.concurrency > 4096)
      throw po::error("--concurrency must be in 1 .. 4096");
    if (!(o.duration_s > 0 && o.duration_s <= 86400))
      throw po::error("--duration-s must be in (0, 86400]");
    if (o.requests < 0) throw po::error("--requests must be >= 0");
    if (o.prompt_tokens < 1) throw po::error("--prompt-tokens must be >= 1");
    if (o.max_new_tokens < 1) throw po::error("--max-new-tokens must be >= 1");
    if (!(o.timeout_s > 0)) throw po::error("--timeout-s must be > 0");
    if (!(o.rate >= 0 && o.rate <= 100000)) throw po::error("--rate must be in [0, 100000]");
    if (!(o.deadline_s >= 0)) throw po::error("--deadline must be >= 0");
    if (vm.count("adapters")) {
      const std::string list = vm["adapters"].as<std::string>();
      size_t begin = 0;
      for (;;) {
        const size_t comma = list.find(',', begin);
        o.adapters.push_back(list.substr(begin, comma == std::string::npos ? comma : comma - begin));
        if (comma == std::string::npos) break;
        begin = comma + 1;
      }
    }
  } catch (const po::error& e) {
    std::cerr << "ltm-loadgen: " << e.what() << "\n\n" << desc << "\n";
    return 2;
  }

  o.server = conn_opts.server;
  ltm::Connection conn;
  std::string conn_error;
  if (!ltm::connect(conn_opts, &conn, &conn_error)) {
    std::fprintf(stderr, "ltm-loadgen: %s\n", conn_error.c_str());
    return 2;
  }
  std::unique_ptr<ltm::v1::Generation::Stub> stub = ltm::v1::Generation::NewStub(conn.channel);
  ltm::v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);  // the server may still be starting
    conn.prepare(ctx);
    grpc::Status s = stub->GetModelInfo(&ctx, ltm::v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      std::fprintf(stderr, "ltm-loadgen: cannot reach %s: %s: %s\n", o.server.c_str(),
                   code_name(s.error_code()), s.error_message().c_str());
      return 1;
    }
  }
  const int64_t vocab = std::max<int64_t>(1, info.vocab_size());

  std::atomic<int64_t> started{0};
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point stop_at =
      t0 + std::chrono::microseconds(static_cast<int64_t>(o.duration_s * 1e6));
  auto adapter_of = [&](size_t i) {
    return o.adapters.empty() ? std::string() : o.adapters[i % o.adapters.size()];
  };
  std::vector<Samples> per_thread;
  std::vector<std::thread> threads;
  if (o.rate > 0) {
    // Open loop: one thread per call, started at its arrival time whatever is in flight.
    std::mt19937_64 arrivals(o.seed);
    std::exponential_distribution<double> gap(o.rate);
    std::deque<Samples> per_call;  // stable addresses as it grows
    Clock::time_point at = t0;
    for (int64_t i = 0; o.requests == 0 || i < o.requests; ++i) {
      at += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(gap(arrivals)));
      if (at >= stop_at) break;
      std::this_thread::sleep_until(at);
      Samples* out = &per_call.emplace_back();
      const uint64_t call_seed = o.seed * 1000003u + static_cast<uint64_t>(i);
      threads.emplace_back([&, out, call_seed, i] {
        std::mt19937_64 rng(call_seed);
        run_one(*stub, conn, o, vocab, rng, *out, adapter_of(static_cast<size_t>(i)), stop_at);
      });
    }
    for (std::thread& t : threads) t.join();
    per_thread.assign(per_call.begin(), per_call.end());
  } else {
    per_thread.resize(static_cast<size_t>(o.concurrency));
    for (int t = 0; t < o.concurrency; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(t));
        while (Clock::now() < stop_at) {
          if (o.requests > 0 && started.fetch_add(1) >= o.requests) break;
          run_one(*stub, conn, o, vocab, rng, per_thread[static_cast<size_t>(t)],
                  adapter_of(static_cast<size_t>(t)), stop_at);
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  Samples all;
  for (Samples& s : per_thread) {
    all.ttft_ms.insert(all.ttft_ms.end(), s.ttft_ms.begin(), s.ttft_ms.end());
    all.itl_ms.insert(all.itl_ms.end(), s.itl_ms.begin(), s.itl_ms.end());
    all.request_ms.insert(all.request_ms.end(), s.request_ms.begin(), s.request_ms.end());
    for (auto& [code, n] : s.by_code) all.by_code[code] += n;
    all.generated_tokens += s.generated_tokens;
    all.ok += s.ok;
    all.window_tokens += s.window_tokens;
    all.good_window_tokens += s.good_window_tokens;
    all.refused += s.refused;
    all.shed += s.shed;
    all.missed_after_first += s.missed_after_first;
    all.missed_before_first += s.missed_before_first;
    all.got_first += s.got_first;
  }
  // The window: --duration-s, or until the last call started when --requests ended it sooner.
  const double window_s = std::min(o.duration_s, wall_s);
  const double goodput = static_cast<double>(all.good_window_tokens) / window_s;
  const double window_tokens_per_s = static_cast<double>(all.window_tokens) / window_s;
  const double missed_after_first_frac =
      all.got_first > 0 ? static_cast<double>(all.missed_after_first) / all.got_first : 0.0;
  int64_t total = 0;
  for (auto& [code, n] : all.by_code) total += n;
  const Summary ttft = summarize(all.ttft_ms), itl = summarize(all.itl_ms),
                latency = summarize(all.request_ms);
  const double tokens_per_s = static_cast<double>(all.generated_tokens) / wall_s;
  const double requests_per_s = static_cast<double>(all.ok) / wall_s;

  if (o.json) {
    auto js = [](const Summary& s) {
      return nlohmann::json{{"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"mean", s.mean},
                            {"n", s.n}};
    };
    nlohmann::json j = {
        {"server", o.server},
        {"model", info.model_name()},
        {"concurrency", o.concurrency},
        {"prompt_tokens", o.prompt_tokens},
        {"max_new_tokens", o.max_new_tokens},
        {"wall_s", wall_s},
        {"requests", total},
        {"requests_ok", all.ok},
        {"by_code", all.by_code},
        {"generated_tokens", all.generated_tokens},
        {"generated_tokens_per_s", tokens_per_s},
        {"requests_per_s", requests_per_s},
        {"time_to_first_token_ms", js(ttft)},
        {"inter_token_latency_ms", js(itl)},
        {"request_latency_ms", js(latency)},
        {"mode", o.rate > 0 ? "open" : "closed"},
        {"rate", o.rate},
        {"deadline_s", o.deadline_s > 0 ? o.deadline_s : o.timeout_s},
        {"window_s", window_s},
        {"window_tokens_per_s", window_tokens_per_s},
        {"goodput_tokens_per_s", goodput},
        {"calls_completed", all.ok},
        {"calls_refused", all.refused},
        {"calls_shed", all.shed},
        {"calls_missed_after_first_token", all.missed_after_first},
        {"calls_missed_before_first_token", all.missed_before_first},
        {"calls_with_first_token", all.got_first},
        {"missed_after_first_token_fraction", missed_after_first_frac},
    };
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("server %s  model %s  concurrency %d  prompt %d tokens  max_new_tokens %d\n",
              o.server.c_str(), info.model_name().c_str(), o.concurrency, o.prompt_tokens,
              o.max_new_tokens);
  std::printf("requests: %lld in %.2f s, %lld ok", static_cast<long long>(total), wall_s,
              static_cast<long long>(all.ok));
  for (auto& [code, n] : all.by_code)
    if (code != "OK") std::printf(", %s %lld", code.c_str(), static_cast<long long>(n));
  std::printf("\nthroughput: %.1f generated tokens/s, %.2f requests/s\n", tokens_per_s,
              requests_per_s);
  std::printf("goodput: %.1f tokens/s of completed calls in the %.1f s window (all tokens in it: "
              "%.1f/s); calls: %lld completed, %lld refused, %lld shed, %lld missed after their "
              "first token (%.1f%% of %lld that got one), %lld missed before\n",
              goodput, window_s, window_tokens_per_s, static_cast<long long>(all.ok),
              static_cast<long long>(all.refused), static_cast<long long>(all.shed),
              static_cast<long long>(all.missed_after_first), 100 * missed_after_first_frac,
              static_cast<long long>(all.got_first),
              static_cast<long long>(all.missed_before_first));
  auto line = [](const char* name, const Summary& s) {
    std::printf("%-28s p50 %8.2f  p90 %8.2f  p99 %8.2f  mean %8.2f  (n=%zu)\n", name, s.p50,
                s.p90, s.p99, s.mean, s.n);
  };
  line("time to first token (ms)", ttft);
  line("inter-token latency (ms)", itl);
  line("request latency (ms)", latency);
  return 0;
}
