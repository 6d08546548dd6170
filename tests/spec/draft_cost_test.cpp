// DraftCostModel (runtime/spec/draft_cost.h): the price of a draft row from the scheduler's decode
// steps, robust to the noise of a shared machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "runtime/spec/draft_cost.h"

namespace ltm {
namespace {

double cost_of(int32_t rows) { return 100e-6 + 40e-6 * rows; }  // models/kjv-small on two cores

TEST(DraftCostModel, FallsBackUntilItHasSeenTwoSizesTwice) {
  DraftCostModel m;
  for (int i = 0; i < 20; ++i) m.observe(1, cost_of(1));
  EXPECT_FALSE(m.ready());  // one size: no slope
  EXPECT_DOUBLE_EQ(m.token_cost(1, 0.15), 0.15);
  m.observe(3, 3 * cost_of(3));  // a size's first step may be a cold one
  for (int i = 1; i < DraftCostModel::kSeenToTrust; ++i) {
    EXPECT_FALSE(m.ready());
    m.observe(3, cost_of(3));
  }
  EXPECT_TRUE(m.ready());
  EXPECT_NEAR(m.per_row_s(), 40e-6, 1e-9);  // from the lower of the first two on
}

// Noise only adds to a step: a small jitter, and one step in five descheduled for 300 us (more
// than two one-row steps), a cold first step of 5x. The fit, a low quantile of each size's times,
// stays within 25% of the line for every seed, and token_cost(1) within 0.08 of 40 / 140 (the
// draft lengths hardly change between 0.15 and 0.35: docs/benchmarks.md). A mean of these
// times would be ~60 us over the line at every size.
TEST(DraftCostModel, FitsTheCostUnderTheNoiseOfASharedMachine) {
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE(seed);
    DraftCostModel m;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> jitter(1.0, 1.05);
    std::uniform_int_distribution<int> rows(1, 6), spike(0, 4);
    m.observe(3, 5 * cost_of(3));
    for (int i = 0; i < 400; ++i) {
      const int r = rows(rng);
      m.observe(r, cost_of(r) * jitter(rng) + (spike(rng) == 0 ? 300e-6 : 0.0));
    }
    EXPECT_NEAR(m.per_row_s(), 40e-6, 40e-6 * 0.25);
    EXPECT_NEAR(m.fixed_s(), 100e-6, 100e-6 * 0.25);
    EXPECT_NEAR(m.token_cost(1, 0.15), 40.0 / 140.0, 0.08);
  }
}

// The cost of a row against a sequence's share grows with the batch: 8 sequences of a model
// whose rows cost 1 ms beside a 25 ms read of its weights (GPT-2-124M in f32 on two cores):
// 8 / 33; at 64, 64 / 89.
TEST(DraftCostModel, ARowCostsMoreOfAStepAsTheBatchGrows) {
  DraftCostModel m;
  for (int i = 0; i < 200; ++i) {
    const int r = 8 * (1 + i % 4);
    m.observe(r, 0.025 + 0.001 * r);
  }
  EXPECT_NEAR(m.token_cost(8, 0.15), 8.0 / 33.0, 0.01);
  EXPECT_NEAR(m.token_cost(64, 0.15), 64.0 / 89.0, 0.01);
  EXPECT_DOUBLE_EQ(DraftCostModel().token_cost(8, 0.15), 0.15);
}

// The CPU's cost is not one line: rows past a register tile of 6 start another pass over the
// weights. models/kjv-small's step times on two Zen 4 cores (ltm-bench --step-cost, us, 1..16
// rows): one sequence's draft costs ~0.29 of its step, eight sequences' a step and more. Priced
// by the sizes near the batch's; a line through every size would say 1.0 for one sequence too.
TEST(DraftCostModel, PricesARowWhereTheBatchIs) {
  const double t[17] = {0,   128, 165, 201, 244,  293,  341,  434, 473,
                        540, 775, 830, 894, 1164, 1222, 1287, 1443};
  DraftCostModel m;
  for (int i = 0; i < 400; ++i) m.observe(1 + i % 16, 1e-6 * t[1 + i % 16]);
  EXPECT_NEAR(m.token_cost(1, 0.15), t[2] / t[1] - 1, 0.06);
  EXPECT_GT(m.token_cost(8, 0.15), 0.95);
}

// When nothing drafts, every step is one size (16 sequences, no drafts); the slope fitted while
// drafts made bigger steps is kept, not lost: a row still costs what it did.
TEST(DraftCostModel, KeepsTheSlopeThroughARunOfStepsOfOneSize) {
  DraftCostModel m;
  for (int i = 0; i < 60; ++i) {
    const int r = 16 * (1 + i % 4);
    m.observe(r, 0.005 + 0.0014 * r);
  }
  const double before = m.token_cost(16, 0.15);
  for (int i = 0; i < 2000; ++i) m.observe(16, 0.005 + 0.0014 * 16);
  EXPECT_NEAR(m.token_cost(16, 0.15), before, 0.02);
  EXPECT_GT(m.token_cost(16, 0.15), 0.7);
}

// A real change of speed (the machine three times slower for good) is followed.
TEST(DraftCostModel, FollowsAChangeOfSpeed) {
  DraftCostModel m;
  for (int i = 0; i < 100; ++i) m.observe(1 + i % 4, cost_of(1 + i % 4));
  for (int i = 0; i < 200; ++i) m.observe(1 + i % 4, 3 * cost_of(1 + i % 4));
  EXPECT_NEAR(m.fixed_s() + m.per_row_s() * 2, 3 * cost_of(2), 3 * cost_of(2) * 0.1);
}

TEST(DraftCostModel, BucketsAreOrderedAndBounded) {
  int prev = -1;
  for (int32_t r = 1; r <= 40000; ++r) {
    const int b = DraftCostModel::bucket_of(r);
    EXPECT_GE(b, prev) << r;
    EXPECT_LT(b, DraftCostModel::kBuckets) << r;
    prev = b;
  }
  for (int32_t r = 1; r <= DraftCostModel::kExact; ++r)
    EXPECT_EQ(DraftCostModel::bucket_of(r), r - 1);
  EXPECT_NE(DraftCostModel::bucket_of(64), DraftCostModel::bucket_of(72));
  EXPECT_EQ(DraftCostModel::bucket_of(33), DraftCostModel::kExact);
}

TEST(DraftCostModel, IgnoresNonsense) {
  DraftCostModel m;
  m.observe(0, 1.0);
  m.observe(4, -1.0);
  m.observe(4, std::nan(""));
  for (int i = 0; i < 30; ++i) m.observe(1, cost_of(1));
  EXPECT_FALSE(m.ready());
}

}  // namespace
}  // namespace ltm
