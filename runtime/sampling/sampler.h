// Token sampling: one token from one row of logits, with HF `generate()` semantics.
//
// Processing order (as HF applies its logits processors and warpers):
//   repetition penalty -> temperature -> top-k -> top-p -> draw
//   - repetition penalty (HF RepetitionPenaltyLogitsProcessor): for each distinct id in `history`
//     (prompt + generated), l = l < 0 ? l * penalty : l / penalty. Applied in greedy mode too.
//   - temperature: l = l / temperature. temperature == 0 means greedy: argmax of the penalized
//     logits, ties -> lowest id; top-k and top-p are then irrelevant and no random number is used.
//   - top-k (k > 0): keep the k best tokens in the order (logit desc, id asc). Unlike HF, ties at
//     the k-th value are broken by id, so exactly min(k, vocab) tokens are kept.
//   - top-p (p < 1): over the tokens still kept (renormalized, as HF does after top-k), keep the
//     smallest prefix in (logit desc) order whose cumulative probability is >= p; the token that
//     crosses p is included (HF TopPLogitsWarper).
//   - draw: exactly one Rng::uniform() per non-greedy call, mapped through the cumulative weights
//     of the kept tokens (in (logit desc, id asc) order after top-k/top-p; in id order when
//     nothing is truncated).
//
// Determinism: the token is a pure function of (logits, params, history, Rng state). The
// vocab-sharded path (local_candidates + sample_from_candidates) gives exactly the same token as
// sample() on the whole row, for any split (see "Tensor parallelism" below).
//
// Reported logprob: log-softmax of the chosen token over the whole (untruncated) row after
// penalty and temperature; in greedy mode after penalty only (temperature 1), which is the raw
// model distribution when repetition_penalty == 1.
//
// Total over what validation accepts: the repetition penalty saturates at +-FLT_MAX instead of
// overflowing (a logit of 3 divided by a penalty of 1e-40 is FLT_MAX, not +inf), a tiny
// temperature concentrates the draw on the best tokens as greedy does, and a huge one flattens
// it. A row the model got wrong -- a NaN or +inf anywhere, or every logit -inf (an adapter, a
// bad checkpoint, an overflow) -- is not a caller bug: the result says so (SampleResult::ok()
// false, `token` the reason), and the caller fails that one request.
//
// Threading: all functions are pure apart from advancing the given Rng and writing `scratch`;
// use one Rng and one scratch per thread. Preconditions (caller bugs, LTM_ASSERT): a non-empty
// row, history ids inside the row, params that pass validate(). Requests are checked with
// validate() before they are queued.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "runtime/sampling/rng_core.h"

namespace ltm {

struct SamplingParams {
  float temperature = 1.0f;         // >= 0; 0 => greedy
  int32_t top_k = 0;                // >= 0; 0 => off
  float top_p = 1.0f;               // (0, 1]; 1 => off
  float repetition_penalty = 1.0f;  // > 0; 1 => off
  uint64_t seed = 0;                // seeds the request's Rng
};

// InvalidArgument naming the field: temperature < 0 or not finite, top_k < 0, top_p outside
// (0, 1], repetition_penalty <= 0 or not finite.
absl::Status validate(const SamplingParams& params);

// xoshiro256** seeded through splitmix64: the same seed gives the same stream on every platform
// (only integer arithmetic; uniform() uses the top 53 bits). Not thread-safe; cheap to copy.
// The arithmetic is RngCore (rng_core.h), shared with the GPU sampler.
class Rng {
 public:
  explicit Rng(uint64_t seed) : core_(RngCore::seeded(seed)) {}
  // The generator for a request's `token_index`-th generated token: a pure function of
  // (seed, token_index), so any rank, or a recomputation after preemption, draws the same.
  static Rng for_token(uint64_t seed, int64_t token_index) {
    return Rng(RngCore::for_token(seed, token_index));
  }

  // The engine's generator for a request's `token_index`-th token (RngCore::for_step; the CUDA
  // sampler derives the same state on the device).
  static Rng for_step(uint64_t seed, int32_t token_index) {
    return Rng(RngCore::for_step(seed, token_index));
  }

  uint64_t next_u64() { return core_.next_u64(); }
  double uniform() { return core_.uniform(); }  // [0, 1), multiples of 2^-53
  const RngCore& core() const { return core_; }

 private:
  explicit Rng(const RngCore& core) : core_(core) {}
  RngCore core_;
};

// Why a row could not be sampled: the (negative) token of a SampleResult that is not ok().
enum class RowError : int32_t {
  kNaN = -1,        // a NaN in the row
  kPosInf = -2,     // a +inf in the row (no finite distribution)
  kAllNegInf = -3,  // every logit is -inf
};
const char* row_error_name(RowError e);
// The first defect of `row` in the order above, if any (one vectorised pass).
bool row_is_bad(std::span<const float> row, RowError* why);

struct SampleResult {
  int32_t token = -1;    // >= 0: the token; < 0: a RowError, the row was not sampled
  float logprob = 0.0f;  // see "Reported logprob" above; NaN when the row was not sampled
  bool ok() const { return token >= 0; }
  RowError error() const { return static_cast<RowError>(token); }
  static SampleResult failed(RowError e) {
    return {static_cast<int32_t>(e), std::numeric_limits<float>::quiet_NaN()};
  }
};

// Samples one token from logits[0 .. logits.size()): pass only the real vocab (a padded row cut
// to the vocab size). `history` is prompt + generated ids (only read when repetition_penalty !=
// 1). `scratch` is resized as needed (up to 3 x vocab floats) and reused across calls so that a
// warm call does not allocate.
// Cost for vocab 50257 (Release, one core; SamplerSpeed prints it): 40-70 us for greedy, plain,
// top-k and top-p on language-model-like rows; top-p alone on a near-uniform row sorts its
// ~40k-token nucleus, ~0.4 ms. want_logprob = false lets a greedy row skip the softmax
// normalizer, a pass of exp over the row that only the logprob needs (the result's logprob is
// then NaN; the token is the same).
SampleResult sample(std::span<const float> logits, const SamplingParams& params,
                    std::span<const int32_t> history, Rng& rng, std::vector<float>* scratch,
                    bool want_logprob = true);

// ---- Logprobs of the raw model distribution (OpenAI `logprobs`) --------------------------------

inline constexpr int kMaxTopLogprobs = 20;

// One row's log-softmax (no penalty, temperature 1) reduced to what a client asked for: the
// chosen token's logprob and the n_top best alternatives, best first (ties by lower id). A plain
// struct (it crosses MPI as bytes). Not ok() when the row was bad (token < 0: the RowError).
struct RowLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;
  int32_t n_top = 0;
  struct Alternative {
    int32_t id;
    float logprob;
  };
  Alternative top[kMaxTopLogprobs] = {};  // [n_top], best first
  bool ok() const { return token >= 0; }
};

