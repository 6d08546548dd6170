// Deadline-aware admission's pure parts (runtime/sched/admission.h): the step cost model fits
// what it observes and follows a change; the projection matches a plain step-by-step simulation
// of the scheduler's policy written here independently (the projection skips decode stretches in
// one jump); refusal (its own deadline, and the promises to others), shedding and victim choice
// decide as specified; Retry-After travels in the status.
#include "runtime/sched/admission.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace ltm {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(StepCostModel, FitsALineFromStepsOfDifferentSizes) {
  StepCostModel m;
  EXPECT_FALSE(m.ready());
  for (int i = 0; i < 40; ++i) {
    const int32_t tokens = 8 + (i * 7) % 57;
    m.observe(tokens, 0.010 + 0.002 * tokens);
  }
  EXPECT_TRUE(m.ready());
  // Within 1% (the slope's pull toward its prior is worth a few tenths of a percent here).
  EXPECT_NEAR(m.fixed_s(), 0.010, 0.0005);
  EXPECT_NEAR(m.per_token_s(), 0.002, 0.00002);
  EXPECT_NEAR(m.step_seconds(100), 0.210, 0.002);
}

TEST(StepCostModel, IsNotReadyBeforeItsMinimumAndUsesThePriorUntilThen) {
  StepCostModel m(0.5, 0.25);
  EXPECT_DOUBLE_EQ(m.step_seconds(4), 1.5);
  for (int i = 0; i + 1 < StepCostModel::kMinObservations; ++i) m.observe(4, 1.0);
  EXPECT_FALSE(m.ready());
  m.observe(4, 1.0);
  EXPECT_TRUE(m.ready());
}

TEST(StepCostModel, StepsOfOneSizeKeepThePriorSlopeAndFitTheirTime) {
  StepCostModel m(0.001, 0.003);
  for (int i = 0; i < 20; ++i) m.observe(32, 0.2);
  EXPECT_NEAR(m.step_seconds(32), 0.2, 1e-9);
  EXPECT_NEAR(m.per_token_s(), 0.003, 1e-9);
}

TEST(StepCostModel, FollowsAChangeOfSpeed) {
  StepCostModel m;
  for (int i = 0; i < 100; ++i) m.observe(16 + i % 17, 0.1 + 0.01 * (16 + i % 17));
  for (int i = 0; i < 200; ++i) m.observe(16 + i % 17, 0.01 + 0.001 * (16 + i % 17));
  EXPECT_NEAR(m.step_seconds(24), 0.01 + 0.001 * 24, 0.002);
}

TEST(StepCostModel, IgnoresNonsense) {
  StepCostModel m(0.5, 0.25);
  m.observe(0, 1.0);
  m.observe(4, -1.0);
  m.observe(4, std::nan(""));
  EXPECT_EQ(m.observations(), 0);
  EXPECT_DOUBLE_EQ(m.step_seconds(4), 1.5);
}

// Every step costs `a` + `b` x tokens (a model that has seen nothing answers its prior).
StepCostModel fixed_model(double a, double b) { return StepCostModel(a, b); }

TEST(Project, ARunningSequenceDecodesOneTokenAStep) {
  const Projection p = project(fixed_model(1, 0), {{1, 10}}, {}, {});
  ASSERT_EQ(p.running_s.size(), 1u);
  EXPECT_DOUBLE_EQ(p.running_s[0], 10);
}

TEST(Project, AWaitingRequestStartsWhenASlotFrees) {
  // One slot: the waiting request's prompt is computed in the step after the running one ends
  // (its first token sampled there), then two more tokens.
  const Projection p = project(fixed_model(1, 0), {{1, 5}}, {{4, 3}}, {1, 512});
  EXPECT_DOUBLE_EQ(p.running_s[0], 5);
  EXPECT_DOUBLE_EQ(p.waiting_s[0], 8);
}

TEST(Project, LongPromptsAreComputedInChunksOfTheTokenBudget) {
  const Projection p = project(fixed_model(1, 0), {}, {{10, 1}}, {8, 4});
  EXPECT_DOUBLE_EQ(p.waiting_s[0], 3);  // 4 + 4 + 2 tokens
}

TEST(Project, StepTimeGrowsWithTheTokensInTheStep) {
  // Step 1: 1 decode token + a 3-token prompt = 4 s; then the running one alone, 1 s a step.
  const Projection p = project(fixed_model(0, 1), {{1, 3}}, {{3, 1}}, {2, 512});
  EXPECT_DOUBLE_EQ(p.waiting_s[0], 4);
  EXPECT_DOUBLE_EQ(p.running_s[0], 6);
}

