// Serving metrics in the Prometheus text exposition format (version 0.0.4), written by hand.
//
// One ServeMetrics per server process (rank 0). The front doors count their requests by outcome
// (count_request); the scheduler observes latencies and token counts as it runs (observe_*); the
// live gauges (queue, running, KV blocks, preemptions) are read from a stats callback when the
// text is rendered, so they are never stale. render() is what GET /metrics returns.
//
// Names (all prefixed ltm_):
//   requests_total{front_door="grpc|http",outcome=...}   counter
//     outcome: ok | invalid | unauthenticated | queue_full | unavailable | cancelled | error
//   requests_refused_total{reason="deadline|queue_full"}  counter: refused at submission
//   requests_shed_total{reason="deadline"}                counter: dropped while waiting
//   prompt_tokens_total, generation_tokens_total          counters
//   preemptions_total, steps_total                         counters (from the stats callback)
//   prefix_cache_query_tokens_total, prefix_cache_hit_tokens_total   counters (stats callback)
//   spec_proposed_tokens_total, spec_accepted_tokens_total, spec_steps_total   counters (stats
//     callback): speculative decoding's drafts verified and accepted
//   spec_request_acceptance_rate   histogram: per finished request that verified drafts
//   queue_depth, running_sequences, kv_blocks_used, kv_blocks_total, kv_blocks_cached   gauges
//   time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds,
//   step_seconds, allreduce_seconds (per step, rank 0's TP all-reduces)   histograms
//   build_info{version,layout,weight_dtype,kv_dtype} 1     gauge
//
// Threading: every method is thread-safe. Counters are atomics; a histogram takes a short lock
// per observation (a few per generated token at most).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/sched/engine_info.h"

namespace ltm {

enum class FrontDoor { kGrpc = 0, kHttp = 1 };
enum class Outcome {
  kOk = 0,
  kInvalid,          // the request was refused as malformed or out of range
  kUnauthenticated,  // missing or wrong API key
  kQueueFull,        // the scheduler's queue was full (429 / RESOURCE_EXHAUSTED)
  kUnavailable,      // draining, shut down, or the engine failed
  kCancelled,        // the client went away or its deadline passed
  kError,            // anything else
};
inline constexpr int kNumOutcomes = 7;
const char* outcome_name(Outcome o);
// The outcome a request that ended with this status code counts as.
Outcome outcome_of(absl::StatusCode code);

// Why the scheduler refused a request at submission, or shed a waiting one before it cost compute.
enum class RefuseReason { kDeadline = 0, kQueueFull };
inline constexpr int kNumRefuseReasons = 2;
enum class ShedReason { kDeadline = 0 };
inline constexpr int kNumShedReasons = 1;

// Cumulative histogram with fixed upper bounds (the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct BuildInfo {
  std::string version;       // e.g. "0.1.0"
  std::string layout;        // e.g. "tp2pp2"
  std::string weight_dtype;  // "f32" | "bf16" | "fp16"
  std::string kv_dtype;
};

// The live numbers the gauges show (EngineStats plus the scheduler's running totals).
struct LiveStats {
  EngineStats engine;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t prefix_cache_query_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t spec_proposed_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_steps = 0;
};

class ServeMetrics {
 public:
  ServeMetrics();

  void set_build_info(BuildInfo info);
  // Called by render(); must be thread-safe and cheap. Unset: the gauges read 0.
  void set_stats_source(std::function<LiveStats()> source);

  void count_request(FrontDoor door, Outcome outcome);
  uint64_t requests(FrontDoor door, Outcome outcome) const;
  void count_refused(RefuseReason r) {
    refused_[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  void count_shed(ShedReason r) { shed_[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t refused(RefuseReason r) const { return refused_[static_cast<int>(r)].load(); }
  uint64_t shed(ShedReason r) const { return shed_[static_cast<int>(r)].load(); }

  // From the scheduler's step thread.
  void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token_latency(double seconds) { itl_.observe(seconds); }
  void observe_request_latency(double seconds) { e2e_.observe(seconds); }
  void observe_step(double step_seconds, double allreduce_seconds) {
    step_.observe(step_seconds);
    allreduce_.observe(allreduce_seconds);
  }
  // A finished request that verified `proposed` > 0 drafts, `accepted` of them accepted.
  void observe_request_spec(int64_t proposed, int64_t accepted) {
    if (proposed > 0) spec_rate_.observe(static_cast<double>(accepted) / proposed);
  }
  void add_prompt_tokens(int64_t n) { prompt_tokens_.fetch_add(n, std::memory_order_relaxed); }
  void add_generation_tokens(int64_t n) {
    generation_tokens_.fetch_add(n, std::memory_order_relaxed);
  }

  // The whole exposition, "# HELP" / "# TYPE" lines included, ending in a newline.
  std::string render() const;

 private:
  std::array<std::array<std::atomic<uint64_t>, kNumOutcomes>, 2> requests_{};
  std::array<std::atomic<uint64_t>, kNumRefuseReasons> refused_{};
  std::array<std::atomic<uint64_t>, kNumShedReasons> shed_{};
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generation_tokens_{0};
  Histogram ttft_, itl_, e2e_, step_, allreduce_, spec_rate_;
  mutable std::mutex mu_;  // guards build_ and source_
  BuildInfo build_;
  std::function<LiveStats()> source_;
};

// A Prometheus label value with \, " and newline escaped.
std::string prometheus_escape(const std::string& value);

}  // namespace ltm
