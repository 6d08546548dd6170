// Token sampling. See sampler.h for the semantics; this file is about doing it exactly (the
// sharded path must pick the same token as the whole-row path) and fast (vocab 50257 in well under
// a third of a millisecond).
//
// Internal representation: "values" are the logits after the repetition penalty only. Temperature
// is applied to differences from the row max, weight(v) = exp((v - max) / t), which keeps every
// weight in [0, 1] and stays finite for any t > 0 (v / t alone overflows float for tiny t).
//
// Exactness: every decision is a function of the same floating-point values summed in the same
// order on both paths:
//   - the row normalizer Z is summed in blocks of kBlock ids with kSumExpLanes fixed lanes
//     (sum_exp), both by sample() and, over the reassembled row, by sample_from_candidates();
//   - top-k and top-p work on the kept values sorted descending; equal values have equal weights,
//     so the cumulative sums do not depend on how ties are ordered, and a drawn position is mapped
//     to the (rank among equal values)-th id in id order, i.e. (logit desc, id asc).
#include "runtime/sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "kernels/cpu/fast_math.h"
#include "runtime/sampling/sum_exp_isa.h"

namespace ltm {

// ---- Parameters and random numbers --------------------------------------------------------------

absl::Status validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be >= 0 and finite (0 = greedy), got %g", p.temperature));
  if (p.top_k < 0)
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0 = off), got ", p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return absl::InvalidArgumentError(
        absl::StrFormat("top_p must be in (0, 1] (1 = off), got %g", p.top_p));
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    return absl::InvalidArgumentError(absl::StrFormat(
        "repetition_penalty must be > 0 and finite (1 = off), got %g", p.repetition_penalty));
  return absl::OkStatus();
}

// ---- Numeric kernels ----------------------------------------------------------------------------

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr size_t kBlock = kSumExpBlock;  // ids per block of the row normalizer
constexpr size_t kSmallSort = 512;  // below this, std::sort; above, radix sort

// `#pragma omp simd` (with clauses) when OpenMP is on, as it is for ltm_engine, so that the
// loops over a row vectorize at -O2 too; nothing otherwise.
#ifdef _OPENMP
#define LTM_PRAGMA(x) _Pragma(#x)
#define LTM_OMP_SIMD(...) LTM_PRAGMA(omp simd __VA_ARGS__)
#else
#define LTM_OMP_SIMD(...)
#endif

// exp(x) for x <= 0 (x may be -inf; 0 below -87.3): the kernels' vectorisable exp, so that the
// loops over a row vectorize.
inline float exp_nonpos(float x) { return kernels::cpu::exp_approx(x); }

// The unnormalized probability of a value: exp((v - m) / t), m the row max, t > 0.
inline float weight(float v, float m, float t) { return exp_nonpos((v - m) / t); }

// Sum of weights over v[0, n), n <= kBlock, in 8 fixed lanes (lane = index mod 8)
// added in a fixed tree: the result does not depend on how the compiler vectorizes the loops, nor
// on the vector path that runs it (sum_exp_kernel.inc: the same source for the baseline, AVX2
// and AVX-512, without fused multiply-add). A row of 50257 on the Zen 5 VM: 64 us on the
// baseline's 4 lanes, 28 us AVX2, 16 us AVX-512 (a greedy token's logprob: 75 us -> 24 us).
double block_sum_exp(const float* v, size_t n, float m, float t) {
  return block_sum_exp_fn()(v, n, m, t);
}

// The row normalizer: block sums of kBlock ids added in id order.
double sum_exp(std::span<const float> v, float m, float t) {
  const BlockSumExpFn block = block_sum_exp_fn();
  double z = 0.0;
  for (size_t b = 0; b < v.size(); b += kBlock)
    z += block(v.data() + b, std::min(kBlock, v.size() - b), m, t);
  return z;
}