// The scheduler's policy one step at a time, with no shortcut: the reference for project().
Projection reference_projection(const StepCostModel& m, const std::vector<SeqLoad>& running,
                                const std::vector<SeqLoad>& waiting, ProjectionLimits lim) {
  struct S {
    int32_t compute, generate;
    bool waiting;
    size_t index;
  };
  Projection p;
  p.running_s.assign(running.size(), 0);
  p.waiting_s.assign(waiting.size(), 0);
  std::vector<S> live;
  for (size_t i = 0; i < running.size(); ++i)
    live.push_back({running[i].to_compute, running[i].to_generate, false, i});
  size_t next = 0;
  double t = 0;
  while (!live.empty() || next < waiting.size()) {
    int32_t budget = lim.max_batch_tokens, tokens = 0;
    std::vector<int32_t> chunk;
    for (S& s : live) {
      const int32_t c = std::min(std::max(1, s.compute), budget);
      chunk.push_back(c);
      budget -= c;
      tokens += c;
    }
    while (next < waiting.size() && budget > 0 &&
           static_cast<int32_t>(live.size()) < lim.max_running) {
      live.push_back({waiting[next].to_compute, waiting[next].to_generate, true, next});
      const int32_t c = std::min(waiting[next].to_compute, budget);
      chunk.push_back(c);
      budget -= c;
      tokens += c;
      ++next;
    }
    t += m.step_seconds(tokens);
    std::vector<S> still;
    for (size_t i = 0; i < live.size(); ++i) {
      S s = live[i];
      if (chunk[i] > 0) {
        if (s.compute > 0) {
          s.compute -= chunk[i];
          if (s.compute == 0) s.generate--;
        } else {
          s.generate--;
        }
      }
      if (s.generate == 0)
        (s.waiting ? p.waiting_s : p.running_s)[s.index] = t;
      else
        still.push_back(s);
    }
    live = still;
  }
  return p;
}

TEST(Project, MatchesAStepByStepSimulationOnRandomLoads) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const StepCostModel m = fixed_model(0.01 * uni(1, 10), 0.001 * uni(0, 10));
    const ProjectionLimits lim{uni(1, 8), uni(4, 64)};
    std::vector<SeqLoad> running, waiting;
    for (int i = uni(0, lim.max_running); i > 0; --i)
      running.push_back({uni(0, 1) ? 1 : uni(1, 40), uni(1, 30)});
    for (int i = uni(0, 10); i > 0; --i) waiting.push_back({uni(1, 80), uni(1, 30)});
    const Projection got = project(m, running, waiting, lim);
    const Projection want = reference_projection(m, running, waiting, lim);
    ASSERT_EQ(got.running_s.size(), want.running_s.size());
    ASSERT_EQ(got.waiting_s.size(), want.waiting_s.size());
    for (size_t i = 0; i < want.running_s.size(); ++i)
      ASSERT_NEAR(got.running_s[i], want.running_s[i], 1e-9) << "trial " << trial << " running " << i;
    for (size_t i = 0; i < want.waiting_s.size(); ++i)
      ASSERT_NEAR(got.waiting_s[i], want.waiting_s[i], 1e-9) << "trial " << trial << " waiting " << i;
  }
}

TEST(DecideAdmission, AdmitsWhatFitsAndRefusesWithTheOvershootAsRetryAfter) {
  EXPECT_TRUE(decide_admission(true, 10, 20, 0.9).admit);
  EXPECT_TRUE(decide_admission(true, 18, 20, 0.9).admit);
  const AdmissionVerdict v = decide_admission(true, 30, 20, 0.9);
  EXPECT_FALSE(v.admit);
  EXPECT_DOUBLE_EQ(v.retry_after_s, 14);  // ceil(30 / 0.9 - 20)
  EXPECT_FALSE(decide_admission(true, 18.5, 20, 0.9).admit);
  EXPECT_DOUBLE_EQ(decide_admission(true, 18.5, 20, 0.9).retry_after_s, 1);
}

TEST(DecideAdmission, AdmitsEverythingWithoutADeadlineOrBeforeTheModelIsReady) {
  EXPECT_TRUE(decide_admission(true, 1e9, kInf, 0.9).admit);
  EXPECT_TRUE(decide_admission(false, 1e9, 1, 0.9).admit);
}

