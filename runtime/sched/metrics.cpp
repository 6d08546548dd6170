#include "runtime/sched/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"

namespace ltm {

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kOk: return "ok";
    case Outcome::kInvalid: return "invalid";
    case Outcome::kUnauthenticated: return "unauthenticated";
    case Outcome::kQueueFull: return "queue_full";
    case Outcome::kUnavailable: return "unavailable";
    case Outcome::kCancelled: return "cancelled";
    case Outcome::kError: return "error";
  }
  return "error";
}

Outcome outcome_of(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return Outcome::kOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition: return Outcome::kInvalid;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied: return Outcome::kUnauthenticated;
    case absl::StatusCode::kResourceExhausted: return Outcome::kQueueFull;
    case absl::StatusCode::kUnavailable: return Outcome::kUnavailable;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded: return Outcome::kCancelled;
    default: return Outcome::kError;
  }
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  LTM_ASSERT(std::is_sorted(bounds_.begin(), bounds_.end()));
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double value) {
  if (!std::isfinite(value)) return;
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mu_);
  counts_[i]++;
  sum_ += value;
  count_++;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) {
    acc += c;
    s.cumulative.push_back(acc);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

namespace {

// Latency buckets in seconds: 1 ms .. 2 min, roughly x2.5 apart.
std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}
// Per-step buckets: 100 us .. 10 s.
std::vector<double> step_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
          2.5, 10};
}

// Prometheus number: integers without a fraction, others with enough digits to round-trip.
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  std::string s = absl::StrFormat("%.15g", v);  // the shortest that reads back the same
  if (std::strtod(s.c_str(), nullptr) != v) s = absl::StrFormat("%.17g", v);
  return s;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  header(out, name, "histogram", help);
  const Histogram::Snapshot s = h.snapshot();
  for (size_t i = 0; i < s.bounds.size(); ++i)
    absl::StrAppend(&out, name, "_bucket{le=\"", num(s.bounds[i]), "\"} ", s.cumulative[i], "\n");
  absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", s.count, "\n");
  absl::StrAppend(&out, name, "_sum ", num(s.sum), "\n");
  absl::StrAppend(&out, name, "_count ", s.count, "\n");
}

void scalar(std::string& out, const char* name, const char* type, const char* help, double v) {
  header(out, name, type, help);
  absl::StrAppend(&out, name, " ", num(v), "\n");
}

}  // namespace

