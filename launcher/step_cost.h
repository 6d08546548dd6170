// ltm-bench --step-cost: what one forward step (stage, logits and sampling, as Engine::step runs
// it) costs against the rows it computes, for the draft length of speculative decoding
// (runtime/spec/proposer.h: DraftLength's token_cost). Rank 0 alone (tp = pp = 1).
#pragma once

#include <cstdint>

#include "launcher/model_setup.h"

namespace ltm {

struct StepCostOptions {
  int32_t context = 96;    // tokens already in the cache before the step
  int32_t max_rows = 9;    // rows 1 .. max_rows
  int32_t rounds = 200;    // each a step of every row count, in rotating order
  bool batch = false;      // also r sequences of one row each (a decode batch of r)
  bool json = false;
};

// Prints each row count's median step time and its ratio to the one-row step, and the fitted
// token_cost ((t(r) - t(1)) / ((r - 1) t(1)), the median over r). Returns 0, or 2 when the
// context does not fit.
int run_step_cost(RankSetup& rs, int32_t block_size, const StepCostOptions& o);

}  // namespace ltm
