// MpiCommunicator on 4 ranks as tp 2 x pp 2: every operation on the world, tp and pp groups,
// small and large buffers (> 1M floats), the chunked paths (pieces forced small), and
// post/flush/recv_wait (fire-and-forget sends that do not wait for the receiver, copy their data,
// keep their order and split into pieces; the idle wait outlasting the collective timeout).
// Run: mpirun -n 4 --oversubscribe mpi_communicator_mpi_test
//
// A failed check on one rank leaves the others waiting in the next collective; the watchdog
// (60 s here) then ends the run with a message instead of a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "parallel/world.h"

namespace ltm::parallel {
namespace {

constexpr double kTestTimeoutSeconds = 60;

MpiWorld* g_world = nullptr;
WorldLayout g_layout;

class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_world = new MpiWorld(nullptr, nullptr);
    g_world->set_collective_timeout(kTestTimeoutSeconds);
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

MpiCommunicator& group(const std::string& name) {
  if (name == "tp") return g_world->tp();
  if (name == "pp") return g_world->pp();
  return g_world->world();
}

// World ranks of every member of `comm`, in group rank order.
std::vector<int> members(MpiCommunicator& comm) {
  std::vector<int> out(comm.size());
  const int me = g_world->rank();
  comm.all_gather(&me, out.data(), sizeof(int));
  return out;
}

// Restores a communicator's chunk size even when a check fails half-way.
class ChunkGuard {
 public:
  ChunkGuard(MpiCommunicator& comm, size_t bytes) : comm_(comm), saved_(comm.max_chunk_bytes()) {
    comm_.set_max_chunk_bytes(bytes);
  }
  ~ChunkGuard() { comm_.set_max_chunk_bytes(saved_); }

 private:
  MpiCommunicator& comm_;
  size_t saved_;
};

TEST(MpiCommunicator, GroupsFollowTheLayout) {
  ASSERT_EQ(g_world->size(), 4);
  const int pp_rank = g_layout.pp_rank(), tp_rank = g_layout.tp_rank();
  EXPECT_EQ(g_world->tp().rank(), tp_rank);
  EXPECT_EQ(g_world->pp().rank(), pp_rank);
  EXPECT_THAT(members(g_world->world()), ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(members(g_world->tp()), ::testing::ElementsAre(pp_rank * 2, pp_rank * 2 + 1));
  EXPECT_THAT(members(g_world->pp()), ::testing::ElementsAre(tp_rank, tp_rank + 2));
}

// Values that sum exactly in float: small integers.
void check_exact_all_reduce(MpiCommunicator& comm, size_t count) {
  const std::vector<int> ranks = members(comm);
  std::vector<float> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((g_world->rank() + 1) * (i % 97));
  comm.all_reduce_sum(data.data(), count);
  int rank_sum = 0;
  for (int r : ranks) rank_sum += r + 1;
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (data[i] != static_cast<float>(rank_sum * (i % 97))) ++wrong;
  }
  EXPECT_EQ(wrong, 0u) << "group " << comm.name() << " count " << count;
}

TEST(MpiCommunicator, AllReduceSumOnEveryGroup) {
  for (const char* name : {"world", "tp", "pp"}) {
    for (size_t count : {size_t{1}, size_t{768}, size_t{3 * 768 + 1}}) {
      check_exact_all_reduce(group(name), count);
    }
  }
}

TEST(MpiCommunicator, AllReduceSumLargeBuffer) {
  check_exact_all_reduce(g_world->world(), (size_t{3} << 19) + 7);  // 1.5M floats, 6 MB
  check_exact_all_reduce(g_world->tp(), (size_t{1} << 20) + 1);
}

TEST(MpiCommunicator, AllReduceSumIsBitwiseEqualOnEveryRank) {
  constexpr size_t kCount = 768 * 64;
  std::mt19937 rng(1234 + g_world->rank());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> data(kCount);
  for (float& x : data) x = normal(rng);
  // The reference: every rank's inputs, summed in double.
  std::vector<float> inputs(kCount * 4);
  g_world->world().all_gather(data.data(), inputs.data(), kCount * sizeof(float));
  g_world->world().all_reduce_sum(data.data(), kCount);
  double max_diff = 0;
  for (size_t i = 0; i < kCount; ++i) {
    double ref = 0;
    for (int r = 0; r < 4; ++r) ref += inputs[r * kCount + i];
    max_diff = std::max(max_diff, std::abs(ref - data[i]));
  }
  std::printf("rank %d: all_reduce_sum max |diff| vs double reference: %.3g\n", g_world->rank(),
              max_diff);
  EXPECT_LT(max_diff, 1e-5);
  std::vector<float> results(kCount * 4);
  g_world->world().all_gather(data.data(), results.data(), kCount * sizeof(float));
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(std::memcmp(results.data(), results.data() + r * kCount, kCount * sizeof(float)), 0)
        << "rank " << r << " ended with different bits from rank 0";
  }
}

std::vector<uint8_t> pattern(int rank, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(rank * 31 + i * 7 + (i >> 13));
  return out;
}

void check_all_gather(MpiCommunicator& comm, size_t bytes, bool in_place) {
  const std::vector<int> ranks = members(comm);
  const std::vector<uint8_t> mine = pattern(g_world->rank(), bytes);
  std::vector<uint8_t> out(bytes * comm.size(), 0xAB);
  if (in_place) {
    std::memcpy(out.data() + comm.rank() * bytes, mine.data(), bytes);
    comm.all_gather(out.data() + comm.rank() * bytes, out.data(), bytes);
  } else {
    comm.all_gather(mine.data(), out.data(), bytes);
  }
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<uint8_t> expected = pattern(ranks[r], bytes);
    EXPECT_EQ(std::memcmp(out.data() + r * bytes, expected.data(), bytes), 0)
        << "group " << comm.name() << " slot " << r << " bytes " << bytes
        << (in_place ? " in place" : "");
  }
}

