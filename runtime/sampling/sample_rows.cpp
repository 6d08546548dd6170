#include "runtime/sampling/sample_rows.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <span>
#include <vector>

#include "common/check.h"
#include "runtime/sampling/sampler.h"

namespace ltm {

namespace {

SampleResult sample_one(const SampleRowsArgs& a, int64_t r, std::vector<float>* scratch) {
  const SampleRowParams& rp = a.params[r];
  SamplingParams p;
  p.temperature = rp.temperature;
  p.top_k = rp.top_k;
  p.top_p = rp.top_p;
  p.repetition_penalty = rp.repetition_penalty;
  p.seed = rp.seed;
  LTM_ASSERT(rp.history_offset >= 0 && rp.history_count >= 0 &&
                 (rp.history_count == 0 || a.history != nullptr),
             "sample_rows: row ", r, " history [", rp.history_offset, ", +", rp.history_count, ")");
  const std::span<const int32_t> history(
      rp.history_count > 0 ? a.history + rp.history_offset : nullptr,
      static_cast<size_t>(rp.history_count));
  Rng rng = Rng::for_step(rp.seed, rp.token_index);
  return sample(std::span<const float>(a.logits + r * a.stride, static_cast<size_t>(a.vocab)), p,
                history, rng, scratch, rp.want_logprob != 0);
}

}  // namespace

void sample_rows_host(const SampleRowsArgs& a, int threads) {
  if (a.rows <= 0) return;
  LTM_ASSERT(a.vocab > 0 && a.stride >= a.vocab && a.logits && a.params && a.tokens,
             "sample_rows: vocab ", a.vocab, ", stride ", a.stride);
  const auto run = [&](int64_t r, std::vector<float>* scratch) {
    const SampleResult s = sample_one(a, r, scratch);
    a.tokens[r] = s.token;
    if (a.logprobs) a.logprobs[r] = s.logprob;
  };
  const int64_t m = a.rows;
  if (threads <= 1 || m <= 1) {
    std::vector<float> scratch;
    for (int64_t r = 0; r < m; ++r) run(r, &scratch);
    return;
  }
  // The sampler's checks throw; an exception leaves no OpenMP region, so the first is carried
  // out and rethrown here.
  std::exception_ptr error;
  std::mutex mu;
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(threads, m)))
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < m; ++r) {
      try {
        run(r, &scratch);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ltm