// HF's rule, saturating: a finite logit stays finite for any accepted penalty (3 / 1e-40 would be
// +inf, which no distribution has; -3 * 3e38 would be -inf, which would drop the token for good
// where HF's float32 keeps it last). -inf stays -inf.
inline float penalize(float logit, float penalty) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float v = logit < 0.0f ? logit * penalty : logit / penalty;
  return std::isinf(v) && std::isfinite(logit) ? std::copysign(kMax, v) : v;
}

// An int32 whose signed order is the float order: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN.
inline int32_t order_key(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
inline float from_order_key(int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7FFFFFFF)); }

// One pass over a row: the largest and smallest order keys. Integer min/max reductions vectorize
// without fast-math, and NaNs of either sign land outside [key(-inf), key(+inf)].
struct RowKeys {
  int32_t hi = std::numeric_limits<int32_t>::min();
  int32_t lo = std::numeric_limits<int32_t>::max();
};
RowKeys row_keys(std::span<const float> v) {
  int32_t hi = std::numeric_limits<int32_t>::min();
  int32_t lo = std::numeric_limits<int32_t>::max();
  LTM_OMP_SIMD(reduction(max : hi) reduction(min : lo))
  for (size_t i = 0; i < v.size(); ++i) {
    const int32_t k = order_key(v[i]);
    hi = std::max(hi, k);
    lo = std::min(lo, k);
  }
  return {hi, lo};
}

// What is wrong with a row whose keys are `k`, if anything: a NaN, a +inf, or no finite value.
bool keys_are_bad(RowKeys k, RowError* why) {
  const int32_t pos_inf = order_key(std::numeric_limits<float>::infinity());
  if (k.hi > pos_inf || k.lo < order_key(kNegInf)) {
    *why = RowError::kNaN;
  } else if (k.hi == pos_inf) {
    *why = RowError::kPosInf;
  } else if (k.hi <= order_key(kNegInf)) {
    *why = RowError::kAllNegInf;  // also an empty row
  } else {
    return false;
  }
  return true;
}

}  // namespace

const char* row_error_name(RowError e) {
  switch (e) {
    case RowError::kNaN: return "a NaN in the logits";
    case RowError::kPosInf: return "a +inf in the logits";
    case RowError::kAllNegInf: return "every logit -inf";
  }
  return "a bad logits row";
}

bool row_is_bad(std::span<const float> row, RowError* why) { return keys_are_bad(row_keys(row), why); }

namespace {

// Sorts a[0, n) descending. `tmp` has room for n floats. -0 and +0 may come in either order;
// they are equal values with equal weights, which is all the callers rely on.
void sort_desc(float* a, size_t n, float* tmp) {
  if (n <= kSmallSort) {
    std::sort(a, a + n, std::greater<float>());
    return;
  }
  // LSD radix sort on keys whose unsigned order is the descending float order: 3 passes of 11,
  // 11 and 10 bits, skipping a pass whose digit is the same for every key.
  auto key = [](float f) {
    const uint32_t b = std::bit_cast<uint32_t>(f);
    const uint32_t asc = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ~asc;
  };
  constexpr int kShift[3] = {0, 11, 22};
  constexpr uint32_t kMask = 0x7FF;
  uint32_t count[3][2048] = {};  // 24 KB of stack
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = key(a[i]);
    for (int d = 0; d < 3; ++d) ++count[d][(k >> kShift[d]) & kMask];
  }
  float* src = a;
  float* dst = tmp;
  for (int d = 0; d < 3; ++d) {
    uint32_t* c = count[d];
    if (c[(key(src[0]) >> kShift[d]) & kMask] == n) continue;
    uint32_t sum = 0;
    for (int b = 0; b < 2048; ++b) {
      const uint32_t here = c[b];
      c[b] = sum;
      sum += here;
    }
    for (size_t i = 0; i < n; ++i) dst[c[(key(src[i]) >> kShift[d]) & kMask]++] = src[i];
    std::swap(src, dst);
  }
  if (src != a) std::memcpy(a, src, n * sizeof(float));
}

