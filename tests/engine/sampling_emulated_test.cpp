// The CUDA sampler's row algorithm (kernels/cuda/sampling_row.h, the code sampling.cu runs on a
// GPU) compiled for the CPU and run on emulated threads of one block (fibers: __syncthreads is a
// switch to a scheduler that checks every thread reached the same barrier; warp shuffles and
// ballots exchange through a shared array between two barriers). Against the host sampler (sample() row by row) on the shared cases
// (sample_rows_cases.h), tokens and logprobs must be identical (the emulation's log is the host's;
// on a GPU the logprob may differ by 1 ulp, sampling_gpu_test.cpp). So CI checks, without a GPU,
// that the kernel's algorithm draws the host's tokens: the selection, the sorts (in shared memory
// and, above 4096 keys, in global memory), the widening top-p thresholds, the tie order and the
// bad rows. What it cannot check is CUDA itself (the real warp primitives, memory model, launch
// configuration and device libm): sampling_gpu_test.cpp on a GPU does.
//
// The block has 64 threads here (2 warps) to keep the emulation quick; the device runs 512. No
// result depends on the thread count: the reductions are of integers, and every floating-point
// sum has a fixed order (per lane, then a fixed tree, then one thread in id order).
#include <gtest/gtest.h>

#include <ucontext.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine/sample_rows_cases.h"

// ---- The CUDA built-ins sampling_row.h uses, for the threads of one emulated block ------------
//
// The block's threads are fibers (ucontext) on one OS thread: __syncthreads switches back to the
// scheduler, which runs every fiber up to its next barrier in turn. Each round it checks that
// every thread stopped at the same __syncthreads (its source line) or that all finished: a
// barrier some threads skip, which on a GPU hangs or corrupts, fails the test instead.

namespace ltm_emu {
struct Dim3 {
  unsigned x = 0;
};
inline Dim3 thread_idx;
struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
  void* barrier_site = nullptr;
};
inline ucontext_t scheduler;
inline std::vector<Fiber>* fibers = nullptr;
inline std::vector<int64_t> slots;  // one per thread: what a shuffle or ballot exchanges
inline std::function<void()> body;   // what every thread runs
inline bool diverged = false;

inline void trampoline() {
  body();
  (*fibers)[thread_idx.x].done = true;
}  // returns to uc_link: the scheduler

// Runs `f` on `threads` fibers as one block; false when the threads' barriers diverged.
inline bool run_block(int threads, std::function<void()> f) {
  std::vector<Fiber> fs(threads);
  fibers = &fs;
  body = std::move(f);
  slots.assign(threads, 0);
  diverged = false;
  for (Fiber& fb : fs) {
    fb.stack.resize(256 * 1024);
    getcontext(&fb.context);
    fb.context.uc_stack.ss_sp = fb.stack.data();
    fb.context.uc_stack.ss_size = fb.stack.size();
    fb.context.uc_link = &scheduler;
    makecontext(&fb.context, trampoline, 0);
  }
  for (;;) {
    int done = 0;
    void* site = nullptr;
    for (int t = 0; t < threads; ++t) {
      Fiber& fb = fs[t];
      if (!fb.done) {
        thread_idx.x = static_cast<unsigned>(t);
        swapcontext(&scheduler, &fb.context);
      }
      if (fb.done) {
        ++done;
      } else {
        if (site != nullptr && fb.barrier_site != site) diverged = true;
        site = fb.barrier_site;
      }
    }
    if (done == threads) break;
    if (done > 0 || diverged) {  // some threads finished or wait elsewhere: a GPU would hang
      diverged = true;
      break;  // the waiting fibers are abandoned (their stacks freed with fs)
    }
  }
  fibers = nullptr;
  return !diverged;
}
}  // namespace ltm_emu

