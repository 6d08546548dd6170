// plan_descriptors and raise_descriptor_limit (runtime/serve/descriptor_budget.h).
#include "runtime/serve/descriptor_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

namespace ltm {
namespace {

using ::testing::HasSubstr;

DescriptorLimit limit(int64_t soft, int64_t hard, int64_t before = 1024) {
  return DescriptorLimit{before, soft, hard};
}

TEST(DescriptorBudget, AutomaticCapIs1024WhenTheLimitIsLarge) {
  absl::StatusOr<DescriptorPlan> p = plan_descriptors(limit(1 << 20, 1 << 20), 4, 0, true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->reserved, kReservedDescriptors + 4 * kDescriptorsPerRank);
  EXPECT_EQ(p->http_max_connections, 1024);
  EXPECT_EQ(p->grpc_share, (1 << 20) - p->reserved - 1024);
  EXPECT_THAT(p->summary, HasSubstr("descriptors: limit 1048576 (raised from 1024), 272 kept for "
                                    "checkpoint, adapter and MPI files; HTTP connections up to 1024;"));
}

TEST(DescriptorBudget, AutomaticCapIsClampedToHalfWhatIsLeft) {
  // 1024 - 260 = 764 left: HTTP gets 382, gRPC the other 382.
  absl::StatusOr<DescriptorPlan> p = plan_descriptors(limit(1024, 1024, 1024), 1, 0, true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->http_max_connections, 382);
  EXPECT_EQ(p->grpc_share, 382);
  EXPECT_THAT(p->summary, HasSubstr("HTTP connections up to 382 (not 1024: the limit is too low)"));
  EXPECT_THAT(p->summary, ::testing::Not(HasSubstr("raised")));
}

TEST(DescriptorBudget, AnExplicitCapThatDoesNotFitIsRefusedNamingTheFlag) {
  absl::StatusOr<DescriptorPlan> p = plan_descriptors(limit(1024, 1024), 1, 500, true);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);  // exit 2
  EXPECT_THAT(p.status().message(),
              HasSubstr("--http-max-connections 500 does not fit the descriptor limit 1024"));
  EXPECT_THAT(p.status().message(), HasSubstr("give at most 382"));
  absl::StatusOr<DescriptorPlan> fits = plan_descriptors(limit(1024, 1024), 1, 382, true);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->http_max_connections, 382);
}

TEST(DescriptorBudget, ALimitThatLeavesTooLittleIsRefused) {
  absl::StatusOr<DescriptorPlan> p = plan_descriptors(limit(280, 280), 2, 0, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);  // exit 1
  EXPECT_THAT(p.status().message(), HasSubstr("the descriptor limit (RLIMIT_NOFILE) is 280"));
  EXPECT_THAT(p.status().message(), HasSubstr("now 280"));
}

TEST(DescriptorBudget, WithoutHttpEverythingLeftIsGrpcs) {
  absl::StatusOr<DescriptorPlan> p = plan_descriptors(limit(4096, 4096), 1, 0, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->http_max_connections, 0);
  EXPECT_EQ(p->grpc_share, 4096 - 260);
  EXPECT_THAT(p->summary, ::testing::Not(HasSubstr("HTTP")));
}

TEST(DescriptorBudget, RaiseSetsTheSoftLimitToTheHardOne) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max < 512) GTEST_SKIP() << "hard limit " << saved.rlim_max;
  rlimit low = saved;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const DescriptorLimit got = raise_descriptor_limit();
  EXPECT_EQ(got.soft_before, 256);
  EXPECT_GT(got.soft, 256);
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(static_cast<int64_t>(now.rlim_cur), got.soft);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace ltm