TEST(HarmToOthers, RefusesOnlyToBreakAPromiseThatWouldBeKept) {
  // Every step costs 1 s + 0.5 s a token: a second sequence slows the running one down.
  const StepCostModel m = fixed_model(1, 0.5);
  const std::vector<SeqLoad> running = {{1, 10}};
  const Projection without = project(m, running, {}, {});
  const Projection with = project(m, running, {{1, 10}}, {});
  EXPECT_DOUBLE_EQ(without.running_s[0], 15);  // 10 steps of 1.5 s
  EXPECT_DOUBLE_EQ(with.running_s[0], 20);     // 10 steps of 2 s
  EXPECT_DOUBLE_EQ(harm_to_others(without, with, {16}, {}), 4);   // kept at 15, missed at 20
  EXPECT_DOUBLE_EQ(harm_to_others(without, with, {20}, {}), 0);   // kept either way
  EXPECT_DOUBLE_EQ(harm_to_others(without, with, {14}, {}), 0);   // missed either way
  EXPECT_DOUBLE_EQ(harm_to_others(without, with, {kInf}, {}), 0);  // no deadline
}

std::vector<size_t> indices(const std::vector<ShedChoice>& shed) {
  std::vector<size_t> out;
  for (const ShedChoice& c : shed) out.push_back(c.index);
  return out;
}

StepCostModel ready_model(double a, double b) {
  StepCostModel m(a, b);
  for (int i = 0; i < StepCostModel::kMinObservations; ++i) m.observe(1, a + b);
  return m;
}

TEST(ChooseShed, ShedsTheWaitingRequestThatCannotMakeIt) {
  // One slot, 1 s a step: the running one ends at 10, A at 15, B at 20.
  const StepCostModel m = ready_model(1, 0);
  const std::vector<ShedChoice> shed =
      choose_shed(m, {{1, 10}}, {{1, 5}, {1, 5}}, {100, 19}, {1, 512}, 1.0, 8);
  EXPECT_EQ(indices(shed), (std::vector<size_t>{1}));
  EXPECT_DOUBLE_EQ(shed[0].finish_s, 20);
  EXPECT_TRUE(choose_shed(m, {{1, 10}}, {{1, 5}, {1, 5}}, {100, 20}, {1, 512}, 1.0, 8).empty());
}

TEST(ChooseShed, ShedsOnlyWhatItMustOnceTheShedOnesTimeIsFreed) {
  // A cannot make it (15 > 12); without A, B ends at 15 <= 16 and stays.
  const StepCostModel m = ready_model(1, 0);
  EXPECT_EQ(indices(choose_shed(m, {{1, 10}}, {{1, 5}, {1, 5}}, {12, 16}, {1, 512}, 1.0, 8)),
            (std::vector<size_t>{0}));
  // Both hopeless: both go, but no more than asked for at once.
  EXPECT_EQ(indices(choose_shed(m, {{1, 10}}, {{1, 5}, {1, 5}}, {12, 12}, {1, 512}, 1.0, 8)),
            (std::vector<size_t>{0, 1}));
  EXPECT_EQ(indices(choose_shed(m, {{1, 10}}, {{1, 5}, {1, 5}}, {12, 12}, {1, 512}, 1.0, 1)),
            (std::vector<size_t>{0}));
}

TEST(ChooseShed, ShedsNothingBeforeTheModelIsReady) {
  EXPECT_TRUE(
      choose_shed(fixed_model(1, 0), {{1, 10}}, {{1, 5}}, {1}, {1, 512}, 1.0, 8).empty());
}

TEST(ChooseVictim, SparesTheNewestWhenItsSlackCannotAbsorbARecompute) {
  const std::vector<VictimCandidate> c = {{kInf, 1}, {5, 1}, {0.5, 1}};
  EXPECT_EQ(choose_victim(c, true), 1u);
  EXPECT_EQ(choose_victim(c, false), 2u);
  EXPECT_EQ(choose_victim({{0.1, 1}, {0.2, 1}}, true), 1u);  // nobody can: the newest, as before
  EXPECT_EQ(choose_victim({{0.1, 1}, {kInf, 1}}, true), 1u);  // no deadline: yields first
  EXPECT_EQ(choose_victim({{3, 1}}, true), 0u);
}

TEST(RetryAfter, TravelsInTheStatus) {
  const absl::Status s = with_retry_after(absl::ResourceExhaustedError("x"), 2.2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(retry_after_of(s).has_value());
  EXPECT_EQ(*retry_after_of(s), 3);
  EXPECT_FALSE(retry_after_of(absl::ResourceExhaustedError("queue full")).has_value());
}

}  // namespace
}  // namespace ltm