TEST(MpiCommunicator, AllGatherOnEveryGroup) {
  for (const char* name : {"world", "tp", "pp"}) {
    for (size_t bytes : {size_t{1}, size_t{3072}, size_t{4} << 20}) {
      check_all_gather(group(name), bytes, false);
      check_all_gather(group(name), bytes, true);
    }
  }
}

TEST(MpiCommunicator, BroadcastFromEveryRoot) {
  for (const char* name : {"world", "tp", "pp"}) {
    MpiCommunicator& comm = group(name);
    const std::vector<int> ranks = members(comm);
    for (int root = 0; root < comm.size(); ++root) {
      for (size_t bytes : {size_t{0}, size_t{5}, size_t{3072}, (size_t{5} << 20) + 3}) {
        std::vector<uint8_t> data =
            comm.rank() == root ? pattern(ranks[root], bytes) : std::vector<uint8_t>(bytes, 0);
        comm.broadcast(data.data(), bytes, root);
        EXPECT_EQ(data, pattern(ranks[root], bytes))
            << "group " << name << " root " << root << " bytes " << bytes;
      }
    }
  }
}

TEST(MpiCommunicator, SendRecvBetweenStages) {
  MpiCommunicator& pp = g_world->pp();
  for (size_t bytes : {size_t{0}, size_t{3072}, (size_t{6} << 20) + 1}) {
    // Stage 0 -> stage 1, then the answer back (as sampled tokens go back to stage 0).
    const std::vector<uint8_t> forward = pattern(100 + g_layout.tp_rank(), bytes);
    const std::vector<uint8_t> back = pattern(200 + g_layout.tp_rank(), bytes / 2);
    std::vector<uint8_t> got(bytes, 0);
    if (pp.rank() == 0) {
      pp.send(forward.data(), bytes, 1, 11);
      pp.recv(got.data(), bytes / 2, 1, 12);
      got.resize(bytes / 2);
      EXPECT_EQ(got, back) << "bytes " << bytes;
    } else {
      pp.recv(got.data(), bytes, 0, 11);
      EXPECT_EQ(got, forward) << "bytes " << bytes;
      pp.send(back.data(), bytes / 2, 0, 12);
    }
  }
  // A ring over the world, even ranks sending first so that large messages cannot deadlock.
  MpiCommunicator& world = g_world->world();
  const int next = (world.rank() + 1) % 4, prev = (world.rank() + 3) % 4;
  const std::vector<uint8_t> mine = pattern(world.rank(), 1 << 20);
  std::vector<uint8_t> got(mine.size());
  if (world.rank() % 2 == 0) {
    world.send(mine.data(), mine.size(), next, 3);
    world.recv(got.data(), got.size(), prev, 3);
  } else {
    world.recv(got.data(), got.size(), prev, 3);
    world.send(mine.data(), mine.size(), next, 3);
  }
  EXPECT_EQ(got, pattern(prev, 1 << 20));
}

