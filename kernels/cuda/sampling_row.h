// The device sampler's row algorithm (kernels/cuda/sampling.h): runtime/sampling/sampler.cpp,
// step by step, run by every thread of one block. The functions keep the host's names; where the
// host works on a sorted float array this works on the same values as order keys (int32 whose
// order is the float order), converted back before any arithmetic.
//
// Compiled by nvcc into sampling.cu (with --fmad=false: no multiply-add is fused, as on the
// host), and as plain C++ by tests/engine/sampling_emulated_test.cpp, which runs it on CPU
// threads as a block (its threads, barrier, warp shuffles and ballots emulated) so that CI
// checks the kernel's algorithm against the host sampler without a GPU. That test defines the
// CUDA built-ins used here (threadIdx, __syncthreads, __shfl_xor_sync, __ballot_sync, __popc,
// atomicAdd, __float_as_int, __int_as_float, __longlong_as_double, min, max) before including.
//
// Every helper that synchronises the block is called from control flow that is the same for all
// threads of the block (it depends only on the row's parameters and on values broadcast through
// shared memory).
#pragma once

#include <climits>
#include <cstdint>

#include "runtime/sampling/rng_core.h"
#include "runtime/sampling/sample_rows.h"

#if defined(__CUDACC__)
#define LTM_SAMPLING_DEVICE __device__
#define LTM_SAMPLING_LOG(x) log(x)
#else
#include <cmath>
#define LTM_SAMPLING_DEVICE
#define LTM_SAMPLING_LOG(x) std::log(x)
#endif

#ifndef LTM_SAMPLING_THREADS
#define LTM_SAMPLING_THREADS 512  // threads per block (a multiple of 32, at most 1024)
#endif

