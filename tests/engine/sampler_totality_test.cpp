// The sampler is total over what validation accepts (runtime/sampling/sampler.h): extreme
// parameters give a token, a row the model got wrong gives a failed result instead of taking
// the process down, and row_logprobs (the OpenAI `logprobs` reduction) agrees with a double
// log-softmax.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/sampling/sampler.h"

namespace ltm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMax = std::numeric_limits<float>::max();

SamplingParams params(float temperature, int32_t top_k = 0, float top_p = 1.0f,
                      float repetition_penalty = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.repetition_penalty = repetition_penalty;
  return p;
}

// Every combination of the extremes validation accepts, whole row and split in two.
std::vector<SamplingParams> extreme_params() {
  std::vector<SamplingParams> out;
  for (float t : {0.0f, 1e-38f, 1e-45f, 1.0f, 3e38f, kMax})
    for (int32_t k : {0, 1, 3, 1 << 30})
      for (float p : {1e-45f, 1e-38f, 0.5f, 1.0f})
        for (float rp : {1e-38f, 1e-40f, 1.0f, 3e38f, kMax}) out.push_back(params(t, k, p, rp));
  return out;
}

SampleResult sample_split(const std::vector<float>& row, const SamplingParams& p,
                          const std::vector<int32_t>& history, int32_t cut, uint64_t seed) {
  const int32_t n = static_cast<int32_t>(row.size());
  std::vector<CandidateSet> sets;
  sets.push_back(local_candidates(std::vector<float>(row.begin(), row.begin() + cut), 0, cut, p,
                                  history));
  sets.push_back(local_candidates(std::vector<float>(row.begin() + cut, row.end()), cut, n - cut,
                                  p, history));
  Rng rng(seed);
  return sample_from_candidate_sets(sets, p, rng);
}

// The request: repetition_penalty 1e-40 divides a positive logit past FLT_MAX.
TEST(SamplerTotal, TinyPenaltySaturatesInsteadOfOverflowing) {
  const std::vector<float> row = {3.0f, -2.0f, 1.0f, 0.5f};
  const std::vector<int32_t> history = {0, 1, 2};
  std::vector<float> scratch;
  Rng rng(1);
  const SampleResult r = sample(row, params(0.0f, 0, 1.0f, 1e-40f), history, rng, &scratch);
  ASSERT_TRUE(r.ok()) << r.token;
  // 3 / 1e-40 and 1 / 1e-40 both saturate at FLT_MAX: a tie, broken by the lower id.
  EXPECT_EQ(r.token, 0);
  EXPECT_TRUE(std::isfinite(r.logprob));
  std::vector<float> probs;
  processed_probabilities(row, params(1.0f, 0, 1.0f, 1e-40f), history, &probs);
  EXPECT_NEAR(probs[0], 0.5, 1e-6);
  EXPECT_NEAR(probs[2], 0.5, 1e-6);
  EXPECT_EQ(probs[1], 0.0f);  // -2 * 1e-40: tiny, far below FLT_MAX
}

TEST(SamplerTotal, HugePenaltyKeepsNegativeLogitsFinite) {
  const std::vector<float> row = {-3.0f, 2.0f};
  const std::vector<int32_t> history = {0, 1};
  std::vector<float> scratch;
  Rng rng(2);
  const SampleResult r = sample(row, params(1.0f, 0, 1.0f, 3e38f), history, rng, &scratch);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.token, 1);  // 2 / 3e38 ~ 0 beats -3 * 3e38 = -FLT_MAX (saturated, not -inf)
}

