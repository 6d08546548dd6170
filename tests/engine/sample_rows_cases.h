// Seeded batches of logit rows for the sample op (runtime/sampling/sample_rows.h), shared by the
// host test (sample_rows_test.cpp) and the GPU one (sampling_gpu_test.cpp): every branch of the
// sampler (greedy with and without the logprob, temperature tiny to huge, top-k through each of
// the host's selection paths and beyond the vocab, top-p alone and after top-k, the repetition
// penalty both ways, bad rows) on three kinds of rows: language-model-like (a few strong tokens
// over a gaussian floor), near-uniform (a nucleus of most of the vocab) and quantized (many
// exactly equal logits: the ties the token order (logit desc, id asc) decides). Padding between
// rows (stride > vocab) is NaN, so an op that reads past the vocab fails its row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "runtime/sampling/sample_rows.h"
#include "runtime/sampling/sampler.h"

namespace ltm::testing {

struct SampleBatch {
  int64_t vocab = 0;
  int64_t stride = 0;
  std::vector<float> logits;  // [rows, stride]
  std::vector<SampleRowParams> params;
  std::vector<int32_t> history;
  int32_t rows() const { return static_cast<int32_t>(params.size()); }
  SampleRowsArgs host_args(int32_t* tokens, float* logprobs) const {
    SampleRowsArgs a;
    a.rows = rows();
    a.vocab = vocab;
    a.stride = stride;
    a.logits = logits.data();
    a.params = params.data();
    a.history = history.empty() ? nullptr : history.data();
    a.tokens = tokens;
    a.logprobs = logprobs;
    return a;
  }
};

// One parameter set of the batch (want_logprob 0 only matters for greedy rows).
struct CaseParams {
  float temperature;
  int32_t top_k;
  float top_p;
  float penalty;
  int32_t want_logprob;
};

inline std::vector<CaseParams> sample_cases(int64_t vocab) {
  const int32_t beyond = static_cast<int32_t>(vocab + 5);
  return {
      {0.0f, 0, 1.0f, 1.0f, 0},     // greedy, no logprob
      {0.0f, 0, 1.0f, 1.0f, 1},     // greedy with its logprob
      {0.0f, 0, 1.0f, 1.3f, 1},     // greedy after the penalty
      {1.0f, 0, 1.0f, 1.0f, 1},     // plain draw over the whole row
      {0.7f, 0, 1.0f, 1.0f, 1},
      {1e-3f, 0, 1.0f, 1.0f, 1},    // tiny temperature: concentrates like greedy
      {50.0f, 0, 1.0f, 1.0f, 1},    // huge: flattens
      {0.8f, 1, 1.0f, 1.0f, 1},     // top-k 1
      {0.8f, 40, 1.0f, 1.0f, 1},    // the host's heap path (k <= 64)
      {1.1f, 1000, 1.0f, 1.0f, 1},  // the host's radix-select path
      {0.9f, beyond, 1.0f, 1.0f, 1},  // k beyond the vocab: the whole row, sorted
      {1.0f, 0, 0.9f, 1.0f, 1},     // top-p over the whole row
      {1.3f, 0, 0.5f, 1.0f, 1},
      {0.6f, 0, 1e-6f, 1.0f, 1},    // a nucleus of one
      {0.9f, 50, 0.8f, 1.0f, 1},    // top-p after top-k
      {0.8f, 20, 1.0f, 1.5f, 1},    // penalty + top-k
      {1.0f, 0, 0.95f, 0.7f, 1},    // a penalty below 1 (boosts the history) + top-p
      {1.2f, 0, 1.0f, 2.0f, 0},     // penalty + plain draw, no logprob asked
  };
}

// kind 0: language-model-like; 1: near-uniform; 2: quantized (ties).
inline void fill_row(float* row, int64_t vocab, int kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < vocab; ++i) {
    const float g = normal(rng);
    if (kind == 0) row[i] = 2.0f * g;
    else if (kind == 1) row[i] = 0.01f * g;
    else row[i] = std::round(4.0f * g) * 0.5f;  // values k / 2: thousands of exact ties
  }
  if (kind == 0) {
    std::uniform_int_distribution<int64_t> id(0, vocab - 1);
    for (int j = 0; j < 8; ++j) row[id(rng)] = 9.0f + static_cast<float>(j) * 0.25f;
  }
}

// Every case on every kind of row, plus the bad rows (a NaN, a +inf, all -inf) and a row with
// -inf entries; seeds and token indices vary row to row.
inline SampleBatch make_sample_batch(int64_t vocab, int64_t stride, uint32_t seed) {
  SampleBatch b;
  b.vocab = vocab;
  b.stride = stride;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const auto add_row = [&](const CaseParams& c, int kind) {
    const size_t r = b.params.size();
    b.logits.resize((r + 1) * static_cast<size_t>(stride), nan);
    float* row = b.logits.data() + r * stride;
    if (kind >= 0) fill_row(row, vocab, kind, rng);
    SampleRowParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.repetition_penalty = c.penalty;
    p.seed = 1000003ull * (r + 1) + seed;
    p.token_index = static_cast<int32_t>(r % 7) * 3;
    p.want_logprob = c.want_logprob;
    if (c.penalty != 1.0f) {
      p.history_offset = static_cast<int32_t>(b.history.size());
      p.history_count = 24;
      for (int j = 0; j < p.history_count; ++j) b.history.push_back(id(rng));
      // The row's best tokens in the history too, so that the penalty changes the outcome.
      b.history.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      ++p.history_count;
    }
    b.params.push_back(p);
    return row;
  };
  for (int kind = 0; kind < 3; ++kind)
    for (const CaseParams& c : sample_cases(vocab)) add_row(c, kind);
  const CaseParams plain{1.0f, 0, 1.0f, 1.0f, 1};
  add_row(plain, 0)[id(rng)] = nan;
  add_row(plain, 0)[id(rng)] = inf;
  float* all_neg = add_row(plain, -1);
  for (int64_t i = 0; i < vocab; ++i) all_neg[i] = -inf;
  float* some_neg = add_row({0.9f, 0, 0.9f, 1.0f, 1}, 0);
  for (int64_t i = 0; i < vocab; i += 3) some_neg[i] = -inf;
  return b;
}

// The reference: sample() row by row with the engine's generator.
inline void reference_samples(const SampleBatch& b, std::vector<int32_t>* tokens,
                              std::vector<float>* logprobs) {
  tokens->assign(b.rows(), 0);
  logprobs->assign(b.rows(), 0.0f);
  std::vector<float> scratch;
  for (int32_t r = 0; r < b.rows(); ++r) {
    const SampleRowParams& rp = b.params[r];
    SamplingParams p;
    p.temperature = rp.temperature;
    p.top_k = rp.top_k;
    p.top_p = rp.top_p;
    p.repetition_penalty = rp.repetition_penalty;
    p.seed = rp.seed;
    std::span<const int32_t> history;
    if (rp.history_count > 0)
      history = std::span<const int32_t>(b.history.data() + rp.history_offset, rp.history_count);
    Rng rng = Rng::for_step(rp.seed, rp.token_index);
    const SampleResult s =
        sample(std::span<const float>(b.logits.data() + r * b.stride, b.vocab), p, history, rng,
               &scratch, rp.want_logprob != 0);
    (*tokens)[r] = s.token;
    (*logprobs)[r] = s.logprob;
  }
}

// Same float, NaN equal to NaN (a logprob not computed, or of a failed row).
inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

}  // namespace ltm::testing
