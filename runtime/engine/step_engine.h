// StepEngine: what the scheduler needs of the engine, so that it can be driven by the real
// Engine (runtime/engine/engine.h, every rank of the group) or by a fake in the scheduler's
// tests (tests/sched/fake_engine.h). Rank 0's side only: plans go in, samples come back.
// Threading: one thread (the scheduler's step thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/sampling/sampler.h"
#include "runtime/engine/step_plan.h"
#include "runtime/model/lora.h"

namespace ltm {

struct StepOutput {
  // One per plan.input.logit_rows entry: the sampled token, or for a scoring row (target >= 0)
  // the target with its logprob; not ok() for a row whose logits were bad (NaN, +inf, all -inf),
  // which fails that row's request only.
  std::vector<SampleResult> samples;
  std::vector<float> logits;          // [rows, vocab_size] when plan.want_logits
  std::vector<RowLogprobs> logprobs;  // one per row when plan_wants_logprobs(plan)
};

// Whether any row of `plan` asks for RowLogprobs (a scoring row, or top_n >= 0).
bool plan_wants_logprobs(const StepPlan& plan);

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  // Posts `plan` to every rank and runs what it can of it; collect() returns the oldest
  // submitted plan's output. Plans are collected in the order they were submitted.
  virtual void submit(const StepPlan& plan) = 0;
  virtual StepOutput collect() = 0;
  virtual int in_flight() const = 0;  // submitted, not yet collected
  // Loads the PEFT adapter at `dir` as `id` (> 0, never used before) on every rank.
  virtual absl::Status load_adapter(int32_t id, const std::string& dir, int max_rank,
                                    LoraSummary* summary = nullptr) = 0;
  // Frees adapter `id` on every rank; no plan still to be submitted may name it.
  virtual void unload_adapter(int32_t id) = 0;
  // While idle: a plan with nothing to run, which resets the other ranks' idle timeout.
  virtual void keep_alive() = 0;
  // Seconds rank 0 spent in tensor-parallel all-reduces so far (step metrics).
  virtual double allreduce_seconds() const = 0;
};

}  // namespace ltm
