// rank_hosts: failure messages name the host of the peer that was lost (issue 10, item 5).
#include "parallel/rank_hosts.h"

#include <gtest/gtest.h>

#include "parallel/group_abort.h"
#include "parallel/watchdog.h"

namespace ltm::parallel {
namespace {

TEST(RankHosts, EmptyUntilSetThenGroupedByHost) {
  EXPECT_EQ(rank_host(0), "");
  EXPECT_EQ(describe_ranks({0, 1}), "");
  Watchdog before("pp", WatchdogOptions{});
  before.set_members({1, 3});
  EXPECT_EQ(before.who(0), "");  // no host known: no suffix, the message as it always was

  set_rank_hosts({"h0", "h0", "h1", "h1"});
  EXPECT_EQ(rank_host(2), "h1");
  EXPECT_EQ(rank_host(4), "");
  EXPECT_EQ(rank_host(-1), "");
  EXPECT_EQ(describe_ranks({2}), "rank 2 on h1");
  EXPECT_EQ(describe_ranks({0, 1}), "ranks 0, 1 on h0");
  EXPECT_EQ(describe_ranks({1, 3}), "rank 1 on h0; rank 3 on h1");
  EXPECT_EQ(describe_ranks({0, 1, 2, 3}), "ranks 0, 1 on h0; ranks 2, 3 on h1");
  EXPECT_EQ(describe_ranks({2, 7}), "rank 2 on h1; rank 7");
}

TEST(RankHosts, TimeoutMessageNamesThePeerOrTheMembers) {
  set_rank_hosts({"h0", "h0", "h1", "h1"});
  Watchdog pp("pp", WatchdogOptions{});
  pp.set_members({1, 3});  // group ranks 0, 1 are world ranks 1, 3
  EXPECT_EQ(pp.timeout_message("recv(src=1,tag=7)", 16, 6, 1),
            "ltm: " + this_host() +
                ":-1: collective recv(src=1,tag=7) on group pp (16 bytes) did not finish within "
                "6 s; a peer rank is dead or stuck; aborting the group (peer: rank 3 on h1)");
  EXPECT_EQ(pp.who(5), "");  // not a member: nothing rather than a wrong name
  Watchdog tp("tp", WatchdogOptions{});
  tp.set_members({2, 3});
  EXPECT_EQ(tp.who(-1), " (members: ranks 2, 3 on h1)");
}

}  // namespace
}  // namespace ltm::parallel
