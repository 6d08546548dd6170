// The rule for sampled drafts (runtime/spec/sampled_drafts.h) keeps the target's distribution:
// a statistical test on a 6-token vocabulary. A fake target and a fake draft (logits that depend on
// the context, deliberately different) with a temperature and a top-k; speculative steps of k = 2
// sampled drafts as the scheduler runs them (draft_rng for the proposals, verify_rng for the
// verdicts, Rng::for_step for the bonus token, the next step starting after the first rejection),
// over 120000 seeds. The joint law of the first two tokens emitted must be the target's
// p(y0) p(y1 | y0): a chi-square test over the 36 cells. The same test run on two broken rules
// (accept every draft; on rejection draw from p instead of the residual) must reject them, so it
// has the power to see a wrong rule.
#include "runtime/spec/sampled_drafts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace ltm {
namespace {

constexpr int kVocab = 6;

std::vector<float> target_logits(const std::vector<int32_t>& ctx) {
  double s = 0;
  for (size_t i = 0; i < ctx.size(); ++i) s += (i + 1) * ctx[i];
  std::vector<float> l(kVocab);
  for (int v = 0; v < kVocab; ++v) l[v] = static_cast<float>(2.0 * std::sin(1.3 * v + 0.7 * s + ctx.size()));
  return l;
}

std::vector<float> draft_logits(const std::vector<int32_t>& ctx) {
  double s = 0;
  for (int32_t t : ctx) s += t;
  std::vector<float> l(kVocab);
  for (int v = 0; v < kVocab; ++v) l[v] = static_cast<float>(1.5 * std::cos(0.9 * v + 0.3 * s) + 0.2 * v);
  return l;
}

SamplingParams params(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 5;  // one token cut: p and q have zeros, not always at the same ids
  p.seed = seed;
  return p;
}

std::vector<float> probs(const std::vector<float>& logits, const SamplingParams& sp) {
  std::vector<float> p;
  processed_probabilities(logits, sp, {}, &p);
  return p;
}

enum class Rule { kStandard, kAcceptAlways, kResampleFromP };

// Generates two tokens after `prompt` as the scheduler does with k = 2 sampled drafts a step.
std::vector<int32_t> generate_two(const std::vector<int32_t>& prompt, uint64_t seed, Rule rule) {
  const SamplingParams sp = params(seed);
  std::vector<int32_t> ctx = prompt;
  const size_t n0 = prompt.size();
  while (ctx.size() < n0 + 2) {
    const int32_t g = static_cast<int32_t>(ctx.size() - n0);  // index of the step's first token
    // The draft proposes 2 tokens, each from its q, with its own stream per token index.
    std::vector<int32_t> drafts;
    std::vector<std::vector<float>> qs;
    std::vector<int32_t> dctx = ctx;
    for (int i = 0; i < 2; ++i) {
      std::vector<float> q = probs(draft_logits(dctx), sp);
      Rng r = draft_rng(seed, g + i);
      const int32_t x = draw_from_weights(q, r.uniform());
      drafts.push_back(x);
      qs.push_back(q);
      dctx.push_back(x);
    }
    // The target verifies row by row.
    bool all = true;
    for (int i = 0; i < 2; ++i) {
      const std::vector<float> p = probs(target_logits(ctx), sp);
      Rng r = verify_rng(seed, g + i);
      DraftVerdict v;
      if (rule == Rule::kStandard) {
        v = verify_sampled_draft(p, qs[i], drafts[i], r);
      } else if (rule == Rule::kAcceptAlways) {
        v = {drafts[i], true};
      } else {  // accept as the rule does, but replace from p itself
        const double u = r.uniform();
        v = u * qs[i][drafts[i]] < p[drafts[i]] ? DraftVerdict{drafts[i], true}
                                                : DraftVerdict{draw_from_weights(p, r.uniform()), false};
      }
      ctx.push_back(v.token);
      if (!v.accepted) {
        all = false;
        break;
      }
    }
    if (all) {  // the bonus row: the engine's own draw from p
      Rng r = Rng::for_step(seed, g + 2);
      std::vector<float> scratch;
      ctx.push_back(sample(target_logits(ctx), sp, {}, r, &scratch).token);
    }
  }
  return {ctx[n0], ctx[n0 + 1]};
}

struct ChiSquare {
  double statistic = 0;
  int df = 0;
  bool impossible = false;  // a token of probability 0 was emitted
};

// Pearson's chi-square of the (y0, y1) counts against p(y0) p(y1 | y0); cells expected below 5
// pooled into one.
ChiSquare chi_square(const std::vector<int32_t>& prompt, Rule rule, int trials) {
  const SamplingParams sp = params(0);
  std::vector<double> expected(kVocab * kVocab, 0.0);
  const std::vector<float> p0 = probs(target_logits(prompt), sp);
  for (int a = 0; a < kVocab; ++a) {
    std::vector<int32_t> c = prompt;
    c.push_back(a);
    const std::vector<float> p1 = probs(target_logits(c), sp);
    for (int b = 0; b < kVocab; ++b) expected[a * kVocab + b] = trials * double(p0[a]) * p1[b];
  }
  std::vector<double> observed(kVocab * kVocab, 0.0);
  for (int s = 0; s < trials; ++s) {
    const std::vector<int32_t> y = generate_two(prompt, 1000003ull * s + 17, rule);
    observed[y[0] * kVocab + y[1]] += 1;
  }
  ChiSquare out;
  double pooled_o = 0, pooled_e = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == 0) {
      if (observed[i] > 0) out.impossible = true;
      continue;
    }
    if (expected[i] < 5) {
      pooled_o += observed[i];
      pooled_e += expected[i];
      continue;
    }
    out.statistic += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
    out.df++;
  }
  if (pooled_e > 0) {
    out.statistic += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    out.df++;
  }
  out.df -= 1;  // the counts sum to the trials
  return out;
}

