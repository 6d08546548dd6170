// steal_for(n, threads, fn): fn(i) for every i in [0, n) exactly once, over an OpenMP region of
// `threads` threads. Each thread starts on the contiguous range schedule(static) would give it and
// runs it front to back; a thread whose range is done takes items one at a time from the back of
// the range with the most left, until none is left. Inside a small step's team (step_team.h) the
// team's threads do the same without opening a region.
//
// Why: the GEMMs' items (a panel of 64 columns for a block of rows) cost the same, but the threads
// do not run at the same speed. On the 2-core Zen 4 VM of docs/benchmarks.md (forced AVX2,
// GPT-2-124M, 2026-12-06), timed per thread by a temporary patch, one thread of a batch-32 GEMM
// region finished its half 5-29% after the other (presumably the host taking a vCPU now and then)
// while the other spun at the barrier; schedule(dynamic) loses the order in which a panel's last
// chunk prefetches the next panel (panel_loops.inc), and the batch-32 step ran 3-28% slower with
// it. Here the owner keeps its order and only its range's end moves: batch-32 decode 1.054x and
// 32 x 32 prefill 1.193x the static split (medians of 8 alternating rounds); on the step team,
// a batch of 4 GPT-2-124M sequences 1.117x, 6 of models/kjv-small 1.021x (8 rounds each).
//
// fn(i), or fn(i, next) where next is the item this thread will probably run after i (the next of
// its own range; -1 while taking others'), for a kernel that prefetches its next item's data.
//
// Which thread runs an item does not change its result: fn(i) must depend on i alone (each GEMM
// item writes its own block of C with the same code), so the bits are those of the static split.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/step_team.h"

namespace ltm::kernels::cpu {

inline constexpr int kMaxStealThreads = 64;

namespace steal_detail {

// A range [lo, hi) in one word, so that the owner's lo + 1 and a thief's hi - 1 cannot both take
// the last item.
struct alignas(64) Range {
  std::atomic<uint64_t> bounds{0};
};

inline uint64_t pack(uint64_t lo, uint64_t hi) { return (lo << 32) | hi; }

struct Bounds {
  int64_t lo, hi;
};
inline Bounds unpack(uint64_t s) {
  return {static_cast<int64_t>(s >> 32), static_cast<int64_t>(s & 0xffffffffu)};
}

// The first item of r (its owner: back false) or its last (a thief), or -1 where r is empty.
inline int64_t take(Range& r, bool back) {
  uint64_t s = r.bounds.load(std::memory_order_relaxed);
  for (;;) {
    const auto [lo, hi] = unpack(s);
    if (lo >= hi) return -1;
    const uint64_t rest = back ? pack(lo, hi - 1) : pack(lo + 1, hi);
    if (r.bounds.compare_exchange_weak(s, rest, std::memory_order_relaxed))
      return back ? hi - 1 : lo;
  }
}

// The item the owner of r would take next, or -1.
inline int64_t front(const Range& r) {
  const auto [lo, hi] = unpack(r.bounds.load(std::memory_order_relaxed));
  return lo < hi ? lo : -1;
}

// Items r has left.
inline int64_t left(const Range& r) {
  const auto [lo, hi] = unpack(r.bounds.load(std::memory_order_relaxed));
  return hi - lo;
}

template <typename Fn>
inline void call(Fn& fn, int64_t i, int64_t next) {
  if constexpr (std::is_invocable_v<Fn&, int64_t, int64_t>) {
    fn(i, next);
  } else {
    fn(i);
  }
}

// Thread t of `threads`: its own range front to back, then the others' from the back.
template <typename Fn>
void run(Range* ranges, int threads, int t, Fn& fn) {
  for (int64_t i; (i = take(ranges[t], false)) >= 0;) call(fn, i, front(ranges[t]));
  for (;;) {
    int victim = -1;
    int64_t most = 0;
    for (int v = 0; v < threads; ++v) {
      const int64_t l = left(ranges[v]);
      if (l > most) most = l, victim = v;
    }
    if (victim < 0) return;
    const int64_t i = take(ranges[victim], true);
    if (i >= 0) call(fn, i, -1);
  }
}

inline void split(Range* ranges, int threads, int64_t n) {
  for (int t = 0; t < threads; ++t)
    ranges[t].bounds.store(pack(static_cast<uint64_t>(n * t / threads),
                                static_cast<uint64_t>(n * (t + 1) / threads)),
                           std::memory_order_relaxed);
}

}  // namespace steal_detail

// See above. Inside a small step's team (step_team.h) the team's threads run it, without a
// region, whatever `threads` says. More than kMaxStealThreads threads, or n past 32 bits:
// schedule(static).
template <typename Fn>
void steal_for(int64_t n, int threads, Fn&& fn) {
  using steal_detail::Range;
  if (in_step_team()) {
    const int nt = step_team_size();
    if (nt > 1 && nt <= kMaxStealThreads && n > 1 && n < (int64_t{1} << 31)) {
      Range ranges[kMaxStealThreads];
      steal_detail::split(ranges, nt, n);
      auto job = [&](int t, int) { steal_detail::run(ranges, nt, t, fn); };
      step_team_run(job);
      return;
    }
    threads = 1;
  }
  threads = std::max(1, threads);
  if (threads > kMaxStealThreads || n >= (int64_t{1} << 31)) {
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
      for (int64_t i = lo; i < hi; ++i) steal_detail::call(fn, i, i + 1 < hi ? i + 1 : -1);
    }
    return;
  }
  if (threads == 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) steal_detail::call(fn, i, i + 1 < n ? i + 1 : -1);
    return;
  }
  Range ranges[kMaxStealThreads];
  steal_detail::split(ranges, threads, n);
  // The region may get fewer threads than asked (a nested or limited team): the ranges nobody
  // owns are taken by the others from the back.
#pragma omp parallel num_threads(threads)
  steal_detail::run(ranges, threads, omp_get_thread_num(), fn);
}

}  // namespace ltm::kernels::cpu