// The k largest values of v (a multiset), sorted descending, into out[0, k), 1 <= k <= v.size().
// `out` and `tmp` have room for v.size() floats.
void top_k_sorted(std::span<const float> v, size_t k, float* out, float* tmp) {
  const size_t n = v.size();
  LTM_ASSERT(k >= 1 && k <= n);
  if (k == n) {
    std::copy(v.begin(), v.end(), out);
  } else if (k <= 64) {
    // Min-heap of the best k seen so far; chunks whose largest order key does not beat the top
    // are skipped whole (the key order refines the float order: no value > top is skipped).
    std::copy(v.begin(), v.begin() + k, out);
    std::make_heap(out, out + k, std::greater<float>());
    auto offer = [&](float x) {
      if (x > out[0]) {
        std::pop_heap(out, out + k, std::greater<float>());
        out[k - 1] = x;
        std::push_heap(out, out + k, std::greater<float>());
      }
    };
    constexpr size_t kChunk = 64;
    size_t i = k;
    for (; i + kChunk <= n; i += kChunk) {
      int32_t hi = std::numeric_limits<int32_t>::min();
      LTM_OMP_SIMD(reduction(max : hi))
      for (size_t j = 0; j < kChunk; ++j) hi = std::max(hi, order_key(v[i + j]));
      if (hi > order_key(out[0]))
        for (size_t j = 0; j < kChunk; ++j) offer(v[i + j]);
    }
    for (; i < n; ++i) offer(v[i]);
  } else {
    // Radix select on order keys: a histogram of 2048 buckets spanning the keys' range; the
    // buckets above the one holding the k-th value are all in, that bucket is narrowed again.
    std::span<const float> s = v;
    size_t need = k;
    size_t n_out = 0;
    uint32_t count[2048];
    while (true) {
      int32_t hi = std::numeric_limits<int32_t>::min();
      int32_t lo = std::numeric_limits<int32_t>::max();
      LTM_OMP_SIMD(reduction(max : hi) reduction(min : lo))
      for (size_t i = 0; i < s.size(); ++i) {
        hi = std::max(hi, order_key(s[i]));
        lo = std::min(lo, order_key(s[i]));
      }
      const uint32_t range = static_cast<uint32_t>(hi) - static_cast<uint32_t>(lo);
      const int shift = std::max(0, static_cast<int>(std::bit_width(range)) - 11);
      const auto bucket = [&](float x) {
        return (static_cast<uint32_t>(hi) - static_cast<uint32_t>(order_key(x))) >> shift;
      };
      std::fill(std::begin(count), std::end(count), 0u);
      for (float x : s) ++count[bucket(x)];
      uint32_t b_k = 0;
      size_t above = 0;
      while (above + count[b_k] < need) above += count[b_k++];
      size_t c = 0;  // candidates of bucket b_k, compacted into tmp (s may be tmp: c <= index)
      for (float x : s) {
        const uint32_t b = bucket(x);
        if (b < b_k) out[n_out++] = x;
        if (b == b_k) tmp[c++] = x;
      }
      need -= above;
      if (need == c || shift == 0) {  // all of the bucket, or equal keys: any `need` of them
        std::copy(tmp, tmp + need, out + n_out);
        break;
      }
      s = std::span<const float>(tmp, c);
    }
  }
  sort_desc(out, k, tmp);
}

// Cumulative weights. A prefix's mass is defined blockwise so that it is both fast and exactly
// reproducible: whole blocks of kBlock entries contribute their block_sum_exp, added in order; a
// partial block is added entry by entry. Every mass comparison below uses this definition, so
// both paths (which call these functions on identical spans) make identical decisions.
struct Crossing {
  size_t index;  // first position where the prefix mass crosses the target; size() if none
  double mass;   // the prefix mass up to and including `index` (or of the whole span)
};