TEST(SamplerTotal, EveryExtremeAcceptedParameterGivesAToken) {
  const std::vector<float> row = {3.0f, -2.0f, 1.0f, 0.5f, -kInf, 40.0f, -40.0f, 0.0f};
  const std::vector<int32_t> history = {0, 1, 5, 6, 7};
  std::vector<float> scratch;
  int checked = 0;
  for (const SamplingParams& p : extreme_params()) {
    ASSERT_TRUE(validate(p).ok()) << validate(p);
    for (uint64_t seed : {1u, 2u, 3u}) {
      Rng rng(seed);
      const SampleResult whole = sample(row, p, history, rng, &scratch);
      ASSERT_TRUE(whole.ok()) << "t=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p
                              << " rp=" << p.repetition_penalty;
      ASSERT_NE(whole.token, 4) << "a -inf logit is never drawn";
      ASSERT_FALSE(std::isnan(whole.logprob));
      const SampleResult split = sample_split(row, p, history, 3, seed);
      ASSERT_EQ(split.token, whole.token)
          << "t=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p
          << " rp=" << p.repetition_penalty;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(SamplerTotal, TinyTemperatureIsGreedy) {
  const std::vector<float> row = {1.0f, 2.5f, 2.4999f, -1.0f};
  std::vector<float> scratch;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Rng rng(seed);
    EXPECT_EQ(sample(row, params(1e-38f), {}, rng, &scratch).token, 1);
    Rng rng2(seed);
    EXPECT_EQ(sample(row, params(1e-38f, 0, 1e-45f), {}, rng2, &scratch).token, 1);
  }
}

// A row the model got wrong fails, on both paths, with the reason; nothing aborts.
TEST(SamplerTotal, BadRowsFailTheRowOnly) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<float> row;
    RowError why;
  } cases[] = {
      {{1.0f, nan, 2.0f, 0.0f}, RowError::kNaN},
      {{1.0f, -nan, 2.0f, 0.0f}, RowError::kNaN},
      {{1.0f, kInf, 2.0f, 0.0f}, RowError::kPosInf},
      {{-kInf, -kInf, -kInf, -kInf}, RowError::kAllNegInf},
  };
  std::vector<float> scratch;
  std::vector<int32_t> top_scratch;
  const std::vector<int32_t> history = {0, 1};
  for (const Case& c : cases) {
    for (const SamplingParams& p :
         {params(0.0f), params(1.0f), params(0.7f, 2), params(1.0f, 0, 0.5f),
          params(0.0f, 0, 1.0f, 1.3f)}) {
      Rng rng(5);
      const SampleResult r = sample(c.row, p, history, rng, &scratch);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.error(), c.why) << row_error_name(r.error());
      EXPECT_TRUE(std::isnan(r.logprob));
      for (bool want_logprob : {false, true}) {
        Rng rng2(5);
        EXPECT_FALSE(sample(c.row, p, {}, rng2, &scratch, want_logprob).ok());
      }
      // Split over two ranks, the bad value on either side of the cut.
      for (int32_t cut : {1, 2, 3}) {
        const SampleResult s = sample_split(c.row, p, history, cut, 5);
        ASSERT_FALSE(s.ok()) << "cut " << cut;
        EXPECT_EQ(s.error(), c.why) << "cut " << cut << ": " << row_error_name(s.error());
      }
    }
    std::vector<float> probs;
    processed_probabilities(c.row, params(1.0f), {}, &probs);
    for (float q : probs) EXPECT_EQ(q, 0.0f);
    const RowLogprobs lp = row_logprobs(c.row, 0, 3, &top_scratch);
    EXPECT_FALSE(lp.ok());
    EXPECT_EQ(static_cast<RowError>(lp.token), c.why);
    RowError why;
    EXPECT_TRUE(row_is_bad(c.row, &why));
    EXPECT_EQ(why, c.why);
  }
  RowError why;
  EXPECT_FALSE(row_is_bad(std::vector<float>{-kInf, 1.0f, kMax, -kMax}, &why));
}

// A slice of -inf only is fine on its own: the other rank holds the mass.
TEST(SamplerTotal, ASliceOfMinusInfinityOnlyIsNotAnError) {
  const std::vector<float> row = {-kInf, -kInf, 1.0f, 2.0f};
  for (const SamplingParams& p : {params(0.0f), params(1.0f), params(1.0f, 1)}) {
    const SampleResult s = sample_split(row, p, {}, 2, 9);
    ASSERT_TRUE(s.ok()) << row_error_name(s.error());
    EXPECT_GE(s.token, 2);
  }
}

TEST(RowLogprobs, IsLogSoftmaxWithTopN) {
  const std::vector<float> row = {1.0f, 3.0f, 2.0f, 3.0f, -kInf};
  std::vector<int32_t> scratch;
  const RowLogprobs t = row_logprobs(row, 2, 3, &scratch);
  ASSERT_TRUE(t.ok());
  double z = 0;
  for (float v : row) z += std::exp(static_cast<double>(v));
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-5);
  ASSERT_EQ(t.n_top, 3);
  EXPECT_EQ(t.top[0].id, 1);  // ties by id
  EXPECT_EQ(t.top[1].id, 3);
  EXPECT_EQ(t.top[2].id, 2);
  EXPECT_NEAR(t.top[0].logprob, 3.0 - std::log(z), 1e-5);
  EXPECT_EQ(row_logprobs(row, 0, 0, &scratch).n_top, 0);
  EXPECT_EQ(row_logprobs(row, 0, 20, &scratch).n_top, 5);
  EXPECT_EQ(row_logprobs(row, 4, 1, &scratch).logprob, -kInf);
}

TEST(RowLogprobs, TopNMatchesAFullSortOnALargeRow) {
  std::vector<float> row(50257);
  Rng rng(11);
  for (float& x : row) x = static_cast<float>(rng.uniform() * 20.0 - 10.0);
  row[77] = row[78] = 10.5f;  // a tie at the top
  std::vector<int32_t> ids(row.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  double m = 10.5, z = 0;
  for (float v : row) z += std::exp(static_cast<double>(v) - m);
  const double log_z = m + std::log(z);
  std::vector<int32_t> scratch;
  const RowLogprobs lp = row_logprobs(row, 123, kMaxTopLogprobs, &scratch);
  ASSERT_EQ(lp.n_top, kMaxTopLogprobs);
  for (int j = 0; j < kMaxTopLogprobs; ++j) {
    EXPECT_EQ(lp.top[j].id, ids[j]) << j;
    EXPECT_NEAR(lp.top[j].logprob, row[ids[j]] - log_z, 1e-4) << j;
  }
  EXPECT_NEAR(lp.logprob, row[123] - log_z, 1e-4);
}

}  // namespace
}  // namespace ltm