// The chi-square quantile at 1 - 1e-4 for df degrees of freedom (Wilson-Hilferty), so a correct
// rule fails by chance once in 10^4 (and the seeds are fixed: the test is deterministic).
double critical(int df) {
  const double z = 3.719;  // standard normal quantile at 1 - 1e-4
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

TEST(SampledDrafts, TwoTokensFollowTheTargetsDistribution) {
  const std::vector<int32_t> prompt = {3, 1};
  // The draft differs from the target: drafts are rejected often enough to test the residual.
  const std::vector<float> p0 = probs(target_logits(prompt), params(0));
  const std::vector<float> q0 = probs(draft_logits(prompt), params(0));
  double tv = 0;
  for (int v = 0; v < kVocab; ++v) tv += 0.5 * std::abs(p0[v] - q0[v]);
  EXPECT_GT(tv, 0.2) << "the fake draft should differ from the fake target";

  constexpr int kTrials = 120000;
  const ChiSquare good = chi_square(prompt, Rule::kStandard, kTrials);
  std::printf("standard rule: chi-square %.1f, df %d, critical %.1f (total variation p0 vs q0 %.3f)\n",
              good.statistic, good.df, critical(good.df), tv);
  EXPECT_FALSE(good.impossible);
  EXPECT_LT(good.statistic, critical(good.df));

  // The test sees a broken rule.
  const ChiSquare always = chi_square(prompt, Rule::kAcceptAlways, kTrials);
  const ChiSquare from_p = chi_square(prompt, Rule::kResampleFromP, kTrials);
  std::printf("accept always: chi-square %.1f; resample from p: %.1f\n", always.statistic,
              from_p.statistic);
  EXPECT_TRUE(always.impossible || always.statistic > 10 * critical(always.df));
  EXPECT_TRUE(from_p.impossible || from_p.statistic > critical(from_p.df));
}

TEST(SampledDrafts, VerdictsFollowTheRule) {
  // p == q: every draft is accepted.
  const std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f, 0.0f, 0.0f};
  for (int s = 0; s < 200; ++s) {
    Rng r = verify_rng(s, 0);
    EXPECT_TRUE(verify_sampled_draft(p, p, s % 4, r).accepted);
  }
  // A draft the target cuts (p(x) = 0) is always rejected and replaced from max(0, p - q),
  // which never gives it back.
  const std::vector<float> q = {0.0f, 0.0f, 0.0f, 0.0f, 0.5f, 0.5f};
  for (int s = 0; s < 200; ++s) {
    Rng r = verify_rng(s, 3);
    const DraftVerdict v = verify_sampled_draft(p, q, 4, r);
    EXPECT_FALSE(v.accepted);
    EXPECT_GE(v.token, 0);
    EXPECT_LT(v.token, 4);
  }
  // Streams: a pure function of (seed, token index), distinct for the draft and the verdict.
  Rng a = draft_rng(7, 2), b = draft_rng(7, 2), c = verify_rng(7, 2), d = draft_rng(7, 3);
  const uint64_t x = a.next_u64();
  EXPECT_EQ(x, b.next_u64());
  EXPECT_NE(x, c.next_u64());
  EXPECT_NE(x, d.next_u64());
  EXPECT_EQ(draw_from_weights(std::vector<float>{0, 0}, 0.5), -1);
  EXPECT_EQ(draw_from_weights(std::vector<float>{0, 1, 0, 3}, 0.0), 1);
  EXPECT_EQ(draw_from_weights(std::vector<float>{0, 1, 0, 3}, 0.26), 3);
}

}  // namespace
}  // namespace ltm
