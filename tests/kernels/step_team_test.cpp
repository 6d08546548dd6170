// The small-step team (kernels/cpu/step_team.h): its jobs run once on every thread, across
// the waits in which either side sleeps; a step's exception reaches the caller and the team is
// released; nested steps and steps without threads run inline; static_for's split reaches both
// threads. And the kernels that hand their work to the team (the decode gemvs and the GEMMs of
// up to Backend::kSmallStepRows rows of every weight type, paged attention) give the same bits
// as in their own OpenMP regions.
#include "kernels/cpu/step_team.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/static_for.h"
#include "runtime/backend/backend.h"

namespace ltm {
namespace {

namespace kc = kernels::cpu;

TEST(StepTeam, EveryJobRunsOnceOnEveryThread) {
  constexpr int kJobs = 2000;
  std::vector<std::atomic<int>> calls(2 * kJobs);
  int team_size = 0;
  bool inside = false;
  kc::run_step_team(2, [&] {
    inside = kc::in_step_team();
    team_size = kc::step_team_size();
    for (int j = 0; j < kJobs; ++j) {
      auto job = [&](int t, int nt) {
        ASSERT_EQ(nt, 2);
        calls[2 * j + t].fetch_add(1);
      };
      kc::step_team_run(job);
      // Everything the other thread did in the job is visible once step_team_run returns.
      ASSERT_EQ(calls[2 * j].load(), 1);
      ASSERT_EQ(calls[2 * j + 1].load(), 1) << "job " << j;
    }
  });
  EXPECT_TRUE(inside);
  EXPECT_EQ(team_size, 2);
  EXPECT_FALSE(kc::in_step_team());
  EXPECT_EQ(kc::step_team_size(), 1);
}

TEST(StepTeam, JobsAfterEitherSideSleeps) {
  // Gaps and jobs longer than the spin (50 us): the waiting side sleeps and is woken.
  std::atomic<int> sum{0};
  kc::run_step_team(2, [&] {
    for (int j = 0; j < 20; ++j) {
      if (j % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));  // worker sleeps
      auto job = [&](int t, int) {
        if (t == 1 && j % 3 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(300));  // thread 0 sleeps
        sum.fetch_add(1);
      };
      kc::step_team_run(job);
      ASSERT_EQ(sum.load(), 2 * (j + 1));
    }
  });
}

TEST(StepTeam, AStepsExceptionReachesTheCallerAndReleasesTheTeam) {
  EXPECT_THROW(kc::run_step_team(2,
                                 [&] {
                                   auto job = [](int, int) {};
                                   kc::step_team_run(job);
                                   throw std::runtime_error("bad step");
                                 }),
               std::runtime_error);
  EXPECT_FALSE(kc::in_step_team());
  std::atomic<int> n{0};
  kc::run_step_team(2, [&] {
    auto job = [&](int, int) { n.fetch_add(1); };
    kc::step_team_run(job);
  });
  EXPECT_EQ(n.load(), 2);
}

TEST(StepTeam, NestedOrSingleThreadStepsRunInline) {
  int size_one = 0, size_nested = 0;
  kc::run_step_team(1, [&] { size_one = kc::step_team_size(); });
  EXPECT_EQ(size_one, 1);
  kc::run_step_team(2, [&] {
    kc::run_step_team(2, [&] { size_nested = kc::step_team_size(); });  // the outer team's
  });
  EXPECT_EQ(size_nested, 2);
#pragma omp parallel num_threads(2)
  {
    int s = -1;
    kc::run_step_team(2, [&] { s = kc::step_team_size(); });  // inside a region: inline
#pragma omp critical
    EXPECT_EQ(s, 1);
  }
}

TEST(StepTeam, StaticSplitsCoverEveryIndexOnBothThreads) {
  for (int64_t n : {1, 2, 7, 64}) {
    std::vector<std::atomic<int>> calls(n);
    std::vector<int> thread_of(n, -1);
    kc::run_step_team(2, [&] {
      kc::static_for(n, true, [&](int64_t i) {
        calls[i].fetch_add(1);
        thread_of[i] = omp_get_thread_num();
      });
    });
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(calls[i].load(), 1) << i << " of " << n;
      EXPECT_EQ(thread_of[i], i < n / 2 ? 0 : 1)
          << i << " of " << n << ": thread t takes [n t / 2, n (t + 1) / 2)";
    }
  }
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

class StepTeamGemv : public ::testing::TestWithParam<Precision> {};

TEST_P(StepTeamGemv, SameBitsAsTheRegions) {
  auto backend = make_cpu_backend(2);
  // n: 11 panels and a ragged one (runs of 4, 2 and 1 panels); one row of A.
  const int64_t k = 320, n = 11 * 64 + 37;
  const std::vector<float> a = random_vector(k, 1), w = random_vector(k * n, 2);
  DeviceBuffer wb = backend->alloc_weight(k, n, GetParam());
  backend->write_weight_rows(wb, w.data(), 0, k, k, n);
  std::vector<float> regions(n), team(n, -1.0f);
  backend->matmul(a.data(), wb, regions.data(), 1, n, k, 0.0f);
  bool inside = false;
  backend->run_small_step([&] {
    inside = kc::in_step_team();
    backend->matmul(a.data(), wb, team.data(), 1, n, k, 0.0f);
  });
  EXPECT_TRUE(inside);
  EXPECT_EQ(std::memcmp(regions.data(), team.data(), sizeof(float) * n), 0);
}

TEST_P(StepTeamGemv, SmallStepGemmsSameBitsAsTheRegions) {
  // A verify step's or a few sequences' rows: the GEMM's (panel, rows) items on the team.
  auto backend = make_cpu_backend(2);
  const int64_t k = 320, n = 11 * 64 + 37;
  const std::vector<float> w = random_vector(k * n, 2);
  DeviceBuffer wb = backend->alloc_weight(k, n, GetParam());
  backend->write_weight_rows(wb, w.data(), 0, k, k, n);
  for (int64_t m = 2; m <= Backend::kSmallStepRows; ++m) {
    const std::vector<float> a = random_vector(m * k, 10 + m);
    std::vector<float> regions(m * n), team(m * n, -1.0f);
    backend->matmul(a.data(), wb, regions.data(), m, n, k, 0.0f);
    backend->run_small_step([&] { backend->matmul(a.data(), wb, team.data(), m, n, k, 0.0f); });
    EXPECT_EQ(std::memcmp(regions.data(), team.data(), sizeof(float) * m * n), 0) << m << " rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, StepTeamGemv,
                         ::testing::Values(Precision::kF32, Precision::kBF16, Precision::kF16,
                                           Precision::kInt8));

TEST(StepTeamAttention, SameBitsAsTheRegion) {
  // One new row of one sequence over 45 cached tokens: 12 heads of 64, blocks of 16.
  const int n_head = 12, hd = 64, bs = 16, ctx = 45, blocks = (ctx + bs - 1) / bs;
  const int64_t cols = int64_t{n_head} * hd, stride = 3 * cols;
  const std::vector<float> qkv = random_vector(stride, 3);
  const std::vector<float> k_cache = random_vector(int64_t{blocks} * n_head * bs * hd, 4);
  const std::vector<float> v_cache = random_vector(k_cache.size(), 5);
  const std::vector<int32_t> offsets{0, 1}, lens{ctx}, table{0, 1, 2};
  kc::PagedAttentionShape s{1, n_head, hd, bs, blocks, offsets.data(), lens.data(), table.data()};
  std::vector<float> regions(cols), team(cols, -1.0f);
  omp_set_num_threads(2);
  kc::paged_attention(s, qkv.data(), k_cache.data(), v_cache.data(), regions.data());
  bool inside = false;
  kc::run_step_team(2, [&] {
    inside = kc::in_step_team();
    kc::paged_attention(s, qkv.data(), k_cache.data(), v_cache.data(), team.data());
  });
  EXPECT_TRUE(inside);
  EXPECT_EQ(std::memcmp(regions.data(), team.data(), sizeof(float) * cols), 0);
}

}  // namespace
}  // namespace ltm
