// Speculative decoding's pieces without a model: prompt lookup's guesses, the draft length's
// choice and adaptation, and the accepted prefix.
#include "runtime/spec/proposer.h"

#include <gtest/gtest.h>

#include <vector>

namespace ltm {
namespace {

std::vector<int32_t> propose(NgramProposer& p, const std::vector<int32_t>& tokens, int k) {
  std::vector<int32_t> out;
  p.propose(tokens, static_cast<int32_t>(tokens.size()), k, &out);
  return out;
}

TEST(NgramProposer, ContinuesTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  NgramProposer p(3, 2);
  // The suffix "1 2 3" (the longest n-gram looked up: 3) occurred at 0 and 6: the guess is what
  // followed the latest, "7 8", then whatever follows.
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3};
  EXPECT_EQ(propose(p, t, 2), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(propose(p, t, 5), (std::vector<int32_t>{7, 8, 6, 1, 2}));
  // The continuation runs into the suffix itself and past the end, as the loop it is.
  EXPECT_EQ(propose(p, t, 9), (std::vector<int32_t>{7, 8, 6, 1, 2, 3, 7, 8, 6}));
  // A period-2 loop: the last occurrence of "5 6" is one period back.
  EXPECT_EQ(propose(p, {1, 5, 6, 5, 6}, 5), (std::vector<int32_t>{5, 6, 5, 6, 5}));
}

TEST(NgramProposer, FallsBackToShorterNgramsAndGuessesNothingWithoutAMatch) {
  NgramProposer p(4, 2);
  // No earlier "4 2 9"-style match of length 3 or 4, but "2 9" occurred once.
  EXPECT_EQ(propose(p, {5, 2, 9, 7, 3, 4, 2, 9}, 3), (std::vector<int32_t>{7, 3, 4}));
  EXPECT_TRUE(propose(p, {1, 2, 3, 4, 5, 6}, 3).empty());           // nothing repeats
  EXPECT_TRUE(propose(p, {1, 2, 3, 4, 1, 6}, 3).empty());           // a unigram is too short
  EXPECT_TRUE(propose(p, {7}, 3).empty());
  EXPECT_TRUE(propose(p, {}, 3).empty());
  EXPECT_TRUE(propose(p, {1, 2, 1, 2}, 0).empty());
  NgramProposer unigram(4, 1);
  EXPECT_EQ(propose(unigram, {1, 2, 3, 4, 1, 6, 1}, 2), (std::vector<int32_t>{6, 1}));
}

TEST(DraftLength, BestLengthGrowsWithAcceptanceAndVanishesBelowTheTokenCost) {
  EXPECT_EQ(best_draft_length(0.0, 0.1, 8), 0);
  EXPECT_EQ(best_draft_length(0.05, 0.1, 8), 0);  // a draft adds 0.05 tokens for 0.1 of a step
  int prev = 0;
  for (double a : {0.2, 0.4, 0.6, 0.8, 0.9, 0.99}) {
    const int k = best_draft_length(a, 0.1, 8);
    EXPECT_GE(k, prev) << a;
    EXPECT_GE(k, 1) << a;
    prev = k;
  }
  EXPECT_EQ(best_draft_length(0.99, 0.1, 8), 8);     // capped by --spec-tokens
  EXPECT_EQ(best_draft_length(0.99, 0.01, 3), 3);
  EXPECT_EQ(best_draft_length(0.8, 1.0, 8), 0);  // a row as dear as a step: never worth it
  // A gain of a few percent (k = 1: 1.9 tokens for 1.8 steps) is not taken with a margin of 10%.
  EXPECT_EQ(best_draft_length(0.9, 0.8, 5), 1);
  EXPECT_EQ(best_draft_length(0.9, 0.8, 5, 0.1), 0);
  EXPECT_EQ(best_draft_length(0.9, 0.3, 5, 0.1), best_draft_length(0.9, 0.3, 5));
}

TEST(DraftLength, FewerProbesWhereRowsCostNearlyAStep) {
  DraftLength d(5);
  for (int i = 0; i < 20; ++i) d.observe(5, 5);  // every draft right so far
  EXPECT_GT(d.next(0.3), 0);
  const int window = DraftLength::kRareProbe * DraftLength::kProbeEvery;
  int drafts = 0;
  for (int steps = 0; steps < 3 * window; ++steps) drafts += d.next(0.9);
  EXPECT_EQ(drafts, 3);  // a 16-sequence batch's rows: a probe every kRareProbe x 8 steps
  drafts = 0;
  for (int i = 0; i < 40; ++i) d.observe(4, 0);
  for (int steps = 0; steps < 3 * DraftLength::kProbeEvery; ++steps) drafts += d.next(0.3);
  EXPECT_EQ(drafts, 3);  // rows cheap again: a probe every 8 steps
}

TEST(DraftLength, AdaptsToAcceptanceAndProbesAfterFailures) {
  DraftLength d(8);
  const int k0 = d.next(0.1);
  EXPECT_GE(k0, 1);  // the prior hopes
  for (int i = 0; i < 20; ++i) d.observe(8, 8);
  EXPECT_EQ(d.next(0.1), 8);
  EXPECT_GT(d.acceptance(), 0.9);
  for (int i = 0; i < 40; ++i) d.observe(4, 0);
  EXPECT_LT(d.acceptance(), 0.1);
  int drafts = 0, steps = 0;
  for (; steps < 3 * DraftLength::kProbeEvery; ++steps) drafts += d.next(0.1);
  EXPECT_EQ(drafts, 3);  // one probe of one draft every kProbeEvery steps
  for (int i = 0; i < 10; ++i) d.observe(1, 1);  // the text turned repetitive
  EXPECT_GE(d.next(0.1), 2);
  DraftLength off(0);
  EXPECT_EQ(off.next(0.1), 0);
}

TEST(DraftLength, AGuessCountsAsDraftsWouldAndFreeGuessesNeedNoProbes) {
  using V = std::vector<int32_t>;
  // observe_guess(g, actual) is observe(drafts compared, their accepted prefix).
  const auto same = [](const std::vector<int32_t>& guess, const std::vector<int32_t>& actual,
                       int32_t proposed, int32_t accepted) {
    DraftLength a(5), b(5);
    a.observe_guess(guess, actual);
    b.observe(proposed, accepted);
    return a.acceptance() == b.acceptance();
  };
  EXPECT_TRUE(same({1, 2, 3, 4, 5}, {1, 2, 9}, 3, 2));  // two right, the third examined: wrong
  EXPECT_TRUE(same({1, 2, 3, 4, 5}, {1, 2}, 2, 2));     // both tokens that came were guessed
  EXPECT_TRUE(same({1, 2}, {1, 2, 3, 4}, 2, 2));        // past the guess's end: not examined
  EXPECT_TRUE(same({7, 2, 3}, {1}, 1, 0));
  DraftLength none(5);
  none.observe_guess({}, V{1, 2});  // no guess: nothing learnt
  none.observe_guess(V{1, 2}, {});
  EXPECT_EQ(none.acceptance(), DraftLength(5).acceptance());
  EXPECT_FALSE(same({1, 2, 3}, {1, 2, 9}, 3, 1));  // (the comparison can tell them apart)

  // After failures: with probes, one draft every kProbeEvery steps; with free guesses, none.
  DraftLength probing(5), guessing(5);
  for (int i = 0; i < 40; ++i) {
    probing.observe(4, 0);
    guessing.observe_guess(V{3, 3, 3, 3, 3}, V{1});
  }
  int probes = 0, drafts = 0;
  for (int steps = 0; steps < 3 * DraftLength::kProbeEvery; ++steps) {
    probes += probing.next(0.3);
    drafts += guessing.next(0.3, false);
  }
  EXPECT_EQ(probes, 3);
  EXPECT_EQ(drafts, 0);
  // The guesses turn right: the next step drafts again, no probe row needed to find out.
  for (int i = 0; i < 6; ++i) guessing.observe_guess(V{5, 6, 5, 6, 5}, V{5});
  EXPECT_GE(guessing.next(0.3, false), 1);
  // Where rows are dear, the rare probe stays (the measured row cost needs steps with drafts).
  DraftLength dear(5);
  for (int i = 0; i < 40; ++i) dear.observe_guess(V{3}, V{1});
  drafts = 0;
  for (int steps = 0; steps < 2 * DraftLength::kRareProbe * DraftLength::kProbeEvery; ++steps)
    drafts += dear.next(0.9, false);
  EXPECT_EQ(drafts, 2);
}

TEST(AcceptedPrefix, StopsAtTheFirstMismatch) {
  EXPECT_EQ(accepted_prefix(std::vector<int32_t>{}, std::vector<int32_t>{5}), 0);
  EXPECT_EQ(accepted_prefix(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{1, 2, 3, 9}), 3);
  EXPECT_EQ(accepted_prefix(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{1, 4, 3, 9}), 1);
  EXPECT_EQ(accepted_prefix(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{0, 2, 3, 9}), 0);
}

TEST(SpecMode, ParsesTheFlagAndNamesABadValue) {
  EXPECT_EQ(*parse_spec_mode("off"), SpecMode::kOff);
  EXPECT_EQ(*parse_spec_mode("ngram"), SpecMode::kNgram);
  EXPECT_EQ(*parse_spec_mode("draft"), SpecMode::kDraft);
  const auto bad = parse_spec_mode("lookup");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--speculative"), std::string::npos);
  EXPECT_STREQ(spec_mode_name(SpecMode::kNgram), "ngram");
}

}  // namespace
}  // namespace ltm
