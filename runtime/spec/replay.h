// Prompt lookup replayed offline: what speculative decoding would gain on a sequence whose tokens
// are known (a greedy run's prompt and output), given what a step of r rows costs. The scheduler's
// own pieces (NgramProposer, DraftLength) pick and verify the drafts; each step is charged the
// cost of its rows, so the result is the decode's speedup counting the forward steps alone.
// `ltm-bench --step-cost --step-cost-replay FILE` measures the costs and replays a run's tokens;
// docs/benchmarks.md ("What bounds the last targets on this host") used it for the copy target.
#pragma once

#include <cstdint>
#include <span>

namespace ltm {

enum class ReplayPolicy {
  // The scheduler's with prompt lookup (Scheduler::propose_drafts): a guess of max_drafts every
  // step, its first DraftLength::next(token_cost, false) drafted, all of it checked against the
  // tokens that follow (DraftLength::observe_guess).
  kDraftLength,
  // DraftLength learning from the verified drafts alone, probing after failures: the scheduler's
  // with a proposer whose guesses cost (a draft model), and with prompt lookup before free guesses.
  kDraftedOnly,
  kOracle,  // exactly the drafts that will be accepted (at most max_drafts): the bound
};

struct ReplayResult {
  double speedup = 1;    // decode tokens over the steps' cost, one-row steps costing 1 each
  int64_t steps = 0;     // decode steps
  int64_t proposed = 0;  // drafts verified
  int64_t accepted = 0;  // drafts accepted
};

// output[0] is the prefill's token; output[1..] are decoded, at most max_drafts drafts a step,
// never past the output's end. step_cost[r - 1]: a step of r rows (one sequence, r - 1 drafts)
// over a one-row step, for r = 1 .. max_drafts + 1 (step_cost[0] is taken as 1); token_cost is
// what DraftLength weighs a draft at. An output of fewer than 2 tokens gives 1.
ReplayResult replay_ngram(std::span<const int32_t> prompt, std::span<const int32_t> output,
                          std::span<const double> step_cost, int32_t max_drafts,
                          ReplayPolicy policy, double token_cost);

}  // namespace ltm
