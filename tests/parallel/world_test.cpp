// WorldLayout arithmetic, and MpiWorld in a process started without mpirun (a singleton world of
// one), which is how a one-rank ltm-worker and the unit tests run.
#include "parallel/world.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace ltm::parallel {
namespace {

TEST(WorldLayout, RankArithmeticRoundTrips) {
  for (int tp = 1; tp <= 8; ++tp) {
    for (int pp = 1; pp <= 8; ++pp) {
      for (int rank = 0; rank < tp * pp; ++rank) {
        const WorldLayout w{tp * pp, tp, pp, rank};
        ASSERT_EQ(w.tp_rank(), rank % tp);
        ASSERT_EQ(w.pp_rank(), rank / tp);
        ASSERT_EQ(w.rank_of(w.pp_rank(), w.tp_rank()), rank);
        ASSERT_EQ(w.is_first_stage(), rank < tp);
        ASSERT_EQ(w.is_last_stage(), rank >= (pp - 1) * tp);
        if (!w.is_first_stage()) {
          ASSERT_EQ(w.prev_stage_rank(), rank - tp);
        }
        if (!w.is_last_stage()) {
          ASSERT_EQ(w.next_stage_rank(), rank + tp);
        }
      }
    }
  }
}

TEST(WorldLayout, TpGroupsAreContiguous) {
  const WorldLayout w{8, 4, 2, 5};  // stage 1, tp_rank 1: TP group {4..7}, PP group {1, 5}
  EXPECT_EQ(w.pp_rank(), 1);
  EXPECT_EQ(w.tp_rank(), 1);
  EXPECT_EQ(w.rank_of(1, 0), 4);
  EXPECT_EQ(w.rank_of(1, 3), 7);
  EXPECT_EQ(w.rank_of(0, 1), 1);
  EXPECT_TRUE(w.is_last_stage());
  EXPECT_FALSE(w.is_first_stage());
}

// One MpiWorld per process (MPI can be initialized once), so a single test covers its life.
TEST(MpiWorld, SingletonWithoutMpirun) {
  int argc = 1;
  char arg0[] = "world_test";
  char* args[] = {arg0, nullptr};
  char** argv = args;
  {
    MpiWorld world(&argc, &argv);
    EXPECT_EQ(world.size(), 1);
    EXPECT_EQ(world.rank(), 0);
    EXPECT_FALSE(world.host().empty());
    EXPECT_GE(world.thread_level(), MPI_THREAD_SERIALIZED);
    EXPECT_EQ(world.world().name(), "world");
    EXPECT_EQ(world.world().size(), 1);

    auto refused = world.create_groups(2, 1);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().message(), "mpirun started 1 rank but --tp 2 x --pp 1 needs 2");
    EXPECT_FALSE(world.has_groups());

    auto layout = world.create_groups(1, 1);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->tp_rank(), 0);
    EXPECT_TRUE(layout->is_first_stage());
    EXPECT_TRUE(layout->is_last_stage());
    EXPECT_EQ(world.tp().name(), "tp");
    EXPECT_EQ(world.pp().name(), "pp");
    world.set_collective_timeout(7);
    EXPECT_EQ(world.world().timeout_s(), 7);
    EXPECT_EQ(world.tp().timeout_s(), 7);
    EXPECT_EQ(world.pp().timeout_s(), 7);

    // Groups of one: collectives complete at once and leave the data as it is.
    std::vector<float> x = {1.5f, -2.0f, 3.0f};
    world.tp().all_reduce_sum(x.data(), x.size());
    EXPECT_THAT(x, ::testing::ElementsAre(1.5f, -2.0f, 3.0f));
    std::vector<float> gathered(3, 0.0f);
    world.pp().all_gather(x.data(), gathered.data(), x.size() * sizeof(float));
    EXPECT_EQ(gathered, x);
    world.world().broadcast(x.data(), x.size() * sizeof(float), 0);
    world.world().barrier();
    EXPECT_THAT(x, ::testing::ElementsAre(1.5f, -2.0f, 3.0f));
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  EXPECT_TRUE(finalized);
}

}  // namespace
}  // namespace ltm::parallel
