// The scheduler's private types, shared by its files (scheduler.cpp: planning and results;
// scheduler_admission.cpp: deadline-aware admission; scheduler_spec.cpp: speculative decoding).
// Step thread only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/sched/scheduler.h"
#include "runtime/spec/proposer.h"

namespace ltm {

struct Scheduler::Sequence {
  uint64_t id = 0;
  GenerationRequest req;
  EventCallback on_event;
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t n_prompt = 0;
  int32_t n_computed = 0;       // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;  // block table
  std::unique_ptr<StreamingDecoder> decoder;
  std::unique_ptr<StopMatcher> stop;
  // Prompt positions [0, prompt_rows_done) whose row (logits or logprobs of the next prompt
  // token) has been reported. A sequence preempted during its prefill recomputes them; they
  // are not reported twice.
  int32_t prompt_rows_done = 0;
  std::chrono::steady_clock::time_point t_submit, t_first_token, t_last_token;
  bool finished = false;
  bool busy = false;  // in a plan that is still in flight
  int32_t adapter_id = 0;    // LoRA adapter (0: the base model); kept through preemption
  // Prefix cache: the chain's root (adapter and its load, KV dtype), the chain through its
  // first n_registered blocks (registered, or equal to registered ones), and whether it may
  // reuse cached blocks (not when it scores its prompt: those rows must be computed).
  uint64_t salt = 0;
  BlockAllocator::Chain chain;
  int32_t n_registered = 0;
  bool reuse = true;
  absl::Status abort;        // set: end with kError and this status at the next reap
  // This step's share (filled while planning).
  int32_t chunk = 0;
  // Speculative decoding (runtime/sched/scheduler_spec.cpp): this step's drafts, which follow
  // `tokens` (the step computes chunk = 1 + drafts.size() rows: its last token and the drafts),
  // how many of them were accepted so far while its rows are read back, and whether a row was
  // rejected (the rows after it are thrown away); the draft length control and the request's
  // totals.
  std::vector<int32_t> drafts;
  // Sampled drafts (runtime/spec/sampled_drafts.h): the distribution q each draft was drawn from,
  // vocab_size floats per draft; empty for deterministic drafts (prompt lookup, greedy).
  std::vector<float> draft_probs;
  int32_t drafts_accepted = 0;
  bool draft_rejected = false;
  DraftLength draft_length{0};
  // A free proposer's guess (Proposer::free_guesses), made when `tokens` held guess_at tokens:
  // the drafts are its first k (drafts_guessed), and the tokens that come after it are checked
  // against it whole.
  std::vector<int32_t> guess;
  int32_t guess_at = 0;
  bool drafts_guessed = false;
  int64_t spec_proposed = 0, spec_accepted = 0;
  int32_t generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  SeqLoad load() const {
    return {static_cast<int32_t>(tokens.size()) - n_computed,
            std::max(1, req.max_new_tokens - generated())};
  }
};

// One plan's worth of sequences, remembered until its samples come back.
struct Scheduler::InFlightPlan {
  struct Row {
    Sequence* seq;
    bool sample;  // the row a new token is drawn from (else a prompt-logits row)
    int32_t spec_row = -1;  // >= 0: the i-th of a sequence's 1 + drafts rows (speculative)
  };
  std::vector<Sequence*> batch;
  std::vector<Row> rows;  // one per logit row
  bool want_logits = false;
  int32_t tokens = 0;  // computed by the plan
  bool decode_only = true;  // every sequence in it decodes (no prompt chunk): decode_cost_
  std::chrono::steady_clock::time_point t_submit;
};

}  // namespace ltm