TEST(MpiCommunicator, ChunkedPathsWithSmallPieces) {
  // Pieces of 64 KiB + 3 bytes: every operation below needs many, with a ragged last one.
  constexpr size_t kPiece = (size_t{64} << 10) + 3;
  ChunkGuard world_guard(g_world->world(), kPiece);
  ChunkGuard tp_guard(g_world->tp(), kPiece);
  ChunkGuard pp_guard(g_world->pp(), kPiece);
  check_exact_all_reduce(g_world->world(), 100003);
  check_exact_all_reduce(g_world->tp(), 16385);  // one full piece of 16384 floats and one float
  check_all_gather(g_world->world(), 300001, false);
  check_all_gather(g_world->world(), 300001, true);
  check_all_gather(g_world->pp(), kPiece, false);  // exactly one piece: the unchunked path
  std::vector<uint8_t> data =
      g_world->rank() == 2 ? pattern(2, 1000003) : std::vector<uint8_t>(1000003, 0);
  g_world->world().broadcast(data.data(), data.size(), 2);
  EXPECT_EQ(data, pattern(2, 1000003));
  MpiCommunicator& pp = g_world->pp();
  const std::vector<uint8_t> sent = pattern(7, 500001);
  std::vector<uint8_t> got(sent.size());
  if (pp.rank() == 0) pp.send(sent.data(), sent.size(), 1, 5);
  if (pp.rank() == 1) {
    pp.recv(got.data(), got.size(), 0, 5);
    EXPECT_EQ(got, sent);
  }
}

// post() returns before the receiver has posted its receive: rank 1 receives nothing until rank 0
// says (after its posts) that it is done posting. A post that waited for delivery (the 3 MB one
// cannot be delivered eagerly) would deadlock here, and the watchdog would fail the run after the
// test's 20 s timeout. Rank 0 overwrites its buffer after each post: the copy is what travels.
TEST(MpiCommunicator, PostReturnsWithoutWaitingForTheReceiver) {
  MpiCommunicator& world = g_world->world();
  constexpr int kTag = 21, kTagDone = 23;
  world.set_timeout(20);
  const std::vector<size_t> sizes = {5, 100003, (size_t{3} << 20) + 1, 0, 17};
  std::vector<std::vector<uint8_t>> messages;
  for (size_t i = 0; i < sizes.size(); ++i) {
    messages.push_back(pattern(50 + static_cast<int>(i), sizes[i]));
  }
  world.barrier();
  if (world.rank() == 0) {
    std::vector<uint8_t> buffer(*std::max_element(sizes.begin(), sizes.end()));
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::copy(messages[i].begin(), messages[i].end(), buffer.begin());
      world.post(buffer.data(), sizes[i], 1, kTag);
      std::fill(buffer.begin(), buffer.end(), 0xEE);  // the receiver must never see this
    }
    EXPECT_GE(world.posted_in_flight(), 1u);  // the 3 MB post cannot have completed yet
    const int done = 1;
    world.send(&done, sizeof(done), 1, kTagDone);
    world.flush();
    EXPECT_EQ(world.posted_in_flight(), 0u);
  } else if (world.rank() == 1) {
    int done = 0;
    world.recv(&done, sizeof(done), 0, kTagDone);
    EXPECT_EQ(done, 1);
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> got(sizes[i], 0xAB);
      world.recv(got.data(), got.size(), 0, kTag);
      EXPECT_EQ(got, messages[i]) << "message " << i << " of " << sizes[i] << " bytes";
    }
  }
  world.barrier();
  world.set_timeout(kTestTimeoutSeconds);
}

// Posted messages cut into many pieces (small max_chunk_bytes on both sides) arrive intact. Both
// stages post before either receives: with blocking sends of this size that would deadlock.
TEST(MpiCommunicator, PostChunkedPiecesArriveIntact) {
  MpiCommunicator& pp = g_world->pp();
  constexpr size_t kPiece = 4096 + 3;
  constexpr int kTag = 22;
  const int peer = 1 - pp.rank();
  const int peer_world = members(pp)[peer];
  ChunkGuard guard(pp, kPiece);
  // Many pieces with a ragged last one; exactly one piece; one piece and one byte; nothing.
  const std::vector<size_t> sizes = {300001, kPiece, kPiece + 1, 0, 2 * kPiece};
  std::vector<uint8_t> buffer(300001);
  auto message = [&](int world_rank, size_t i) {
    return pattern(60 + 8 * world_rank + static_cast<int>(i), sizes[i]);
  };
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> mine = message(g_world->rank(), i);
    std::copy(mine.begin(), mine.end(), buffer.begin());
    pp.post(buffer.data(), sizes[i], peer, kTag);
    std::fill(buffer.begin(), buffer.end(), 0xEE);
  }
  if (pp.rank() == 1) usleep(100'000);  // stage 0's pieces wait in flight meanwhile
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> got(sizes[i], 0xAB);
    pp.recv(got.data(), got.size(), peer, kTag);
    EXPECT_EQ(got, message(peer_world, i))
        << "message " << i << " of " << sizes[i] << " bytes from world rank " << peer_world;
  }
  pp.flush();
  EXPECT_EQ(pp.posted_in_flight(), 0u);
  g_world->world().barrier();
}