// strict: first position with mass > target among positive weights (a draw; zero-weight entries
// are never chosen); otherwise the first with mass >= target (the top-p cutoff).
Crossing first_crossing(std::span<const float> s, float m, float t, double target, bool strict) {
  const auto crossed = [&](double mass) { return strict ? mass > target : mass >= target; };
  double cum = 0.0;
  for (size_t b = 0; b < s.size(); b += kBlock) {
    const size_t len = std::min(kBlock, s.size() - b);
    const double block = block_sum_exp(s.data() + b, len, m, t);
    if (crossed(cum + block)) {
      double c2 = cum;
      size_t last_positive = b;
      for (size_t i = b; i < b + len; ++i) {
        const float w = weight(s[i], m, t);
        c2 += w;
        if (w > 0.0f) last_positive = i;
        if (w > 0.0f && crossed(c2)) return {i, c2};
      }
      // Entry-by-entry rounding fell short of the block sum: the block's last possible entry.
      return {last_positive, cum + block};
    }
    cum += block;
  }
  return {s.size(), cum};
}

// A position of `s` for u01 in [0, 1), with probability proportional to its weight.
size_t draw(std::span<const float> s, float m, float t, double mass, double u01) {
  const Crossing c = first_crossing(s, m, t, u01 * mass, /*strict=*/true);
  if (c.index < s.size()) return c.index;
  for (size_t i = s.size(); i-- > 0;)  // u rounded up to the total: the last possible entry
    if (weight(s[i], m, t) > 0.0f) return i;
  LTM_ASSERT(false, "sampler: no token with positive weight");
  return 0;
}

// The tokens kept after top-k/top-p: either a prefix of the row's values in descending order
// (`sorted`, with its mass), or the whole row (nothing truncated; mass = Z).
struct Kept {
  bool whole_row = false;
  std::span<const float> sorted;
  double mass = 0.0;
};

// Smallest prefix of `sorted` whose mass reaches `target` (the crossing value included); empty
// when the whole span does not reach it.
Kept nucleus(std::span<const float> sorted, float m, float t, double target) {
  const Crossing c = first_crossing(sorted, m, t, target, /*strict=*/false);
  if (c.index == sorted.size()) return {false, sorted.first(0), c.mass};
  return {false, sorted.first(c.index + 1), c.mass};
}

// Top-k already applied: `topk` holds the k best values descending. Applies top-p over them,
// renormalized (HF applies TopP after TopK on the masked scores).
Kept keep_from_top_k(std::span<const float> topk, float m, float t, float top_p) {
  const Kept all = nucleus(topk, m, t, std::numeric_limits<double>::infinity());
  if (top_p >= 1.0f) return {false, topk, all.mass};
  const Kept kept = nucleus(topk, m, t, static_cast<double>(top_p) * all.mass);
  return kept.sorted.empty() ? Kept{false, topk, all.mass} : kept;
}

// top_k == 0: top-p over the whole row `v` (id order) with normalizer z, or no truncation.
// The nucleus is the one a full descending sort gives; only the values above a threshold are
// sorted, widening the threshold until they hold the nucleus (a wider threshold gives the same
// nucleus, since the sorted prefix is the same). `work` and `tmp` have room for v.size() floats;
// the returned span points into `work`.
Kept keep_from_row(std::span<const float> v, float m, float t, float top_p, double z, float* work,
                   float* tmp) {
  if (top_p >= 1.0f) return {true, {}, z};
  const double target = static_cast<double>(top_p) * z;
  // Thresholds in log-weight: the tokens with weight >= exp(-delta).
  for (float delta : {4.0f, 8.0f, 16.0f, 32.0f, std::numeric_limits<float>::infinity()}) {
    const float thr = std::isinf(delta) ? kNegInf : m - delta * t;
    size_t c = 0;
    for (float x : v) {
      work[c] = x;
      c += x >= thr ? 1 : 0;
    }
    // A cheap estimate first: when the unsorted mass is clearly short, widen without sorting.
    if (c < v.size() && sum_exp(std::span<const float>(work, c), m, t) < target * (1.0 - 1e-4))
      continue;
    sort_desc(work, c, tmp);
    const Kept kept = nucleus(std::span<const float>(work, c), m, t, target);
    if (!kept.sorted.empty()) return kept;
    if (c == v.size()) break;
  }
  return {true, {}, z};  // rounding kept the nucleus from reaching p * z: no truncation
}

