// runtime/spec/replay.h: prompt lookup replayed on known tokens, against counts worked out by
// hand: a loop the proposer continues exactly (every step 5 drafts, all accepted), text whose
// guesses are always wrong (the oracle never drafts, DraftLength pays for its tries), the room
// left at the output's end, and the costs charged per step.
#include "runtime/spec/replay.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace ltm {
namespace {

// r rows cost 1 + c (r - 1) one-row steps, r = 1 .. 6.
std::vector<double> linear(double c) {
  std::vector<double> v;
  for (int r = 1; r <= 6; ++r) v.push_back(1 + c * (r - 1));
  return v;
}

// The loop 1 2 3 4 in the prompt, continued for 41 tokens of output.
std::vector<int32_t> loop_output(int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(1 + i % 4);
  return out;
}

TEST(SpecReplay, ALoopIsGuessedWholeAndTheLastStepKeepsToTheEnd) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 1, 2, 3, 4};
  const std::vector<int32_t> out = loop_output(41);
  // 40 decoded tokens: six steps of 5 drafts + 1 (pos 1 -> 37), then 3 tokens of room: 3 drafts.
  for (ReplayPolicy p : {ReplayPolicy::kOracle, ReplayPolicy::kDraftLength}) {
    const ReplayResult r = replay_ngram(prompt, out, linear(0), 5, p, 0.0);
    EXPECT_EQ(r.steps, 7);
    EXPECT_EQ(r.proposed, 33);
    EXPECT_EQ(r.accepted, 33);
    EXPECT_DOUBLE_EQ(r.speedup, 40.0 / 7);
  }
  // Charged by rows: six 6-row steps and one 4-row step at 0.25 a further row.
  const ReplayResult r = replay_ngram(prompt, out, linear(0.25), 5, ReplayPolicy::kOracle, 0.25);
  EXPECT_DOUBLE_EQ(r.speedup, 40.0 / (6 * 2.25 + 1.75));
  // At most 2 drafts a step: 40 tokens in 14 steps of 3 (the last has room for 0: 40 = 13 x 3 + 1).
  const ReplayResult two = replay_ngram(prompt, out, linear(0), 2, ReplayPolicy::kOracle, 0.0);
  EXPECT_EQ(two.steps, 14);
  EXPECT_EQ(two.accepted, 26);
}

// After the prompt {1, 2, 1, 3}: `pairs` pairs 1, first + i. After each 1 the proposer guesses
// what followed the previous 1, never what comes.
const std::vector<int32_t> kWrongPrompt = {1, 2, 1, 3};
std::vector<int32_t> always_wrong(int pairs, int32_t first) {
  std::vector<int32_t> out;
  for (int i = 0; i < pairs; ++i) {
    out.push_back(1);
    out.push_back(first + i);
  }
  return out;
}

TEST(SpecReplay, WrongGuessesCostDraftLengthAndNotTheOracle) {
  const std::vector<int32_t>& prompt = kWrongPrompt;
  const std::vector<int32_t> out = always_wrong(30, 4);
  const ReplayResult oracle =
      replay_ngram(prompt, out, linear(0.3), 5, ReplayPolicy::kOracle, 0.3);
  EXPECT_EQ(oracle.accepted, 0);
  EXPECT_EQ(oracle.steps, 59);
  EXPECT_DOUBLE_EQ(oracle.speedup, 1.0);
  const ReplayResult length =
      replay_ngram(prompt, out, linear(0.3), 5, ReplayPolicy::kDraftLength, 0.3);
  EXPECT_EQ(length.accepted, 0);
  EXPECT_GT(length.proposed, 0);  // its prior and its probes try
  EXPECT_EQ(length.steps, 59);
  EXPECT_LT(length.speedup, 1.0);
  EXPECT_GT(length.speedup, 0.8);  // and it stops trying
}

TEST(SpecReplay, CheckingEveryGuessFindsALoopSoonerAndProbesForNothing) {
  // Guesses always wrong for 40 tokens, then a loop of 4 the lookup continues.
  const std::vector<int32_t>& prompt = kWrongPrompt;
  std::vector<int32_t> out = always_wrong(20, 40);
  for (int i = 0; i < 60; ++i) out.push_back(5 + i % 4);
  const ReplayResult guesses =
      replay_ngram(prompt, out, linear(0.3), 5, ReplayPolicy::kDraftLength, 0.3);
  const ReplayResult drafted =
      replay_ngram(prompt, out, linear(0.3), 5, ReplayPolicy::kDraftedOnly, 0.3);
  EXPECT_LT(guesses.proposed - guesses.accepted, drafted.proposed - drafted.accepted);
  EXPECT_GT(guesses.speedup, drafted.speedup);
  EXPECT_LT(guesses.steps, drafted.steps);
}

TEST(SpecReplay, ShortOutputs) {
  const std::vector<int32_t> prompt = {7, 7, 7};
  EXPECT_EQ(replay_ngram(prompt, std::vector<int32_t>{7}, linear(0), 5, ReplayPolicy::kOracle, 0)
                .steps,
            0);
  // Two tokens: one decode step, no room for a draft.
  const ReplayResult r =
      replay_ngram(prompt, std::vector<int32_t>{7, 7}, linear(0), 5, ReplayPolicy::kOracle, 0);
  EXPECT_EQ(r.steps, 1);
  EXPECT_EQ(r.proposed, 0);
  EXPECT_DOUBLE_EQ(r.speedup, 1.0);
}

}  // namespace
}  // namespace ltm