std::string prometheus_escape(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

ServeMetrics::ServeMetrics()
    : ttft_(latency_buckets()),
      itl_(latency_buckets()),
      e2e_(latency_buckets()),
      step_(step_buckets()),
      allreduce_(step_buckets()),
      spec_rate_({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}) {}

void ServeMetrics::set_build_info(BuildInfo info) {
  std::lock_guard<std::mutex> lock(mu_);
  build_ = std::move(info);
}

void ServeMetrics::set_stats_source(std::function<LiveStats()> source) {
  std::lock_guard<std::mutex> lock(mu_);
  source_ = std::move(source);
}

void ServeMetrics::count_request(FrontDoor door, Outcome outcome) {
  requests_[static_cast<int>(door)][static_cast<int>(outcome)].fetch_add(
      1, std::memory_order_relaxed);
}

uint64_t ServeMetrics::requests(FrontDoor door, Outcome outcome) const {
  return requests_[static_cast<int>(door)][static_cast<int>(outcome)].load(
      std::memory_order_relaxed);
}

std::string ServeMetrics::render() const {
  BuildInfo build;
  std::function<LiveStats()> source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    build = build_;
    source = source_;
  }
  const LiveStats live = source ? source() : LiveStats{};
  std::string out;
  out.reserve(8192);

  header(out, "ltm_build_info", "gauge", "Build and deployment of this server (always 1).");
  absl::StrAppend(&out, "ltm_build_info{version=\"", prometheus_escape(build.version),
                  "\",layout=\"", prometheus_escape(build.layout), "\",weight_dtype=\"",
                  prometheus_escape(build.weight_dtype), "\",kv_dtype=\"",
                  prometheus_escape(build.kv_dtype), "\"} 1\n");

  header(out, "ltm_requests_total", "counter",
         "Generation requests that ended, by front door and outcome.");
  const char* doors[2] = {"grpc", "http"};
  for (int d = 0; d < 2; ++d)
    for (int o = 0; o < kNumOutcomes; ++o)
      absl::StrAppend(&out, "ltm_requests_total{front_door=\"", doors[d], "\",outcome=\"",
                      outcome_name(static_cast<Outcome>(o)), "\"} ",
                      requests_[d][o].load(std::memory_order_relaxed), "\n");

  header(out, "ltm_requests_refused_total", "counter",
         "Generation requests refused at submission (429 / RESOURCE_EXHAUSTED), by reason.");
  const char* refuse_reasons[kNumRefuseReasons] = {"deadline", "queue_full"};
  for (int r = 0; r < kNumRefuseReasons; ++r)
    absl::StrAppend(&out, "ltm_requests_refused_total{reason=\"", refuse_reasons[r], "\"} ",
                    refused_[r].load(std::memory_order_relaxed), "\n");
  header(out, "ltm_requests_shed_total", "counter",
         "Waiting requests dropped before they cost compute (429 / RESOURCE_EXHAUSTED), by reason.");
  absl::StrAppend(&out, "ltm_requests_shed_total{reason=\"deadline\"} ",
                  shed_[static_cast<int>(ShedReason::kDeadline)].load(std::memory_order_relaxed),
                  "\n");

  scalar(out, "ltm_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         static_cast<double>(prompt_tokens_.load()));
  scalar(out, "ltm_generation_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(generation_tokens_.load()));
  scalar(out, "ltm_preemptions_total", "counter",
         "Sequences preempted (KV blocks freed, recomputed later) when the cache ran out.",
         static_cast<double>(live.preemptions));
  scalar(out, "ltm_steps_total", "counter", "Forward steps planned by the scheduler.",
         static_cast<double>(live.steps));
  scalar(out, "ltm_queue_depth", "gauge", "Requests waiting to be admitted.",
         live.engine.queue_depth);
  scalar(out, "ltm_running_sequences", "gauge", "Sequences in the running batch.",
         live.engine.running);
  scalar(out, "ltm_kv_blocks_used", "gauge", "KV cache blocks in use.",
         static_cast<double>(live.engine.kv_blocks_total - live.engine.kv_blocks_free));
  scalar(out, "ltm_kv_blocks_total", "gauge", "KV cache blocks in all.",
         static_cast<double>(live.engine.kv_blocks_total));
  scalar(out, "ltm_kv_blocks_cached", "gauge",
         "KV cache blocks no request holds, kept for prefix reuse (counted as free).",
         static_cast<double>(live.engine.kv_blocks_cached));
  scalar(out, "ltm_prefix_cache_query_tokens_total", "counter",
         "Context tokens of admitted requests that looked up the prefix cache.",
         static_cast<double>(live.prefix_cache_query_tokens));
  scalar(out, "ltm_prefix_cache_hit_tokens_total", "counter",
         "Of those, tokens whose KV was found cached and not computed.",
         static_cast<double>(live.prefix_cache_hit_tokens));
  scalar(out, "ltm_spec_proposed_tokens_total", "counter",
         "Speculative decoding: draft tokens the model verified.",
         static_cast<double>(live.spec_proposed_tokens));
  scalar(out, "ltm_spec_accepted_tokens_total", "counter",
         "Speculative decoding: of those, accepted (each saved a step of its sequence).",
         static_cast<double>(live.spec_accepted_tokens));
  scalar(out, "ltm_spec_steps_total", "counter",
         "Speculative decoding: sequence-steps that verified drafts.",
         static_cast<double>(live.spec_steps));

  histogram(out, "ltm_time_to_first_token_seconds",
            "From a request's arrival at the scheduler to its first generated token.", ttft_);
  histogram(out, "ltm_inter_token_latency_seconds",
            "Between consecutive generated tokens of one request.", itl_);
  histogram(out, "ltm_e2e_request_latency_seconds",
            "From a request's arrival at the scheduler to its end (any reason).", e2e_);
  histogram(out, "ltm_step_seconds", "Wall time of one scheduler step (plan, run, samples).",
            step_);
  histogram(out, "ltm_allreduce_seconds",
            "Time rank 0 spent in tensor-parallel all-reduces during one step.", allreduce_);
  histogram(out, "ltm_spec_request_acceptance_rate",
            "Speculative decoding, per finished request that verified drafts: accepted / proposed.",
            spec_rate_);
  return out;
}

}  // namespace ltm
