// Deadline-aware admission: what the scheduler can deliver, and what it therefore refuses, sheds
// or preempts. Pure functions and a small value type, so that every decision is unit-testable
// without an engine (tests/sched/admission_test.cpp).
//
// StepCostModel: seconds per engine step ~ a + b * tokens in the step, fitted online by weighted
// least squares over exponentially decayed sums (recent steps count most), its slope pulled
// toward a prior while the steps seen so far hardly differ in size. Until it has seen
// kMinObservations steps it is not ready, and nothing is refused or shed for lack of capacity (a
// cold server admits everything).
//
// project(): a fast simulation of the scheduler's own policy (running sequences first, oldest
// first, prompts in chunks within the per-step token budget, then waiting requests admitted in
// arrival order while a running slot is free) over the current loads, giving for every running
// and waiting sequence the seconds from now until its last token. Stretches of pure decode with
// no admission possible are skipped over in one jump, so a projection costs O(events x batch),
// not O(steps x batch). Ignored: KV-block pressure (preemption), micro-batches, attention's
// growth with context length.
//
// Decisions: refuse a new request whose projected finish (queued behind everything waiting)
// does not fit `fill` of the time to its deadline, or whose admission would make a request that
// meets its deadline miss it (its share of every later step slows the others), with a Retry-After
// of the overshoot; shed,
// first to last, waiting requests whose projected finish passed their deadline (each shed one
// frees the time of those behind it, so the projection is redone after each); choose as
// preemption victim the newest candidate that keeps its deadline after recomputing, else the
// newest.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace ltm {

class StepCostModel {
 public:
  static constexpr int64_t kMinObservations = 8;
  // The prior: a small fixed cost and per-token cost (optimistic, so that a cold server admits).
  StepCostModel(double prior_a_s = 0.001, double prior_b_s = 0.0001, double decay = 0.97);

  // One step that computed `tokens` tokens (prompt chunks + one per decoding sequence) in `s`.
  void observe(int32_t tokens, double s);
  // The fitted seconds of a step of `tokens` tokens (> 0).
  double step_seconds(int32_t tokens) const;
  double fixed_s() const { return a_; }
  double per_token_s() const { return b_; }
  int64_t observations() const { return n_; }
  bool ready() const { return n_ >= kMinObservations; }

 private:
  void refit();
  double prior_a_, prior_b_, decay_;
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;  // decayed weighted sums
  double a_, b_;
  int64_t n_ = 0;
};

// What one sequence still needs.
struct SeqLoad {
  int32_t to_compute = 0;   // tokens whose K/V are still to compute (a prompt, or a recompute)
  int32_t to_generate = 1;  // new tokens still to come (the first is sampled as to_compute ends)
};

struct ProjectionLimits {
  int32_t max_running = 64;
  int32_t max_batch_tokens = 512;
};

struct Projection {
  std::vector<double> running_s;  // seconds from now until each running sequence's last token
  std::vector<double> waiting_s;  // and each waiting one's
};

// `running` oldest first, `waiting` in admission order.
Projection project(const StepCostModel& model, const std::vector<SeqLoad>& running,
                   const std::vector<SeqLoad>& waiting, ProjectionLimits limits);

struct AdmissionVerdict {
  bool admit = true;
  double finish_s = 0;       // projected seconds until its last token
  double retry_after_s = 0;  // when refused: whole seconds, >= 1
};

// A request whose projected finish is `finish_s` from now and whose deadline is `deadline_in_s`
// from now (+inf: none). Admitted when the model is not ready, the deadline is infinite, or
// finish_s <= fill * deadline_in_s.
AdmissionVerdict decide_admission(bool model_ready, double finish_s, double deadline_in_s,
                                  double fill);

// Whether admitting a request breaks a promise: some running or waiting request whose projected
// finish meets its deadline (seconds from now, +inf: none) without the new one (`without`) misses
// it with it (`with`, the same sequences, the new one last among the waiting). Returns the worst
// overshoot in seconds (0: none harmed).
double harm_to_others(const Projection& without, const Projection& with,
                      const std::vector<double>& running_deadline_in_s,
                      const std::vector<double>& waiting_deadline_in_s);

struct ShedChoice {
  size_t index;     // into `waiting`
  double finish_s;  // its projected finish when it was chosen
};
// The waiting requests to shed now, by increasing index: repeatedly the first one whose
// projected finish is past `fill` of its time left (`deadline_in_s`, +inf: none), the
// projection redone without it; at most `max_shed`. Empty when the model is not ready.
std::vector<ShedChoice> choose_shed(const StepCostModel& model, const std::vector<SeqLoad>& running,
                                const std::vector<SeqLoad>& waiting,
                                const std::vector<double>& deadline_in_s, ProjectionLimits limits,
                                double fill, size_t max_shed);

struct VictimCandidate {
  // Seconds between its projected finish and its deadline (+inf: no deadline); what preemption
  // would add to its finish (the scheduler's estimate: waiting until another running sequence
  // ends and frees blocks, then recomputing its tokens).
  double slack_s = std::numeric_limits<double>::infinity();
  double recompute_s = 0;
};

// `candidates` oldest first (non-empty). The newest whose slack covers its recompute; when none
// does (or !deadline_aware), the newest.
size_t choose_victim(const std::vector<VictimCandidate>& candidates, bool deadline_aware);

// A ResourceExhausted status that carries a Retry-After (whole seconds) for the front doors.
absl::Status with_retry_after(absl::Status status, double retry_after_s);
std::optional<int64_t> retry_after_of(const absl::Status& status);

}  // namespace ltm