namespace ltm::kernels::cuda {
namespace {

constexpr int kThreads = LTM_SAMPLING_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kBlock = 256;  // ids per block of the normalizer (the host's kBlock)
constexpr int kLanes = 8;    // the host's kLanes
constexpr int kSharedSort = 4096;  // keys sorted in shared memory up to this many (16 KB)
constexpr int kRowsPerLaunch = 64;  // workspace slots: larger batches run in several launches
constexpr int32_t kPad = INT32_MIN;  // sorts after every key (-inf's key is larger)

// RowError (runtime/sampling/sampler.h).
constexpr int32_t kNaN = -1;
constexpr int32_t kPosInf = -2;
constexpr int32_t kAllNegInf = -3;

// ---- The host's scalar functions, operation for operation ---------------------------------------

LTM_SAMPLING_DEVICE int32_t order_key(float f) {
  const int32_t b = __float_as_int(f);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
LTM_SAMPLING_DEVICE float from_order_key(int32_t k) {
  return __int_as_float(k ^ ((k >> 31) & 0x7FFFFFFF));
}

LTM_SAMPLING_DEVICE bool is_inf(float f) {
  return (__float_as_int(f) & 0x7FFFFFFF) == 0x7F800000;
}
LTM_SAMPLING_DEVICE bool is_finite(float f) {
  return (__float_as_int(f) & 0x7F800000) != 0x7F800000;
}
// The magnitude of `mag` with the sign of `sign`.
LTM_SAMPLING_DEVICE float copy_sign(float mag, float sign) {
  return __int_as_float((__float_as_int(mag) & 0x7FFFFFFF) |
                        (__float_as_int(sign) & static_cast<int32_t>(0x80000000u)));
}
constexpr float kFloatMax = 3.40282346638528859811704183484516925e+38f;  // FLT_MAX

// kernels/cpu/fast_math.h exp_approx.
LTM_SAMPLING_DEVICE float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const bool underflow = x < -87.3f;
  x = x > 88.3f ? 88.3f : (underflow ? -87.3f : x);
  constexpr float kRound = 12582912.0f;
  const float n = (x * kLog2e + kRound) - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = __int_as_float(static_cast<int32_t>(
      static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23));
  return underflow ? 0.0f : p * scale;
}

LTM_SAMPLING_DEVICE float weight(float v, float m, float t) {
  return exp_approx((v - m) / t);
}

LTM_SAMPLING_DEVICE float penalize(float logit, float penalty) {
  const float v = logit < 0.0f ? logit * penalty : logit / penalty;
  return is_inf(v) && is_finite(logit) ? copy_sign(kFloatMax, v) : v;
}

// ---- Block-wide building blocks (every thread of the block calls them) -----------------------

struct Shared {
  int32_t red[kWarps];
  int32_t scan[kWarps];
  int32_t hist[256];
  int32_t count;
  int32_t digit;
  int32_t cross_index;
  double cross_mass;
  double z;
  int32_t sort[kSharedSort];
};

// A reduction over the block with `op` (max, min or +); every thread gets the result.
template <class Op>
LTM_SAMPLING_DEVICE int32_t block_reduce(int32_t x, int32_t identity, Op op, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red[threadIdx.x >> 5] = x;
  __syncthreads();
  x = (threadIdx.x & 31) < kWarps ? sh.red[threadIdx.x & 31] : identity;
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

struct MaxOp {
  LTM_SAMPLING_DEVICE int32_t operator()(int32_t a, int32_t b) const { return max(a, b); }
};
struct MinOp {
  LTM_SAMPLING_DEVICE int32_t operator()(int32_t a, int32_t b) const { return min(a, b); }
};
struct SumOp {
  LTM_SAMPLING_DEVICE int32_t operator()(int32_t a, int32_t b) const { return a + b; }
};

LTM_SAMPLING_DEVICE int32_t block_max(int32_t x, Shared& sh) {
  return block_reduce(x, INT32_MIN, MaxOp{}, sh);
}
LTM_SAMPLING_DEVICE int32_t block_min(int32_t x, Shared& sh) {
  return block_reduce(x, INT32_MAX, MinOp{}, sh);
}
LTM_SAMPLING_DEVICE int32_t block_sum(int32_t x, Shared& sh) {
  return block_reduce(x, 0, SumOp{}, sh);
}

// The number of set flags before this thread's (in thread order); *total gets all of them.
LTM_SAMPLING_DEVICE int32_t block_exclusive_scan(bool flag, Shared& sh, int32_t* total) {
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.scan[warp] = __popc(ballot);
  __syncthreads();
  int32_t before = 0, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    const int32_t c = sh.scan[w];
    before += w < warp ? c : 0;
    sum += c;
  }
  *total = sum;
  return before + __popc(ballot & ((1u << lane) - 1u));
}

// Row views: values by index, from floats or from order keys.
struct FloatRow {
  const float* p;
  LTM_SAMPLING_DEVICE float operator()(int32_t i) const { return p[i]; }
};
struct KeyRow {
  const int32_t* p;
  LTM_SAMPLING_DEVICE float operator()(int32_t i) const { return from_order_key(p[i]); }
};

// sums[b] = the host's block_sum_exp over s[b * kBlock, min(n, (b + 1) * kBlock)): lane j of a
// block adds, in double and in index order, the weights of its entries j, j + 8, ... (the host's
// zero padding adds nothing); the lanes then add in the host's fixed tree.
template <class Row>
LTM_SAMPLING_DEVICE void block_sums(Row s, int32_t n, float m, float t, double* lanes,
                                    double* sums) {
  const int32_t nb = (n + kBlock - 1) / kBlock;
  for (int32_t u = threadIdx.x; u < nb * kLanes; u += kThreads) {
    const int32_t b = u / kLanes, j = u % kLanes;
    const int32_t end = min(n, (b + 1) * kBlock);
    double acc = 0.0;
    for (int32_t i = b * kBlock + j; i < end; i += kLanes) acc += weight(s(i), m, t);
    lanes[u] = acc;
  }
  __syncthreads();
  for (int32_t b = threadIdx.x; b < nb; b += kThreads) {
    const double* a = lanes + b * kLanes;
    sums[b] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  }
  __syncthreads();
}

// The host's sum_exp: block sums added in id order.
template <class Row>
LTM_SAMPLING_DEVICE double sum_exp(Row s, int32_t n, float m, float t, double* lanes,
                                   double* sums, Shared& sh) {
  block_sums(s, n, m, t, lanes, sums);
  if (threadIdx.x == 0) {
    double z = 0.0;
    for (int32_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) z += sums[b];
    sh.z = z;
  }
  __syncthreads();
  const double z = sh.z;
  __syncthreads();
  return z;
}

// The host's first_crossing: the block sums in parallel, then one thread walks them (and the
// entries of the crossing block) in the host's order. Result in sh.cross_index / sh.cross_mass.
template <class Row>
LTM_SAMPLING_DEVICE void first_crossing(Row s, int32_t n, float m, float t, double target,
                                        bool strict, double* lanes, double* sums,
                                        Shared& sh) {
  block_sums(s, n, m, t, lanes, sums);
  if (threadIdx.x == 0) {
    const auto crossed = [&](double mass) { return strict ? mass > target : mass >= target; };
    double cum = 0.0;
    int32_t index = n;
    double mass = 0.0;
    bool found = false;
    for (int32_t b = 0; b * kBlock < n && !found; ++b) {
      const int32_t begin = b * kBlock, end = min(n, begin + kBlock);
      const double block = sums[b];
      if (crossed(cum + block)) {
        double c2 = cum;
        int32_t last_positive = begin;
        index = -1;
        for (int32_t i = begin; i < end; ++i) {
          const float w = weight(s(i), m, t);
          c2 += w;
          if (w > 0.0f) last_positive = i;
          if (w > 0.0f && crossed(c2)) {
            index = i;
            mass = c2;
            break;
          }
        }
        if (index < 0) {  // entry-by-entry rounding fell short of the block sum
          index = last_positive;
          mass = cum + block;
        }
        found = true;
      } else {
        cum += block;
      }
    }
    if (!found) mass = cum;
    sh.cross_index = index;
    sh.cross_mass = mass;
  }
  __syncthreads();
}

// The host's draw: a position of s[0, n) for u01, with probability proportional to its weight.
template <class Row>
LTM_SAMPLING_DEVICE int32_t draw(Row s, int32_t n, float m, float t, double mass, double u01,
                                 double* lanes, double* sums, Shared& sh) {
  first_crossing(s, n, m, t, u01 * mass, /*strict=*/true, lanes, sums, sh);
  const int32_t index = sh.cross_index;
  __syncthreads();
  if (index < n) return index;
  // u rounded up to the total: the last entry with a positive weight.
  int32_t last = -1;
  for (int32_t i = threadIdx.x; i < n; i += kThreads)
    if (weight(s(i), m, t) > 0.0f) last = i;
  return block_max(last, sh);
}

// Sorts keys[0, n) descending; `keys` has room for the next power of two >= n.
LTM_SAMPLING_DEVICE void sort_desc(int32_t* keys, int32_t n, Shared& sh) {
  int32_t size = 1;
  while (size < n) size <<= 1;
  int32_t* a = size <= kSharedSort ? sh.sort : keys;
  if (a == sh.sort) {
    for (int32_t i = threadIdx.x; i < size; i += kThreads) sh.sort[i] = i < n ? keys[i] : kPad;
  } else {
    for (int32_t i = n + threadIdx.x; i < size; i += kThreads) keys[i] = kPad;
  }
  __syncthreads();
  // Bitonic network, descending overall.
  for (int32_t k = 2; k <= size; k <<= 1) {
    for (int32_t j = k >> 1; j > 0; j >>= 1) {
      for (int32_t i = threadIdx.x; i < size; i += kThreads) {
        const int32_t partner = i ^ j;
        if (partner > i) {
          const int32_t x = a[i], y = a[partner];
          const bool descending = (i & k) == 0;
          if (descending ? x < y : x > y) {
            a[i] = y;
            a[partner] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  if (a == sh.sort) {
    for (int32_t i = threadIdx.x; i < n; i += kThreads) keys[i] = sh.sort[i];
    __syncthreads();
  }
}

// Unsigned keys, ascending with the float order; with merge_zeros -0 has +0's key (the host's
// candidate order compares floats, where -0 == +0 and the lower id wins).
LTM_SAMPLING_DEVICE uint32_t unsigned_key(float f, bool merge_zeros = false) {
  if (merge_zeros && f == 0.0f) f = 0.0f;
  return static_cast<uint32_t>(order_key(f)) ^ 0x80000000u;
}

// The k-th largest key of v[0, n) (0 < k < n), by a radix select (4 passes of 8 bits): *kth is
// its unsigned key, and *take how many entries equal to it complete the k (the rest of the k are
// above it). Every thread gets both.
LTM_SAMPLING_DEVICE void radix_select(const float* v, int32_t n, int32_t k, uint32_t* kth,
                                      int32_t* take, Shared& sh, bool merge_zeros = false) {
  uint32_t prefix = 0, mask = 0;
  int32_t remaining = k;  // how many of the keys matching `prefix` are still to take
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int32_t d = threadIdx.x; d < 256; d += kThreads) sh.hist[d] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < n; i += kThreads) {
      const uint32_t u = unsigned_key(v[i], merge_zeros);
      if ((u & mask) == prefix) atomicAdd(&sh.hist[(u >> shift) & 0xFF], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int32_t above = 0, d = 255;
      for (; d > 0 && above + sh.hist[d] < remaining; --d) above += sh.hist[d];
      sh.digit = d;
      sh.count = remaining - above;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.digit) << shift;
    mask |= 0xFFu << shift;
    remaining = sh.count;
    __syncthreads();
  }
  *kth = prefix;
  *take = remaining;
}

// The k largest values of v[0, n) as keys, sorted descending, into keys[0, k): radix_select,
// then every key above the k-th and as many copies of it as the k need, then the sort.
LTM_SAMPLING_DEVICE void top_k_sorted(const float* v, int32_t n, int32_t k, int32_t* keys,
                                      Shared& sh) {
  if (k == n) {
    for (int32_t i = threadIdx.x; i < n; i += kThreads) keys[i] = order_key(v[i]);
    __syncthreads();
    sort_desc(keys, n, sh);
    return;
  }
  uint32_t prefix;
  int32_t remaining;
  radix_select(v, n, k, &prefix, &remaining, sh);
  // prefix: the k-th largest key; `remaining` copies of it complete the k.
  if (threadIdx.x == 0) sh.count = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t u = unsigned_key(v[i]);
    if (u > prefix) keys[atomicAdd(&sh.count, 1)] = order_key(v[i]);
  }
  __syncthreads();
  const int32_t above = sh.count;
  const int32_t kth = static_cast<int32_t>(prefix ^ 0x80000000u);
  for (int32_t i = above + threadIdx.x; i < k; i += kThreads) keys[i] = kth;
  __syncthreads();
  sort_desc(keys, k, sh);
}

// The index of the r-th (0-based) entry of v equal to `value` (float ==): tiles of the block,
// counted, then the tile that holds it scanned.
LTM_SAMPLING_DEVICE int32_t nth_equal(const float* v, int32_t n, float value, int32_t r,
                                      Shared& sh) {
  for (int32_t base = 0; base < n; base += kThreads) {
    const int32_t i = base + threadIdx.x;
    const bool eq = i < n && v[i] == value;
    int32_t total;
    const int32_t before = block_exclusive_scan(eq, sh, &total);
    if (r < total) {
      const int32_t found = block_max(eq && before == r ? i : -1, sh);
      return found;
    }
    r -= total;
  }
  return -1;  // not reached: the value is in the row
}

// The id of keys[j] in (value desc, id asc) order: the (rank among equal values before j)-th id
// of that value in id order.
LTM_SAMPLING_DEVICE int32_t id_of_position(const float* v, int32_t n, const int32_t* keys,
                                           int32_t j, Shared& sh) {
  const float value = from_order_key(keys[j]);
  int32_t equal = 0;
  for (int32_t i = threadIdx.x; i < j; i += kThreads) equal += from_order_key(keys[i]) == value;
  const int32_t r = block_sum(equal, sh);
  return nth_equal(v, n, value, r, sh);
}

// ---- One row ------------------------------------------------------------------------------------

struct RowWorkspace {
  float* v;        // [n] the penalized row
  int32_t* keys;   // [next pow2 >= n] selected / sorted keys
  double* lanes;   // [blocks * kLanes]
  double* sums;    // [blocks]
};

// Row r of `a`, by every thread of the block, with the row's workspace and the block's shared
// memory.
LTM_SAMPLING_DEVICE void sample_row(const SampleRowsArgs& a, int32_t r, RowWorkspace ws,
                                    Shared& sh) {
  const int32_t n = static_cast<int32_t>(a.vocab);
  const SampleRowParams p = a.params[r];
  const float* logits = a.logits + static_cast<int64_t>(r) * a.stride;
  const bool want_logprob = a.logprobs != nullptr;
  const float nan = __int_as_float(0x7FC00000);

  // Repetition penalty (idempotent for repeated ids: each write penalizes the raw logit).
  float* v = ws.v;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) v[i] = logits[i];
  __syncthreads();
  if (p.repetition_penalty != 1.0f && p.history_count > 0) {
    const int32_t* history = a.history + p.history_offset;
    for (int32_t j = threadIdx.x; j < p.history_count; j += kThreads) {
      const int32_t id = history[j];
      if (id >= 0 && id < n) v[id] = penalize(logits[id], p.repetition_penalty);
    }
    __syncthreads();
  }

  // The row's keys: its max, or why it cannot be sampled (the host's keys_are_bad).
  int32_t hi = INT32_MIN, lo = INT32_MAX;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    const int32_t k = order_key(v[i]);
    hi = max(hi, k);
    lo = min(lo, k);
  }
  hi = block_max(hi, sh);
  lo = block_min(lo, sh);
  const int32_t pos_inf = order_key(__int_as_float(0x7F800000));
  const int32_t neg_inf = order_key(__int_as_float(static_cast<int32_t>(0xFF800000u)));
  int32_t error = 0;
  if (hi > pos_inf || lo < neg_inf) error = kNaN;
  else if (hi == pos_inf) error = kPosInf;
  else if (hi <= neg_inf) error = kAllNegInf;
  if (error != 0) {
    if (threadIdx.x == 0) {
      a.tokens[r] = error;
      if (want_logprob) a.logprobs[r] = nan;
    }
    return;
  }
  const float m = from_order_key(hi);
  const bool greedy = p.temperature == 0.0f;
  const float t = greedy ? 1.0f : p.temperature;

  if (greedy) {
    // The first argmax; the logprob needs z at temperature 1.
    int32_t first = INT32_MAX;
    for (int32_t i = threadIdx.x; i < n; i += kThreads)
      if (v[i] == m) first = min(first, i);
    const int32_t id = block_min(first, sh);
    float logprob = nan;
    if (want_logprob && p.want_logprob != 0) {
      const double z = sum_exp(FloatRow{v}, n, m, t, ws.lanes, ws.sums, sh);
      logprob = static_cast<float>(static_cast<double>((v[id] - m) / t) - LTM_SAMPLING_LOG(z));
    }
    if (threadIdx.x == 0) {
      a.tokens[r] = id;
      if (want_logprob) a.logprobs[r] = logprob;
    }
    return;
  }

  const double z = sum_exp(FloatRow{v}, n, m, t, ws.lanes, ws.sums, sh);
  RngCore rng = RngCore::for_step(p.seed, p.token_index);
  const double u01 = rng.uniform();  // the one draw of a non-greedy row (every thread alike)

  // What is kept: keys[0, kept) sorted descending with mass `mass`, or the whole row.
  bool whole_row = false;
  int32_t kept = 0;
  double mass = 0.0;
  if (p.top_k > 0) {
    const int32_t k = min(p.top_k, n);
    top_k_sorted(v, n, k, ws.keys, sh);
    // keep_from_top_k
    first_crossing(KeyRow{ws.keys}, k, m, t, __longlong_as_double(0x7FF0000000000000ll),
                   /*strict=*/false, ws.lanes, ws.sums, sh);
    const double all_mass = sh.cross_mass;
    __syncthreads();
    kept = k;
    mass = all_mass;
    if (p.top_p < 1.0f) {
      first_crossing(KeyRow{ws.keys}, k, m, t, static_cast<double>(p.top_p) * all_mass,
                     /*strict=*/false, ws.lanes, ws.sums, sh);
      if (sh.cross_index < k) {
        kept = sh.cross_index + 1;
        mass = sh.cross_mass;
      }
      __syncthreads();
    }
  } else if (p.top_p < 1.0f) {
    // keep_from_row: the values above widening thresholds, in id order, then sorted.
    const double target = static_cast<double>(p.top_p) * z;
    const float deltas[5] = {4.0f, 8.0f, 16.0f, 32.0f, __int_as_float(0x7F800000)};
    whole_row = true;
    for (int d = 0; d < 5; ++d) {
      const float delta = deltas[d];
      const float thr = is_inf(delta) ? __int_as_float(static_cast<int32_t>(0xFF800000u))
                                     : m - delta * t;
      int32_t c = 0;
      for (int32_t base = 0; base < n; base += kThreads) {
        const int32_t i = base + threadIdx.x;
        const bool in = i < n && v[i] >= thr;
        int32_t total;
        const int32_t at = block_exclusive_scan(in, sh, &total);
        if (in) ws.keys[c + at] = order_key(v[i]);
        c += total;
      }
      __syncthreads();
      if (c < n && sum_exp(KeyRow{ws.keys}, c, m, t, ws.lanes, ws.sums, sh) <
                       target * (1.0 - 1e-4))
        continue;
      sort_desc(ws.keys, c, sh);
      first_crossing(KeyRow{ws.keys}, c, m, t, target, /*strict=*/false, ws.lanes, ws.sums, sh);
      const int32_t index = sh.cross_index;
      const double crossing_mass = sh.cross_mass;
      __syncthreads();
      if (index < c) {
        whole_row = false;
        kept = index + 1;
        mass = crossing_mass;
        break;
      }
      if (c == n) break;
    }
  } else {
    whole_row = true;
  }

  int32_t id;
  if (whole_row) {
    id = draw(FloatRow{v}, n, m, t, z, u01, ws.lanes, ws.sums, sh);
  } else {
    const int32_t j = draw(KeyRow{ws.keys}, kept, m, t, mass, u01, ws.lanes, ws.sums, sh);
    id = id_of_position(v, n, ws.keys, j, sh);
  }
  if (threadIdx.x == 0) {
    a.tokens[r] = id;
    if (want_logprob)
      a.logprobs[r] =
          static_cast<float>(static_cast<double>((v[id] - m) / t) - LTM_SAMPLING_LOG(z));
  }
}


// ---- One row's candidates (tp > 1) --------------------------------------------------------------

// local_candidates (runtime/sampling/sampler.cpp) on row r of `a`, written as
// select_candidates_host writes it (runtime/sampling/sample_rows.h): the penalized slice, its max
// (or NaN / +inf for a bad slice, with no entries), its normalizer summed as the host sums it,
// and the greedy argmax, the top-k pairs (the canonical set: ties at the k-th value go to the
// lower ids; in id order, the ones above the k-th first) or the whole penalized slice.
LTM_SAMPLING_DEVICE void local_candidates(const CandidateRowsArgs& a, int32_t r, RowWorkspace ws,
                                          Shared& sh) {
  const int32_t n = static_cast<int32_t>(a.valid);
  const SampleRowParams p = a.params[r];
  const float* logits = a.logits + static_cast<int64_t>(r) * a.stride;
  unsigned char* base = static_cast<unsigned char*>(a.out);
  CandidateRowHeader* header = reinterpret_cast<CandidateRowHeader*>(base) + r;
  unsigned char* entries = base + sizeof(CandidateRowHeader) * a.rows +
                           candidate_row_offset(a.params, r, a.valid);
  const float neg_inf_f = __int_as_float(static_cast<int32_t>(0xFF800000u));
  if (n == 0) {
    if (threadIdx.x == 0) *header = CandidateRowHeader{neg_inf_f, 0, 0.0};
    return;
  }

  // Repetition penalty on this slice's ids (global ids: id - id_begin).
  float* v = ws.v;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) v[i] = logits[i];
  __syncthreads();
  if (p.repetition_penalty != 1.0f && p.history_count > 0) {
    const int32_t* history = a.history + p.history_offset;
    for (int32_t j = threadIdx.x; j < p.history_count; j += kThreads) {
      const int64_t local = static_cast<int64_t>(history[j]) - a.id_begin;
      if (local >= 0 && local < n) v[local] = penalize(logits[local], p.repetition_penalty);
    }
    __syncthreads();
  }

