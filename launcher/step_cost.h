// ltm-bench --step-cost: what one forward step (stage, logits and sampling, as Engine::step runs
// it) costs against the rows it computes, for the draft length of speculative decoding
// (runtime/spec/proposer.h: DraftLength's token_cost). Rank 0 alone (tp = pp = 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/model_setup.h"

namespace ltm {

struct StepCostOptions {
  int32_t context = 96;    // tokens already in the cache before the step
  int32_t max_rows = 9;    // rows 1 .. max_rows
  int32_t rounds = 200;    // each a step of every row count, in rotating order
  bool batch = false;      // also r sequences of one row each (a decode batch of r)
  bool json = false;
  // ltm-worker --output json files (greedy runs): their tokens replayed through prompt lookup at
  // the measured costs (runtime/spec/replay.h), at most min(SpecOptions' max_tokens, rows - 1)
  // drafts a step.
  std::vector<std::string> replay;
};

// Prints each row count's median step time and its ratio to the one-row step, and the fitted
// token_cost ((t(r) - t(1)) / ((r - 1) t(1)), the median over r); then, for each replay file,
// the decode speedup of an oracle's drafts and of DraftLength's at those costs. Returns 0, or 2
// when the context does not fit or a replay file cannot be read (checked before measuring).
int run_step_cost(RankSetup& rs, int32_t block_size, const StepCostOptions& o);

}  // namespace ltm