// The index of the r-th (0-based) element of v equal to `value`; it must exist. Counts matches
// per chunk with a vectorizable loop and scans only the chunk that holds the answer.
size_t nth_equal(std::span<const float> v, float value, size_t r) {
  constexpr size_t kChunk = 64;
  size_t i = 0;
  for (; i + kChunk <= v.size(); i += kChunk) {
    uint32_t count = 0;
    LTM_OMP_SIMD(reduction(+ : count))
    for (size_t j = 0; j < kChunk; ++j) count += v[i + j] == value ? 1u : 0u;
    if (count > r) break;
    r -= count;
  }
  for (; i < v.size(); ++i)
    if (v[i] == value && r-- == 0) return i;
  LTM_ASSERT(false, "sampler: value not found in the row");
  return 0;
}

// The id of sorted[j] in canonical order (value desc, id asc): the r-th id in id order among
// those with the same value, r = j's rank among equal values in `sorted`.
size_t id_of_position(std::span<const float> v, std::span<const float> sorted, size_t j) {
  const float value = sorted[j];
  size_t r = 0;
  while (r < j && sorted[j - r - 1] == value) ++r;
  return nth_equal(v, value, r);
}

size_t first_argmax(std::span<const float> v, float m) { return nth_equal(v, m, 0); }

float effective_temperature(const SamplingParams& p) {
  return p.temperature == 0.0f ? 1.0f : p.temperature;
}

// Everything sample() and processed_probabilities() share: the penalized row and its selection.
struct Prepared {
  std::span<const float> v;  // penalized logits, id order
  float m = 0.0f;            // max of v
  float t = 1.0f;            // effective temperature
  double z = 0.0;            // sum_exp(v, m, t)
  bool greedy = false;
  Kept kept;                 // unused when greedy
  bool bad = false;          // the row cannot be sampled (`error` says why); nothing else is set
  RowError error = RowError::kNaN;
};

Prepared prepare(std::span<const float> logits, const SamplingParams& params,
                 std::span<const int32_t> history, std::vector<float>* scratch,
                 bool want_z = true) {
  const size_t n = logits.size();
  LTM_ASSERT(n > 0 && n <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "sampler: bad row length ", n);
  LTM_ASSERT(validate(params).ok(), validate(params).ToString());
  // scratch: [0, n) penalized row, [n, 2n) work, [2n, 3n) sort buffer.
  if (scratch->size() < 3 * n) scratch->resize(3 * n);
  float* row = scratch->data();
  float* work = row + n;
  float* tmp = work + n;

  Prepared p;
  p.v = logits;
  if (params.repetition_penalty != 1.0f && !history.empty()) {
    std::copy(logits.begin(), logits.end(), row);
    for (int32_t id : history) {
      LTM_ASSERT(id >= 0 && static_cast<size_t>(id) < n, "sampler: history id ", id,
                 " outside the vocab of ", n);
      row[id] = penalize(logits[id], params.repetition_penalty);  // idempotent for repeats
    }
    p.v = std::span<const float>(row, n);
  }
  const RowKeys keys = row_keys(p.v);
  if (keys_are_bad(keys, &p.error)) {
    p.bad = true;
    return p;
  }
  p.m = from_order_key(keys.hi);
  p.t = effective_temperature(params);
  p.greedy = params.temperature == 0.0f;
  if (p.greedy && !want_z) return p;  // z stays 0: no logprob asked for
  p.z = sum_exp(p.v, p.m, p.t);
  if (p.greedy) return p;
  if (params.top_k > 0) {
    const size_t k = std::min(static_cast<size_t>(params.top_k), n);
    top_k_sorted(p.v, k, work, tmp);
    p.kept = keep_from_top_k(std::span<const float>(work, k), p.m, p.t, params.top_p);
  } else {
    p.kept = keep_from_row(p.v, p.m, p.t, params.top_p, p.z, work, tmp);
  }
  return p;
}

