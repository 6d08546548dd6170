// The device communicator's watchdog state machine (parallel/device_wait.h) with injected poll
// results, as NCCL's ncclCommGetAsyncError would give them: an operation in progress for ever is
// aborted exactly once at the deadline, with the timeout line naming host, rank, operation and
// group; an asynchronous error is aborted once and reported in its own words; a finished one is
// never aborted. PendingDeviceOps (operations enqueued with no host wait, waited for at the
// step's one host wait): the first operation that does not finish is the one named, the finished
// ones before it are released, and nothing is aborted while everything finishes.
#include "parallel/device_wait.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "common/exit_codes.h"

namespace ltm::parallel {
namespace {

WatchdogOptions fast() {
  WatchdogOptions o;
  o.timeout_s = 0.05;
  o.spin_s = 1e-4;
  return o;
}

TEST(DeviceWait, InProgressForeverAbortsOnceWithTheTimeoutLine) {
  Watchdog wd("tp", fast());
  int polls = 0, aborts = 0;
  const DeviceWaitOutcome out = wait_device(
      [&] {
        ++polls;
        return DevicePoll{DevicePoll::kInProgress, ""};
      },
      [&] { ++aborts; }, wd, "NCCL", "all_reduce_sum", 4096, wd.deadline(), 1, 2);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.result, PollResult::kTimedOut);
  EXPECT_EQ(aborts, 1);
  EXPECT_GT(polls, 1);
  EXPECT_EQ(out.exit_code, kExitCollectiveTimeout);
  EXPECT_NE(out.message.find("ltm: "), std::string::npos) << out.message;  // host:rank prefix
  EXPECT_NE(out.message.find("all_reduce_sum on group tp"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("4096 bytes"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("did not finish within"), std::string::npos) << out.message;
}

TEST(DeviceWait, AnAsyncErrorAbortsOnceWithItsMessage) {
  Watchdog wd("pp", fast());
  int polls = 0, aborts = 0;
  const DeviceWaitOutcome out = wait_device(
      [&] {
        return ++polls < 3 ? DevicePoll{DevicePoll::kInProgress, ""}
                           : DevicePoll{DevicePoll::kError, "remote process exited: peer gone"};
      },
      [&] { ++aborts; }, wd, "NCCL", "send(dst=1,tag=101)", 64, wd.deadline(), 0, 2);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(out.exit_code, kExitMpiFailure);
  EXPECT_NE(out.message.find("NCCL send(dst=1,tag=101) on group pp (rank 0 of 2) failed: "
                             "remote process exited: peer gone"),
            std::string::npos)
      << out.message;
}

TEST(DeviceWait, AFinishedOperationIsNeverAborted) {
  Watchdog wd("tp", fast());
  int polls = 0, aborts = 0;
  const DeviceWaitOutcome out = wait_device(
      [&] {
        return ++polls < 5 ? DevicePoll{DevicePoll::kInProgress, ""}
                           : DevicePoll{DevicePoll::kDone, ""};
      },
      [&] { ++aborts; }, wd, "NCCL", "barrier", 4, Deadline::never(), 0, 2);
  EXPECT_TRUE(out.ok());
  EXPECT_EQ(polls, 5);
  EXPECT_EQ(aborts, 0);
  EXPECT_TRUE(out.message.empty());
}

// Three all-reduces enqueued with no host wait; per slot, how many polls until each finishes
// (-1: never) or an error.
struct FakeStream {
  std::map<int, int> polls_left;  // slot -> polls before done; -1 forever
  std::map<int, std::string> error;  // slot -> fails with this message
  std::map<int, int> polls;
  std::vector<int> released;
  DevicePoll poll(int slot) {
    ++polls[slot];
    if (error.count(slot)) return {DevicePoll::kError, error[slot]};
    int& left = polls_left[slot];
    if (left < 0) return {DevicePoll::kInProgress, ""};
    if (left == 0) return {DevicePoll::kDone, ""};
    --left;
    return {DevicePoll::kInProgress, ""};
  }
};

PendingDeviceOps three(const Watchdog& wd) {
  PendingDeviceOps ops;
  ops.push("all_reduce_sum", 100, wd.deadline(), 7);
  ops.push("recv(src=0,tag=101)", 200, wd.deadline(), 3);
  ops.push("all_reduce_sum", 300, wd.deadline(), 5);
  return ops;
}

TEST(PendingDeviceOps, WaitAllNamesTheFirstOperationThatNeverFinishes) {
  Watchdog wd("tp", fast());
  FakeStream dev;
  dev.polls_left = {{7, 2}, {3, -1}, {5, 0}};
  PendingDeviceOps ops = three(wd);
  int aborts = 0;
  const DeviceWaitOutcome out = ops.wait_all([&](int s) { return dev.poll(s); },
                                             [&](int s) { dev.released.push_back(s); },
                                             [&] { ++aborts; }, wd, "NCCL", 1, 2);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.result, PollResult::kTimedOut);
  EXPECT_EQ(out.exit_code, kExitCollectiveTimeout);
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(dev.released, std::vector<int>{7});  // the first finished; the hung one is kept
  EXPECT_EQ(dev.polls.count(5), 0u) << "the wait went past the operation that hung";
  EXPECT_NE(out.message.find("ltm: "), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("recv(src=0,tag=101) on group tp (200 bytes) did not finish"),
            std::string::npos)
      << out.message;
  EXPECT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops.front_op(), "recv(src=0,tag=101)");
}

TEST(PendingDeviceOps, WaitAllReportsAnAsyncErrorOfALaterOperation) {
  Watchdog wd("pp", fast());
  FakeStream dev;
  dev.polls_left = {{7, 0}, {3, 1}};
  dev.error[5] = "unhandled cuda error: peer gone";
  PendingDeviceOps ops = three(wd);
  int aborts = 0;
  const DeviceWaitOutcome out = ops.wait_all([&](int s) { return dev.poll(s); },
                                             [&](int s) { dev.released.push_back(s); },
                                             [&] { ++aborts; }, wd, "NCCL", 0, 2);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(out.exit_code, kExitMpiFailure);
  EXPECT_EQ(dev.released, (std::vector<int>{7, 3}));
  EXPECT_NE(out.message.find("NCCL all_reduce_sum on group pp (rank 0 of 2) failed: unhandled "
                             "cuda error: peer gone"),
            std::string::npos)
      << out.message;
}

TEST(PendingDeviceOps, WaitAllReleasesEverySlotWhenAllFinish) {
  Watchdog wd("tp", fast());
  FakeStream dev;
  dev.polls_left = {{7, 3}, {3, 0}, {5, 4}};
  PendingDeviceOps ops = three(wd);
  int aborts = 0;
  const DeviceWaitOutcome out = ops.wait_all([&](int s) { return dev.poll(s); },
                                             [&](int s) { dev.released.push_back(s); },
                                             [&] { ++aborts; }, wd, "NCCL", 0, 2);
  EXPECT_TRUE(out.ok()) << out.message;
  EXPECT_EQ(aborts, 0);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(dev.released, (std::vector<int>{7, 3, 5}));
}

TEST(PendingDeviceOps, ReapPopsTheFinishedPrefixWithoutWaiting) {
  Watchdog wd("tp", fast());
  FakeStream dev;
  dev.polls_left = {{7, 0}, {3, -1}, {5, 0}};  // the third finished, but behind a running one
  PendingDeviceOps ops = three(wd);
  int aborts = 0;
  const DeviceWaitOutcome out = ops.reap([&](int s) { return dev.poll(s); },
                                         [&](int s) { dev.released.push_back(s); },
                                         [&] { ++aborts; }, wd, "NCCL", 0, 2);
  EXPECT_TRUE(out.ok());
  EXPECT_EQ(aborts, 0);
  EXPECT_EQ(dev.polls[3], 1) << "reap waited";
  EXPECT_EQ(dev.released, std::vector<int>{7});
  EXPECT_EQ(ops.size(), 2u);
}

TEST(PendingDeviceOps, ReapReportsAnErrorAtOnce) {
  Watchdog wd("tp", fast());
  FakeStream dev;
  dev.error[7] = "remote process exited";
  PendingDeviceOps ops = three(wd);
  int aborts = 0;
  const DeviceWaitOutcome out = ops.reap([&](int s) { return dev.poll(s); },
                                         [&](int s) { dev.released.push_back(s); },
                                         [&] { ++aborts; }, wd, "NCCL", 1, 2);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(dev.polls[7], 1);
  EXPECT_TRUE(dev.released.empty());
  EXPECT_NE(out.message.find("NCCL all_reduce_sum on group tp (rank 1 of 2) failed: remote "
                             "process exited"),
            std::string::npos)
      << out.message;
}

}  // namespace
}  // namespace ltm::parallel
