// The NCCL id bootstrap (parallel/unique_id.h) over MPI, without NCCL: on 4 ranks as tp 2 x pp 2,
// each group's first rank (and only it) runs the injected id maker, and every member of the group
// ends with that rank's bytes, which differ between groups.
// Run: mpirun -n 4 --oversubscribe unique_id_mpi_test
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "parallel/unique_id.h"
#include "parallel/world.h"

namespace ltm::parallel {
namespace {

MpiWorld* g_world = nullptr;
WorldLayout g_layout;

class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_world = new MpiWorld(nullptr, nullptr);
    g_world->set_collective_timeout(60);
    auto layout = g_world->create_groups(2, 2);
    ASSERT_TRUE(layout.ok()) << layout.status() << " (run with mpirun -n 4)";
    g_layout = *layout;
  }
  void TearDown() override {
    delete g_world;
    g_world = nullptr;
  }
};
::testing::Environment* const kMpiEnvironment =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

// As large as an ncclUniqueId (128 bytes); the maker writes who made it and a group tag.
using Id = std::array<unsigned char, 128>;

void check_group(MpiCommunicator& comm, int tag) {
  int made = 0;
  Id id{};
  share_unique_id(comm, id.data(), id.size(), [&](void* out) {
    ++made;
    Id mine{};
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] = static_cast<unsigned char>(g_world->rank() * 31 + tag * 7 + i);
    std::memcpy(out, mine.data(), mine.size());
  });
  EXPECT_EQ(made, comm.rank() == 0 ? 1 : 0) << comm.name() << " rank " << comm.rank();
  // Every member holds the same bytes...
  std::vector<Id> all(comm.size());
  comm.all_gather(id.data(), all.data(), sizeof(Id));
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[r], all[0]) << comm.name() << " rank " << r;
  // ... made by the group's first rank (in world numbering: tp groups start at pp_rank * tp, the
  // pp group of tp_rank t starts at t).
  const int first = comm.name() == "tp" ? g_layout.rank_of(g_layout.pp_rank(), 0)
                                        : g_layout.rank_of(0, g_layout.tp_rank());
  EXPECT_EQ(id[0], static_cast<unsigned char>(first * 31 + tag * 7)) << comm.name();
  // ... and the other group of this kind made a different id.
  std::vector<Id> world(g_world->size());
  g_world->world().all_gather(id.data(), world.data(), sizeof(Id));
  const int other = comm.name() == "tp" ? (g_world->rank() + 2) % 4 : g_world->rank() ^ 1;
  EXPECT_NE(world[other], id) << comm.name();
}

TEST(UniqueId, EachGroupsFirstRankMakesItAndEveryMemberGetsIt) {
  check_group(g_world->tp(), 1);
  check_group(g_world->pp(), 2);
}

}  // namespace
}  // namespace ltm::parallel