#define threadIdx (::ltm_emu::thread_idx)
namespace ltm_emu {
// A barrier at source line `site` (of sampling_row.h, or of the shuffles below).
inline void sync_at(intptr_t site) {
  Fiber& me = (*fibers)[thread_idx.x];
  me.barrier_site = reinterpret_cast<void*>(site);
  swapcontext(&me.context, &scheduler);
}
}  // namespace ltm_emu
#define __syncthreads() ::ltm_emu::sync_at(__LINE__)
inline int32_t __shfl_xor_sync(unsigned, int32_t x, int lane_mask) {
  const unsigned me = threadIdx.x;
  ltm_emu::slots[me] = x;
  __syncthreads();
  const int32_t y = static_cast<int32_t>(ltm_emu::slots[me ^ lane_mask]);
  __syncthreads();
  return y;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  const unsigned me = threadIdx.x;
  ltm_emu::slots[me] = pred ? 1 : 0;
  __syncthreads();
  unsigned bits = 0;
  const unsigned warp = me / 32 * 32;
  for (unsigned l = 0; l < 32; ++l)
    bits |= static_cast<unsigned>(ltm_emu::slots[warp + l]) << l;
  __syncthreads();
  return bits;
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline int32_t atomicAdd(int32_t* p, int32_t v) {
  const int32_t old = *p;  // fibers on one OS thread: nothing runs in between
  *p = old + v;
  return old;
}
inline int32_t __float_as_int(float f) { return std::bit_cast<int32_t>(f); }
inline float __int_as_float(int32_t i) { return std::bit_cast<float>(i); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int32_t min(int32_t a, int32_t b) { return a < b ? a : b; }
inline int32_t max(int32_t a, int32_t b) { return a > b ? a : b; }

#define LTM_SAMPLING_THREADS 64
#include "kernels/cuda/sampling_row.h"

namespace ltm {
namespace {

using testing::SampleBatch;

// sample_rows' kernel on the CPU: every row by one emulated block, one after the other.
void emulated_sample_rows(const SampleRowsArgs& a) {
  using namespace kernels::cuda;
  const int32_t n = static_cast<int32_t>(a.vocab);
  int32_t pow2 = 1;
  while (pow2 < n) pow2 <<= 1;
  const int32_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<float> v(n);
  std::vector<int32_t> keys(pow2);
  std::vector<double> lanes(static_cast<size_t>(blocks) * kLanes), sums(blocks);
  const RowWorkspace ws{v.data(), keys.data(), lanes.data(), sums.data()};
  auto sh = std::make_unique<Shared>();
  for (int32_t r = 0; r < a.rows; ++r)
    ASSERT_TRUE(ltm_emu::run_block(kThreads, [&] { sample_row(a, r, ws, *sh); }))
        << "row " << r << ": the threads of the block reached different barriers";
}

void check(const SampleBatch& b, const char* what) {
  std::vector<int32_t> want_tokens;
  std::vector<float> want_lp;
  testing::reference_samples(b, &want_tokens, &want_lp);
  std::vector<int32_t> tokens(b.rows(), -99);
  std::vector<float> logprobs(b.rows(), 7.0f);
  emulated_sample_rows(b.host_args(tokens.data(), logprobs.data()));
  for (int32_t r = 0; r < b.rows(); ++r) {
    const SampleRowParams& p = b.params[r];
    EXPECT_EQ(tokens[r], want_tokens[r])
        << what << ", row " << r << " (temperature " << p.temperature << ", top_k " << p.top_k
        << ", top_p " << p.top_p << ", penalty " << p.repetition_penalty << ")";
    EXPECT_TRUE(testing::same_float(logprobs[r], want_lp[r]))
        << what << ", row " << r << ": " << logprobs[r] << " vs host " << want_lp[r];
  }
}

TEST(SamplingEmulated, TheKernelsAlgorithmDrawsTheHostSamplersTokens) {
  check(testing::make_sample_batch(97, 97, 11), "vocab 97");
  check(testing::make_sample_batch(1001, 1024, 12), "vocab 1001");
}

TEST(SamplingEmulated, SortsAboveTheSharedMemoryTileToo) {
  // Above 4096 kept keys the sort runs in global memory (the near-uniform top-p rows).
  check(testing::make_sample_batch(5003, 5003, 13), "vocab 5003");
}

// ---- The candidates of a vocab-sharded row (tp > 1): sampling_row.h's local_candidates ------

// select_candidates' kernel on the CPU: every row by one emulated block.
void emulated_select_candidates(const CandidateRowsArgs& a) {
  using namespace kernels::cuda;
  const int32_t n = static_cast<int32_t>(std::max<int64_t>(a.valid, 1));
  int32_t pow2 = 1;
  while (pow2 < n) pow2 <<= 1;
  const int32_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<float> v(n);
  std::vector<int32_t> keys(pow2);
  std::vector<double> lanes(static_cast<size_t>(blocks) * kLanes), sums(blocks);
  const RowWorkspace ws{v.data(), keys.data(), lanes.data(), sums.data()};
  auto sh = std::make_unique<Shared>();
  for (int32_t r = 0; r < a.rows; ++r)
    ASSERT_TRUE(ltm_emu::run_block(kThreads, [&] { local_candidates(a, r, ws, *sh); }))
        << "row " << r << ": the threads of the block reached different barriers";
}

bool canonical(const Candidate& x, const Candidate& y) {
  return x.logit > y.logit || (x.logit == y.logit && x.id < y.id);
}

// Each slice of a tp-way split of the batch's rows: the kernel's candidates are the host's
// (select_candidates_host, local_candidates row by row) as sets, with the same max (or bad-slice
// mark) and the same normalizer bit for bit.
void check_candidates(const SampleBatch& b, int tp, const char* what) {
  const int64_t per = (b.vocab + tp - 1) / tp;
  for (int rank = 0; rank < tp; ++rank) {
    const int64_t begin = std::min<int64_t>(rank * per, b.vocab);
    const int64_t valid = std::min<int64_t>(per, b.vocab - begin);
    CandidateRowsArgs a;
    a.rows = b.rows();
    a.valid = valid;
    a.stride = b.stride;
    a.id_begin = static_cast<int32_t>(begin);
    a.logits = b.logits.data() + begin;
    a.params = b.params.data();
    a.history = b.history.empty() ? nullptr : b.history.data();
    const size_t bytes = static_cast<size_t>(candidate_rows_bytes(a.params, a.rows, valid));
    std::vector<unsigned char> want(bytes, 0xAB), got(bytes, 0xCD);
    a.out = want.data();
    select_candidates_host(a, 1);
    a.out = got.data();
    emulated_select_candidates(a);
    for (int32_t r = 0; r < a.rows; ++r) {
      CandidateSet w, g;
      read_candidate_row(want.data(), a.params, a.rows, valid, a.id_begin, r, &w);
      read_candidate_row(got.data(), a.params, a.rows, valid, a.id_begin, r, &g);
      const std::string where = std::string(what) + ", tp " + std::to_string(tp) + " rank " +
                                std::to_string(rank) + ", row " + std::to_string(r);
      EXPECT_TRUE(w.local_max == g.local_max ||
                  (std::isnan(w.local_max) && std::isnan(g.local_max)))
          << where << ": max " << g.local_max << " vs host " << w.local_max;
      EXPECT_EQ(std::bit_cast<uint64_t>(g.local_sum_exp), std::bit_cast<uint64_t>(w.local_sum_exp))
          << where << ": normalizer " << g.local_sum_exp << " vs host " << w.local_sum_exp;
      std::sort(w.candidates.begin(), w.candidates.end(), canonical);
      std::sort(g.candidates.begin(), g.candidates.end(), canonical);
      ASSERT_EQ(g.candidates.size(), w.candidates.size()) << where;
      for (size_t i = 0; i < w.candidates.size(); ++i) {
        EXPECT_EQ(g.candidates[i].id, w.candidates[i].id) << where << ", candidate " << i;
        EXPECT_TRUE(testing::same_float(g.candidates[i].logit, w.candidates[i].logit))
            << where << ", candidate " << i;
      }
    }
  }
}

TEST(SamplingEmulated, TheCandidateKernelSelectsTheHostsCandidates) {
  const SampleBatch b = testing::make_sample_batch(1001, 1024, 21);
  for (int tp : {2, 3}) check_candidates(b, tp, "vocab 1001");
  const SampleBatch small = testing::make_sample_batch(97, 97, 22);
  for (int tp : {2, 3, 5}) check_candidates(small, tp, "vocab 97");
}

}  // namespace
}  // namespace ltm