float log_prob(float value, float m, float t, double z) {
  return static_cast<float>(static_cast<double>((value - m) / t) - std::log(z));
}

}  // namespace

// ---- Whole-row sampling -------------------------------------------------------------------------

SampleResult sample(std::span<const float> logits, const SamplingParams& params,
                    std::span<const int32_t> history, Rng& rng, std::vector<float>* scratch,
                    bool want_logprob) {
  const Prepared p = prepare(logits, params, history, scratch, want_logprob);
  if (p.bad) return SampleResult::failed(p.error);
  size_t id;
  if (p.greedy) {
    id = first_argmax(p.v, p.m);
  } else if (p.kept.whole_row) {
    id = draw(p.v, p.m, p.t, p.z, rng.uniform());
  } else {
    const size_t j = draw(p.kept.sorted, p.m, p.t, p.kept.mass, rng.uniform());
    id = id_of_position(p.v, p.kept.sorted, j);
  }
  if (p.greedy && !want_logprob) return {static_cast<int32_t>(id), std::nanf("")};
  return {static_cast<int32_t>(id), log_prob(p.v[id], p.m, p.t, p.z)};
}

void processed_probabilities(std::span<const float> logits, const SamplingParams& params,
                             std::span<const int32_t> history, std::vector<float>* probs) {
  std::vector<float> scratch;
  const Prepared p = prepare(logits, params, history, &scratch);
  const size_t n = p.v.size();
  probs->assign(n, 0.0f);
  if (p.bad) return;
  if (p.greedy) {
    (*probs)[first_argmax(p.v, p.m)] = 1.0f;
    return;
  }
  if (p.kept.whole_row) {
    for (size_t i = 0; i < n; ++i)
      (*probs)[i] = static_cast<float>(weight(p.v[i], p.m, p.t) / p.z);
    return;
  }
  // Kept: every value above the last kept one, and the first `ties` ids equal to it.
  const std::span<const float> s = p.kept.sorted;
  const float last = s.back();
  size_t ties = 0;
  for (size_t j = s.size(); j-- > 0 && s[j] == last;) ++ties;
  for (size_t i = 0; i < n; ++i) {
    const bool keep = p.v[i] > last || (p.v[i] == last && ties > 0 && ties-- > 0);
    if (keep) (*probs)[i] = static_cast<float>(weight(p.v[i], p.m, p.t) / p.kept.mass);
  }
}

float processed_logprob(std::span<const float> logits, const SamplingParams& params,
                        std::span<const int32_t> history, int32_t token) {
  LTM_ASSERT(token >= 0 && static_cast<size_t>(token) < logits.size(), "sampler: token ", token,
             " outside the vocab of ", logits.size());
  std::vector<float> scratch;
  const Prepared p = prepare(logits, params, history, &scratch);
  if (p.bad) return std::nanf("");
  return log_prob(p.v[static_cast<size_t>(token)], p.m, p.t, p.z);
}

// ---- Logprobs of the raw distribution -----------------------------------------------------------