// `token` in [0, row.size()), n_top in [0, kMaxTopLogprobs]. O(row) time; `scratch` is reused.
RowLogprobs row_logprobs(std::span<const float> row, int32_t token, int n_top,
                         std::vector<int32_t>* scratch);

// The distribution sample() draws from, for tests and tools: probs[i] = probability of token i
// after all processing (0 for tokens cut by top-k/top-p; one-hot on the argmax when greedy;
// all 0 for a row sample() refuses).
void processed_probabilities(std::span<const float> logits, const SamplingParams& params,
                             std::span<const int32_t> history, std::vector<float>* probs);

// The logprob sample() reports for `token` (see "Reported logprob" above), whichever token was
// drawn: speculative decoding with a sampled draft emits tokens that sample() did not pick
// (runtime/spec/sampled_drafts.h). NaN for a row sample() refuses. `token` in [0, logits.size()).
float processed_logprob(std::span<const float> logits, const SamplingParams& params,
                        std::span<const int32_t> history, int32_t token);

// ---- Tensor parallelism: sampling from a vocab-sharded row --------------------------------------
//
// Each rank holds logits for global ids [id_begin, id_begin + valid_count) (padding rows beyond
// valid_count excluded) and calls local_candidates(); the sampling rank concatenates every rank's
// candidates (any order) and normalizers and calls sample_from_candidates(). The token is exactly
// the one sample() picks on the whole row, and both consume the same random numbers; the logprob
// agrees to rounding (~1e-7; exactly when top_k == 0).
//
// What a rank sends (8 bytes per candidate, plus 12 bytes of normalizer):
//   greedy (temperature 0)          1 candidate: the local argmax (ties -> lowest id)
//   top_k > 0 (with or without p)   min(top_k, valid_count): the local top-k in (logit desc, id
//                                   asc); the global top-k is always among them
//   top_k == 0 (top-p or plain)     all valid_count tokens, in id order. Whether a token is in
//                                   the nucleus depends on the mass of every other rank, so no
//                                   local rule can drop any; set a top_k to bound the traffic.
//                                   Then the candidates of all ranks must cover ids 0..V-1.

// Logits here are after the repetition penalty; the temperature t is applied to differences,
// exp((l - max) / t), which stays finite for any t > 0 (l / t alone overflows for tiny t).
// Greedy uses t = 1.
struct Candidate {
  int32_t id;   // global token id
  float logit;  // after the repetition penalty
};

// Partial softmax normalizer: the log-sum-exp of (l / t) over the covered logits is
// max / t + log(sum_exp).
struct LogNormalizer {
  float max = -std::numeric_limits<float>::infinity();
  double sum_exp = 0.0;  // sum of exp((l - max) / t)
};

struct CandidateSet {
  std::vector<Candidate> candidates;
  // Over all valid local logits; NaN or +inf (with no candidates) when this slice holds one,
  // which makes the whole row fail in sample_from_candidates().
  float local_max = -std::numeric_limits<float>::infinity();
  double local_sum_exp = 0.0;  // sum of exp((l - local_max) / t) over all valid local logits
  LogNormalizer normalizer() const { return {local_max, local_sum_exp}; }
};

// `local_logits` has at least valid_count entries; history ids outside this rank's range are
// skipped. Allocates the returned vector. A slice with a NaN or +inf gives a set with that
// local_max (NaN first) and no candidates.
CandidateSet local_candidates(std::span<const float> local_logits, int32_t id_begin,
                              int32_t valid_count, const SamplingParams& params,
                              std::span<const int32_t> history);

// The global normalizer from every rank's (local_max, local_sum_exp); `params` gives t. Its max
// is NaN when any rank's is, else +inf when any rank's is (a bad slice).
LogNormalizer combine_normalizers(std::span<const LogNormalizer> per_rank,
                                  const SamplingParams& params);

// `candidates`: all ranks' candidates concatenated; `global`: combine_normalizers() of all ranks.
// Not ok() when the row was bad on any rank (the normalizer's max says how, as row_is_bad).
SampleResult sample_from_candidates(std::span<const Candidate> candidates, LogNormalizer global,
                                    const SamplingParams& params, Rng& rng);

// Convenience for one process holding every rank's set: concatenate, combine, sample.
SampleResult sample_from_candidate_sets(std::span<const CandidateSet> per_rank,
                                        const SamplingParams& params, Rng& rng);

}  // namespace ltm