  // The slice's max, or why it is bad (a slice of -inf only is not: another holds the mass).
  int32_t hi = INT32_MIN, lo = INT32_MAX;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    const int32_t k = order_key(v[i]);
    hi = max(hi, k);
    lo = min(lo, k);
  }
  hi = block_max(hi, sh);
  lo = block_min(lo, sh);
  const int32_t pos_inf = order_key(__int_as_float(0x7F800000));
  const int32_t neg_inf = order_key(neg_inf_f);
  if (hi > pos_inf || lo < neg_inf || hi == pos_inf) {
    const int64_t room = candidate_row_bytes(p, a.valid);  // zeros, as the host's
    for (int64_t i = threadIdx.x; i < room; i += kThreads) entries[i] = 0;
    if (threadIdx.x == 0)
      *header = CandidateRowHeader{hi == pos_inf && lo >= neg_inf ? __int_as_float(0x7F800000)
                                                                  : __int_as_float(0x7FC00000),
                                   0, 0.0};
    return;
  }
  const float m = from_order_key(hi);
  const bool greedy = p.temperature == 0.0f;
  const float t = greedy ? 1.0f : p.temperature;
  const double z = hi > neg_inf ? sum_exp(FloatRow{v}, n, m, t, ws.lanes, ws.sums, sh) : 0.0;