RowLogprobs row_logprobs(std::span<const float> row, int32_t token, int n_top,
                         std::vector<int32_t>* scratch) {
  LTM_ASSERT(token >= 0 && static_cast<size_t>(token) < row.size(), "row_logprobs: token ", token,
             " outside the row of ", row.size());
  LTM_ASSERT(n_top >= 0 && n_top <= kMaxTopLogprobs, "row_logprobs: n_top ", n_top);
  RowLogprobs out;
  const RowKeys keys = row_keys(row);
  RowError why;
  if (keys_are_bad(keys, &why)) {
    out.token = static_cast<int32_t>(why);
    out.logprob = std::numeric_limits<float>::quiet_NaN();
    return out;
  }
  const float m = from_order_key(keys.hi);
  const double log_z = static_cast<double>(m) + std::log(sum_exp(row, m, 1.0f));
  out.token = token;
  out.logprob = static_cast<float>(static_cast<double>(row[token]) - log_z);
  const size_t k = std::min<size_t>(static_cast<size_t>(n_top), row.size());
  if (k == 0) return out;
  // The k best ids in (logit desc, id asc): one pass keeping a sorted list of k (k <= 20; most
  // logits fall below the k-th and cost one comparison).
  std::vector<int32_t>& best = *scratch;
  best.clear();
  const auto better = [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  };
  for (int32_t i = 0; i < static_cast<int32_t>(row.size()); ++i) {
    if (best.size() == k && !better(i, best.back())) continue;
    if (best.size() == k) best.pop_back();
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
  }
  out.n_top = static_cast<int32_t>(k);
  for (size_t j = 0; j < k; ++j)
    out.top[j] = {best[j], static_cast<float>(static_cast<double>(row[best[j]]) - log_z)};
  return out;
}

// ---- Vocab-sharded sampling ---------------------------------------------------------------------

namespace {

// Canonical candidate order: logit descending, then id ascending.
bool canonical_less(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

}  // namespace

CandidateSet local_candidates(std::span<const float> local_logits, int32_t id_begin,
                              int32_t valid_count, const SamplingParams& params,
                              std::span<const int32_t> history) {
  LTM_ASSERT(valid_count >= 0 && static_cast<size_t>(valid_count) <= local_logits.size(),
             "local_candidates: valid_count ", valid_count, " of ", local_logits.size());
  LTM_ASSERT(id_begin >= 0, "local_candidates: id_begin ", id_begin);
  LTM_ASSERT(validate(params).ok(), validate(params).ToString());
  CandidateSet set;
  if (valid_count == 0) return set;
  std::vector<float> v(local_logits.begin(), local_logits.begin() + valid_count);
  if (params.repetition_penalty != 1.0f) {
    for (int32_t id : history) {
      const int64_t local = static_cast<int64_t>(id) - id_begin;
      if (local >= 0 && local < valid_count)
        v[local] = penalize(local_logits[local], params.repetition_penalty);
    }
  }
  const float t = effective_temperature(params);
  RowError why;
  if (keys_are_bad(row_keys(v), &why) && why != RowError::kAllNegInf) {
    // The sampling rank fails the row; a slice of -inf only is fine (another may hold the mass).
    set.local_max = why == RowError::kNaN ? std::numeric_limits<float>::quiet_NaN()
                                          : std::numeric_limits<float>::infinity();
    return set;
  }
  float m = kNegInf;
  for (float x : v) m = std::max(m, x);
  set.local_max = m;
  set.local_sum_exp = m > kNegInf ? sum_exp(v, m, t) : 0.0;

  const auto candidate = [&](int32_t i) { return Candidate{id_begin + i, v[i]}; };
  if (params.temperature == 0.0f) {
    set.candidates.push_back(candidate(static_cast<int32_t>(first_argmax(v, m))));
  } else {
    set.candidates.reserve(valid_count);
    for (int32_t i = 0; i < valid_count; ++i) set.candidates.push_back(candidate(i));
    if (params.top_k > 0) {
      const size_t k = std::min<size_t>(params.top_k, valid_count);
      auto& c = set.candidates;
      std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), canonical_less);
      c.resize(k);
      std::sort(c.begin(), c.end(), canonical_less);
    }
  }
  return set;
}

