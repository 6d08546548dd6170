#include "runtime/sampling/sample_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

namespace ltm {

int64_t candidate_rows_bytes(const SampleRowParams* params, int32_t rows, int64_t valid) {
  return static_cast<int64_t>(sizeof(CandidateRowHeader)) * rows +
         candidate_row_offset(params, rows, valid);
}

void select_candidates_host(const CandidateRowsArgs& a, int threads) {
  if (a.rows <= 0) return;
  LTM_ASSERT(a.valid >= 0 && a.stride >= a.valid && a.logits && a.params && a.out,
             "select_candidates: valid ", a.valid, ", stride ", a.stride);
  auto* base = static_cast<unsigned char*>(a.out);
  auto* headers = reinterpret_cast<CandidateRowHeader*>(base);
  unsigned char* entries = base + sizeof(CandidateRowHeader) * a.rows;
  const auto run = [&](int64_t r) {
    const SampleRowParams& rp = a.params[r];
    SamplingParams p;
    p.temperature = rp.temperature;
    p.top_k = candidate_row_pairs(rp, a.valid) ? rp.top_k : 0;  // the slice form: every logit
    p.top_p = rp.top_p;
    p.repetition_penalty = rp.repetition_penalty;
    LTM_ASSERT(rp.history_offset >= 0 && rp.history_count >= 0 &&
                   (rp.history_count == 0 || a.history != nullptr),
               "select_candidates: row ", r, " history [", rp.history_offset, ", +",
               rp.history_count, ")");
    const std::span<const int32_t> history(
        rp.history_count > 0 ? a.history + rp.history_offset : nullptr,
        static_cast<size_t>(rp.history_count));
    const CandidateSet set = local_candidates(
        std::span<const float>(a.logits + r * a.stride, static_cast<size_t>(a.valid)),
        a.id_begin, static_cast<int32_t>(a.valid), p, history);
    CandidateRowHeader h;
    h.local_max = set.local_max;
    h.local_sum_exp = set.local_sum_exp;
    h.count = static_cast<int32_t>(set.candidates.size());
    unsigned char* at = entries + candidate_row_offset(a.params, static_cast<int32_t>(r), a.valid);
    const int64_t room = candidate_row_bytes(rp, a.valid);
    std::memset(at, 0, static_cast<size_t>(room));  // padding and unused room read as zeros
    if (candidate_row_pairs(rp, a.valid)) {
      LTM_ASSERT(h.count * 8 <= room, "select_candidates: row ", r, " has ", h.count, " pairs");
      for (int32_t i = 0; i < h.count; ++i) {
        const CandidateEntry e{set.candidates[i].id, set.candidates[i].logit};
        std::memcpy(at + 8 * i, &e, sizeof(e));
      }
    } else {
      LTM_ASSERT(h.count * 4 <= room, "select_candidates: row ", r, " has ", h.count, " logits");
      for (int32_t i = 0; i < h.count; ++i)
        std::memcpy(at + 4 * i, &set.candidates[i].logit, sizeof(float));
    }
    std::memcpy(&headers[r], &h, sizeof(h));
  };
  const int64_t m = a.rows;
  if (threads <= 1 || m <= 1) {
    for (int64_t r = 0; r < m; ++r) run(r);
    return;
  }
  std::exception_ptr error;
  std::mutex mu;
#pragma omp parallel for num_threads(static_cast<int>(std::min<int64_t>(threads, m))) \
    schedule(dynamic, 1)
  for (int64_t r = 0; r < m; ++r) {
    try {
      run(r);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void read_candidate_row(const void* out, const SampleRowParams* params, int32_t rows,
                        int64_t valid, int32_t id_begin, int32_t r, CandidateSet* set) {
  const auto* base = static_cast<const unsigned char*>(out);
  CandidateRowHeader h;
  std::memcpy(&h, base + sizeof(CandidateRowHeader) * r, sizeof(h));
  const SampleRowParams& p = params[r];
  const unsigned char* at =
      base + sizeof(CandidateRowHeader) * rows + candidate_row_offset(params, r, valid);
  const bool pairs = candidate_row_pairs(p, valid);
  LTM_ASSERT(h.count >= 0 && h.count * (pairs ? 8 : 4) <= candidate_row_bytes(p, valid),
             "select_candidates: row ", r, " reports ", h.count, " entries");
  set->local_max = h.local_max;
  set->local_sum_exp = h.local_sum_exp;
  set->candidates.resize(static_cast<size_t>(h.count));
  for (int32_t i = 0; i < h.count; ++i) {
    if (pairs) {
      CandidateEntry e;
      std::memcpy(&e, at + 8 * i, sizeof(e));
      LTM_ASSERT(e.id >= id_begin && e.id < id_begin + valid, "select_candidates: row ", r,
                 " candidate id ", e.id, " outside [", id_begin, ", ", id_begin + valid, ")");
      set->candidates[i] = Candidate{e.id, e.logit};
    } else {
      float logit;
      std::memcpy(&logit, at + 4 * i, sizeof(float));
      set->candidates[i] = Candidate{id_begin + i, logit};
    }
  }
}

}  // namespace ltm
