// steal_for (kernels/cpu/steal_for.h), the GEMMs' split of their items over the threads: every
// item runs exactly once whatever the counts; a thread's own range runs front to back; a stalled
// thread's items are taken by the others from the back of its range; a team smaller than asked
// (a call inside another region) still runs every item; on a small step's team, its threads.
#include "kernels/cpu/steal_for.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/step_team.h"

namespace ltm {
namespace {

namespace kc = kernels::cpu;

TEST(StealFor, EveryItemRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7}) {
    for (int64_t n : {0, 1, 2, 5, 64, 1000, 4099}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      kc::steal_for(n, threads, [&](int64_t i) {
        ASSERT_GE(i, 0);
        ASSERT_LT(i, n);
        runs[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1)
            << "item " << i << " of " << n << ", " << threads << " threads";
    }
  }
}

// Thread 0 stalls on its first item; thread 1 runs its own half, then the rest of thread 0's from
// the back, so thread 0 finds nothing left when it wakes.
TEST(StealFor, AStalledThreadsItemsAreTakenFromTheBack) {
  constexpr int64_t kItems = 64;
  std::mutex mu;
  std::vector<std::vector<int64_t>> by_thread(2);
  kc::steal_for(kItems, 2, [&](int64_t i) {
    // 1 ms an item, so that thread 0 is surely at its first item before thread 1 is done.
    std::this_thread::sleep_for(std::chrono::milliseconds(i == 0 ? 300 : 1));
    std::lock_guard<std::mutex> lock(mu);
    by_thread[static_cast<size_t>(omp_get_thread_num())].push_back(i);
  });
  if (by_thread[1].empty()) GTEST_SKIP() << "the region ran on one thread";
  ASSERT_EQ(by_thread[0].size() + by_thread[1].size(), static_cast<size_t>(kItems));
  EXPECT_EQ(by_thread[0], std::vector<int64_t>{0}) << "thread 0 kept items it stalled before";
  ASSERT_EQ(by_thread[1].size(), static_cast<size_t>(kItems - 1));
  for (int64_t j = 0; j < kItems / 2; ++j)  // its own range in order
    EXPECT_EQ(by_thread[1][static_cast<size_t>(j)], kItems / 2 + j);
  for (int64_t j = 0; j + 1 < kItems / 2; ++j)  // then thread 0's, from the back
    EXPECT_EQ(by_thread[1][static_cast<size_t>(kItems / 2 + j)], kItems / 2 - 1 - j);
}

TEST(StealFor, OwnRangesRunFrontToBack) {
  constexpr int64_t kItems = 1000;
  std::vector<std::vector<int64_t>> by_thread(3);
  std::mutex mu;
  kc::steal_for(kItems, 3, [&](int64_t i) {
    std::lock_guard<std::mutex> lock(mu);
    by_thread[static_cast<size_t>(omp_get_thread_num())].push_back(i);
  });
  for (int t = 0; t < 3; ++t) {
    const int64_t lo = kItems * t / 3, hi = kItems * (t + 1) / 3;
    int64_t last = -1;
    for (int64_t i : by_thread[static_cast<size_t>(t)]) {
      if (i < lo || i >= hi) continue;  // taken from another thread's range
      EXPECT_GT(i, last) << "thread " << t;
      last = i;
    }
  }
}

// The hint a kernel prefetches by: the item after i in the thread's own range while it has one
// (the one it then runs, unless a thief took it first), -1 for the items it took from others.
TEST(StealFor, TheNextHintIsTheOwnRangesNextItem) {
  for (int threads : {1, 2, 3}) {
    constexpr int64_t kItems = 301;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> by_thread(static_cast<size_t>(threads));
    std::mutex mu;
    kc::steal_for(kItems, threads, [&](int64_t i, int64_t next) {
      std::lock_guard<std::mutex> lock(mu);
      by_thread[static_cast<size_t>(omp_get_thread_num())].emplace_back(i, next);
    });
    int64_t total = 0;
    for (int t = 0; t < threads; ++t) {
      const auto& seq = by_thread[static_cast<size_t>(t)];
      total += static_cast<int64_t>(seq.size());
      const int64_t lo = kItems * t / threads, hi = kItems * (t + 1) / threads;
      for (size_t j = 0; j < seq.size(); ++j) {
        const auto [i, next] = seq[j];
        if (i < lo || i >= hi) {
          EXPECT_EQ(next, -1) << "a stolen item " << i << " hinted " << next;
          continue;
        }
        if (next < 0) continue;  // its range's last, or the rest taken
        EXPECT_EQ(next, i + 1) << "thread " << t;
        if (j + 1 < seq.size() && seq[j + 1].first >= lo && seq[j + 1].first < hi)
          EXPECT_EQ(seq[j + 1].first, next) << "thread " << t;
      }
    }
    EXPECT_EQ(total, kItems);
  }
}

// Inside a small step's team (step_team.h) the team's threads share the items, without a region
// of their own, and a stalled thread's items are taken by the other.
TEST(StealFor, OnAStepTeamTheTeamSharesTheItems) {
  constexpr int64_t kItems = 64;
  std::vector<std::atomic<int>> runs(kItems);
  std::mutex mu;
  std::vector<int64_t> on_caller, on_other;
  bool team = false;
  const std::thread::id caller = std::this_thread::get_id();
  kc::run_step_team(2, [&] {
    team = kc::in_step_team();
    kc::steal_for(kItems, 7, [&](int64_t i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(i == 0 ? 300 : 1));
      runs[static_cast<size_t>(i)].fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      (std::this_thread::get_id() == caller ? on_caller : on_other).push_back(i);
    });
  });
  if (!team) GTEST_SKIP() << "no team (one thread)";
  for (int64_t i = 0; i < kItems; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << i;
  EXPECT_EQ(on_caller, std::vector<int64_t>{0}) << "the stalled caller's items were not taken";
  EXPECT_EQ(on_other.size(), static_cast<size_t>(kItems - 1));
}

// Inside another parallel region (nesting off) the team has one thread: it runs its own range
// and then takes every other one.
TEST(StealFor, ATeamSmallerThanAskedRunsEverything) {
  const int saved = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  constexpr int64_t kItems = 257;
  std::vector<std::atomic<int>> runs(kItems);
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    kc::steal_for(kItems, 4, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
  }
  omp_set_max_active_levels(saved);
  for (int64_t i = 0; i < kItems; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << i;
}

}  // namespace
}  // namespace ltm