// recv_wait: the receiver may wait for the first piece far longer than the collective timeout
// (a recv would abort the group after 0.5 s here); the later pieces run under the timeout.
TEST(MpiCommunicator, RecvWaitOutlastsTheCollectiveTimeout) {
  MpiCommunicator& pp = g_world->pp();
  constexpr int kTag = 23;
  pp.set_timeout(0.5);
  int plan[8] = {};
  if (pp.rank() == 0) {
    usleep(1'500'000);  // idle for three timeouts: stage 1 must keep waiting
    for (int i = 0; i < 8; ++i) plan[i] = 40 + i + 100 * g_layout.tp_rank();
    pp.post(plan, sizeof(plan), 1, kTag);
    std::fill(plan, plan + 8, -1);
    pp.flush();
  } else {
    pp.recv_wait(plan, sizeof(plan), 0, kTag);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(plan[i], 40 + i + 100 * g_layout.tp_rank());
  }
  // A large message in many pieces, posted after more than the timeout.
  {
    ChunkGuard guard(pp, 4096);
    const std::vector<uint8_t> expected = pattern(70 + g_layout.tp_rank(), 100000);
    std::vector<uint8_t> big(expected.size(), 0xAB);
    if (pp.rank() == 0) {
      usleep(700'000);
      pp.post(expected.data(), expected.size(), 1, kTag);
      pp.flush();
      EXPECT_EQ(pp.posted_in_flight(), 0u);
    } else {
      pp.recv_wait(big.data(), big.size(), 0, kTag);
      EXPECT_EQ(big, expected);
    }
  }
  pp.barrier();
  pp.set_timeout(kTestTimeoutSeconds);
  g_world->world().barrier();
}

// Many posts with one tag to one peer arrive in the order posted, small (eager) and large
// (rendezvous) mixed, and a blocking send after them on the same tag arrives last.
TEST(MpiCommunicator, PostsKeepTheirOrder) {
  MpiCommunicator& pp = g_world->pp();
  constexpr int kTag = 24;
  const int base = 100 * g_layout.tp_rank();  // the two stage pairs send different data
  // Round 1: 100 messages of one size, so a message out of place shows as wrong contents.
  constexpr int kSame = 100;
  constexpr size_t kSameBytes = 1000;
  auto same_message = [&](int i) {
    std::vector<uint8_t> m = pattern(i, kSameBytes);
    std::memcpy(m.data(), &i, sizeof(i));
    std::memcpy(m.data() + sizeof(i), &base, sizeof(base));
    return m;
  };
  // Round 2: sizes from nothing to 256 KB in an order that puts small after large and back.
  std::vector<size_t> sizes;
  for (int i = 0; i < 40; ++i) {
    if (i % 5 == 0) {
      sizes.push_back((size_t{256} << 10) + i);
    } else {
      sizes.push_back(i % 7 == 0 ? 0 : static_cast<size_t>(13 * i % 300 + 1));
    }
  }
  auto mixed_message = [&](size_t i) { return pattern(static_cast<int>(i) + 3 * base, sizes[i]); };
  const std::vector<uint8_t> last = pattern(200 + base, 777);
  if (pp.rank() == 0) {
    std::vector<uint8_t> buffer;
    for (int i = 0; i < kSame; ++i) {
      buffer = same_message(i);
      pp.post(buffer.data(), buffer.size(), 1, kTag);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      buffer = mixed_message(i);
      pp.post(buffer.data(), buffer.size(), 1, kTag);
    }
    pp.send(last.data(), last.size(), 1, kTag);
    pp.flush();
    EXPECT_EQ(pp.posted_in_flight(), 0u);
  } else {
    usleep(100'000);  // let the posts queue up
    int out_of_place = 0;
    for (int i = 0; i < kSame; ++i) {
      std::vector<uint8_t> got(kSameBytes, 0xAB);
      pp.recv(got.data(), got.size(), 0, kTag);
      if (got != same_message(i)) {
        int index = -1;
        std::memcpy(&index, got.data(), sizeof(index));
        ADD_FAILURE() << "message " << i << " arrived as message " << index;
        ++out_of_place;
      }
    }
    EXPECT_EQ(out_of_place, 0);
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> got(sizes[i], 0xAB);
      pp.recv(got.data(), got.size(), 0, kTag);
      EXPECT_EQ(got, mixed_message(i)) << "mixed message " << i << " of " << sizes[i] << " bytes";
    }
    std::vector<uint8_t> got(last.size(), 0xAB);
    pp.recv(got.data(), got.size(), 0, kTag);
    EXPECT_EQ(got, last) << "the blocking send after the posts";
  }
  g_world->world().barrier();
}

TEST(MpiCommunicator, BarrierOnEveryGroup) {
  for (const char* name : {"world", "tp", "pp"}) group(name).barrier();
}

}  // namespace
}  // namespace ltm::parallel
