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
  std::vector<int32_t> drafts;
  double cost = 0;
  for (int64_t pos = 1; pos < n;) {
    // At most the tokens left after the step's own (Scheduler::propose_drafts: remaining - 1).
    const int32_t room = static_cast<int32_t>(n - pos - 1);
    const int32_t k = std::min(policy == ReplayPolicy::kOracle ? max_drafts
                                                               : length.next(token_cost),
                               room);
    drafts.clear();
    if (k > 0) proposer.propose(tokens, static_cast<int32_t>(prompt.size()), k, &drafts);
    const int32_t accepted = accepted_prefix(drafts, output.subspan(static_cast<size_t>(pos)));
    if (policy == ReplayPolicy::kOracle) drafts.resize(static_cast<size_t>(accepted));
    const size_t rows = drafts.size() + 1;
    cost += rows == 1 ? 1.0 : step_cost[rows - 1];
    length.observe(static_cast<int32_t>(drafts.size()), accepted);
    res.steps++;
    res.proposed += static_cast<int64_t>(drafts.size());
    res.accepted += accepted;
    // The accepted drafts and the token of the row after them.
    const int64_t take = std::min<int64_t>(accepted + 1, n - pos);
    tokens.insert(tokens.end(), output.begin() + pos, output.begin() + pos + take);
    pos += take;
  }
  res.speedup = static_cast<double>(n - 1) / cost;
  return res;
}

}  // namespace ltm
