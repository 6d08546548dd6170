#include "runtime/spec/replay.h"

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "runtime/spec/proposer.h"

namespace ltm {

ReplayResult replay_ngram(std::span<const int32_t> prompt, std::span<const int32_t> output,
                          std::span<const double> step_cost, int32_t max_drafts,
                          ReplayPolicy policy, double token_cost) {
  LTM_ASSERT(max_drafts >= 0 && step_cost.size() > static_cast<size_t>(max_drafts),
             "replay_ngram: ", step_cost.size(), " step costs for up to ", max_drafts, " drafts");
  ReplayResult res;
  const int64_t n = static_cast<int64_t>(output.size());
  if (n < 2) return res;
  NgramProposer proposer;
  DraftLength length(max_drafts);
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  tokens.push_back(output[0]);
  // Guesses checked at every step unless rows are dear (Scheduler::propose_drafts).
  const bool guesses = policy == ReplayPolicy::kDraftLength && max_drafts > 0 &&
                       best_draft_length(DraftLength::kProbeAcceptance, token_cost, max_drafts) > 0;
  std::vector<int32_t> guess, drafts;
  double cost = 0;
  const int32_t n_prompt = static_cast<int32_t>(prompt.size());
  for (int64_t pos = 1; pos < n;) {
    guess.clear();
    if (guesses) proposer.propose(tokens, n_prompt, max_drafts, &guess);
    // At most the tokens left after the step's own (Scheduler::propose_drafts: remaining - 1).
    const int32_t room = static_cast<int32_t>(n - pos - 1);
    const int32_t k = std::min(policy == ReplayPolicy::kOracle ? max_drafts
                                                               : length.next(token_cost, !guesses),
                               room);
    drafts.clear();
    if (k > 0 && guesses) {
      drafts.assign(guess.begin(), guess.begin() + std::min<ptrdiff_t>(k, std::ssize(guess)));
    } else if (k > 0) {
      proposer.propose(tokens, n_prompt, k, &drafts);
    }
    const std::span<const int32_t> next = output.subspan(static_cast<size_t>(pos));
    const int32_t accepted = accepted_prefix(drafts, next);
    if (policy == ReplayPolicy::kOracle) drafts.resize(static_cast<size_t>(accepted));
    const size_t rows = drafts.size() + 1;
    cost += rows == 1 ? 1.0 : step_cost[rows - 1];
    res.steps++;
    res.proposed += static_cast<int64_t>(drafts.size());
    res.accepted += accepted;
    // The accepted drafts and the token of the row after them.
    const int64_t take = std::min<int64_t>(accepted + 1, n - pos);
    if (guesses) {
      length.observe_guess(guess, next.first(static_cast<size_t>(take)));
    } else {
      length.observe(static_cast<int32_t>(drafts.size()), accepted);
    }
    tokens.insert(tokens.end(), output.begin() + pos, output.begin() + pos + take);
    pos += take;
  }
  res.speedup = static_cast<double>(n - 1) / cost;
  return res;
}

}  // namespace ltm