LogNormalizer combine_normalizers(std::span<const LogNormalizer> per_rank,
                                  const SamplingParams& params) {
  const float t = effective_temperature(params);
  LogNormalizer g;
  for (const LogNormalizer& r : per_rank) {
    if (std::isnan(r.max)) return {r.max, 0.0};  // a bad slice: the row fails
    g.max = std::max(g.max, r.max);
  }
  if (g.max == kNegInf || std::isinf(g.max)) return g;
  for (const LogNormalizer& r : per_rank)
    if (r.max > kNegInf) g.sum_exp += r.sum_exp * std::exp(static_cast<double>((r.max - g.max) / t));
  return g;
}

SampleResult sample_from_candidates(std::span<const Candidate> candidates, LogNormalizer global,
                                    const SamplingParams& params, Rng& rng) {
  LTM_ASSERT(validate(params).ok(), validate(params).ToString());
  // A rank's bad slice, or every logit -inf: nothing to sample from.
  if (std::isnan(global.max)) return SampleResult::failed(RowError::kNaN);
  if (global.max == std::numeric_limits<float>::infinity())
    return SampleResult::failed(RowError::kPosInf);
  if (global.max == kNegInf || candidates.empty()) return SampleResult::failed(RowError::kAllNegInf);
  const float t = effective_temperature(params);

  if (params.temperature == 0.0f) {
    const Candidate best = *std::min_element(candidates.begin(), candidates.end(), canonical_less);
    return {best.id, log_prob(best.logit, global.max, t, global.sum_exp)};
  }

  std::vector<Candidate> c(candidates.begin(), candidates.end());
  if (params.top_k > 0) {
    const size_t k = std::min<size_t>(params.top_k, c.size());
    std::partial_sort(c.begin(), c.begin() + k, c.end(), canonical_less);
    std::vector<float> values(k);
    for (size_t j = 0; j < k; ++j) values[j] = c[j].logit;
    const float m = values[0];  // finite: the global max is, and it is among the top-k
    const Kept kept = keep_from_top_k(values, m, t, params.top_p);
    const size_t j = draw(kept.sorted, m, t, kept.mass, rng.uniform());
    return {c[j].id, log_prob(c[j].logit, global.max, t, global.sum_exp)};
  }

  // No top-k: the candidates are the whole row; rebuild it in id order and run the row path.
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  const size_t n = c.size();
  std::vector<float> buf(3 * n);
  float* row = buf.data();
  for (size_t i = 0; i < n; ++i) {
    LTM_ASSERT(c[i].id == static_cast<int32_t>(i),
               "sample_from_candidates: without top_k the candidates must cover ids 0..V-1; "
               "position ", i, " holds id ", c[i].id);
    row[i] = c[i].logit;
  }
  const std::span<const float> v(row, n);
  const float m = global.max;  // the max of the row the candidates rebuild
  const double z = sum_exp(v, m, t);
  const Kept kept = keep_from_row(v, m, t, params.top_p, z, row + n, row + 2 * n);
  size_t id;
  if (kept.whole_row) {
    id = draw(v, m, t, z, rng.uniform());
  } else {
    id = id_of_position(v, kept.sorted, draw(kept.sorted, m, t, kept.mass, rng.uniform()));
  }
  return {static_cast<int32_t>(id), log_prob(v[id], m, t, z)};
}

SampleResult sample_from_candidate_sets(std::span<const CandidateSet> per_rank,
                                        const SamplingParams& params, Rng& rng) {
  std::vector<Candidate> all;
  std::vector<LogNormalizer> norms;
  for (const CandidateSet& s : per_rank) {
    all.insert(all.end(), s.candidates.begin(), s.candidates.end());
    norms.push_back(s.normalizer());
  }
  return sample_from_candidates(all, combine_normalizers(norms, params), params, rng);
}

}  // namespace ltm