  int32_t count;
  if (greedy) {
    int32_t first = INT32_MAX;
    for (int32_t i = threadIdx.x; i < n; i += kThreads)
      if (v[i] == m) first = min(first, i);
    const int32_t id = block_min(first, sh);
    if (threadIdx.x == 0) {
      const CandidateEntry e{a.id_begin + id, v[id]};
      *reinterpret_cast<CandidateEntry*>(entries) = e;
    }
    count = 1;
  } else if (candidate_row_pairs(p, a.valid)) {
    const int32_t k = min(p.top_k, n);  // < n / 2 here
    uint32_t kth;
    int32_t take;
    radix_select(v, n, k, &kth, &take, sh, /*merge_zeros=*/true);
    CandidateEntry* out = reinterpret_cast<CandidateEntry*>(entries);
    int32_t above_done = 0, equal_done = 0;
    for (int32_t base_i = 0; base_i < n; base_i += kThreads) {
      const int32_t i = base_i + threadIdx.x;
      const uint32_t u = i < n ? unsigned_key(v[i], /*merge_zeros=*/true) : 0u;
      int32_t above_total, equal_total;
      const int32_t above_before = block_exclusive_scan(i < n && u > kth, sh, &above_total);
      const int32_t equal_before = block_exclusive_scan(i < n && u == kth, sh, &equal_total);
      if (i < n && u > kth) out[above_done + above_before] = CandidateEntry{a.id_begin + i, v[i]};
      if (i < n && u == kth && equal_done + equal_before < take)
        out[k - take + equal_done + equal_before] = CandidateEntry{a.id_begin + i, v[i]};
      above_done += above_total;
      equal_done += equal_total;
    }
    count = k;
  } else {
    float* out = reinterpret_cast<float*>(entries);
    for (int32_t i = threadIdx.x; i < n; i += kThreads) out[i] = v[i];
    if (threadIdx.x == 0 && n % 2 == 1) out[n] = 0.0f;  // the padding to 8 bytes, as the host's
    count = n;
  }
  __syncthreads();
  if (threadIdx.x == 0) *header = CandidateRowHeader{m, count, z};
}

}  // namespace
}  // namespace ltm::kernels::cuda
