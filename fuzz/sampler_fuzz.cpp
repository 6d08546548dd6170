// The sampler and its logits processors (runtime/sampling/sampler.h) on arbitrary logits rows (NaN
// of either sign, +-inf, denormals, all equal, huge and tiny values) with arbitrary parameters
// that validate() accepts. Checks that nothing aborts, that a row fails exactly when row_is_bad()
// says so, that an accepted row gives a token inside the row that is not a -inf logit, that the
// vocab-sharded path (cut in two at an arbitrary place) picks the same token, and that
// row_logprobs agrees.
//
// Input: temperature, top_p, repetition_penalty (raw float bits), top_k (int32), seed (uint64),
// flags (byte: want_logprob, then the history length), cut (uint16), then the row as floats
// (at most 2048; a few history ids are taken from the row's own bytes).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/sampling/sampler.h"

namespace {

template <typename T>
bool take(const uint8_t*& p, size_t& left, T* v) {
  if (left < sizeof(T)) return false;
  std::memcpy(v, p, sizeof(T));
  p += sizeof(T);
  left -= sizeof(T);
  return true;
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* p = data;
  size_t left = size;
  ltm::SamplingParams params;
  uint8_t flags = 0;
  uint16_t cut16 = 0;
  if (!take(p, left, &params.temperature) || !take(p, left, &params.top_p) ||
      !take(p, left, &params.repetition_penalty) || !take(p, left, &params.top_k) ||
      !take(p, left, &params.seed) || !take(p, left, &flags) || !take(p, left, &cut16))
    return 0;
  if (!ltm::validate(params).ok()) return 0;  // only what a request can carry
  const size_t n = std::min<size_t>(left / sizeof(float), 2048);
  if (n == 0) return 0;
  std::vector<float> row(n);
  std::memcpy(row.data(), p, n * sizeof(float));
  const bool want_logprob = (flags & 1) != 0;
  std::vector<int32_t> history;
  for (size_t i = 0; i < static_cast<size_t>(flags >> 1) && i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &row[i], sizeof(bits));
    history.push_back(static_cast<int32_t>(bits % n));
  }

  ltm::RowError why;
  const bool bad = ltm::row_is_bad(row, &why);
  std::vector<float> scratch;
  ltm::Rng rng(params.seed);
  const ltm::SampleResult whole = ltm::sample(row, params, history, rng, &scratch, want_logprob);
  check(whole.ok() == !bad);
  if (bad) {
    check(whole.error() == why);
  } else {
    check(whole.token >= 0 && static_cast<size_t>(whole.token) < n);
    check(row[whole.token] != -INFINITY);  // a -inf logit is never drawn, penalty or not
    check(!want_logprob || !std::isnan(whole.logprob));
  }

  // The same row split over two ranks at `cut`.
  const int32_t cut = static_cast<int32_t>(cut16 % (n + 1));
  std::vector<ltm::CandidateSet> sets;
  sets.push_back(ltm::local_candidates(std::vector<float>(row.begin(), row.begin() + cut), 0, cut,
                                       params, history));
  sets.push_back(ltm::local_candidates(std::vector<float>(row.begin() + cut, row.end()), cut,
                                       static_cast<int32_t>(n) - cut, params, history));
  ltm::Rng rng2(params.seed);
  const ltm::SampleResult split = ltm::sample_from_candidate_sets(sets, params, rng2);
  check(split.ok() == whole.ok());
  if (whole.ok()) check(split.token == whole.token);

  std::vector<int32_t> top_scratch;
  const int32_t target = static_cast<int32_t>(cut16 % n);
  const int n_top = static_cast<int>(flags % (ltm::kMaxTopLogprobs + 1));
  const ltm::RowLogprobs lp = ltm::row_logprobs(row, target, n_top, &top_scratch);
  check(lp.ok() == !bad);
  if (lp.ok()) {
    check(lp.token == target && lp.logprob <= 1e-3f);
    check(lp.n_top == static_cast<int32_t>(std::min<size_t>(n_top, n)));
    for (int32_t j = 1; j < lp.n_top; ++j) check(lp.top[j - 1].logprob >= lp.top[j].logprob);
  }
  return 0;
}
