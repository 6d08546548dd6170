// The device communicator's watchdog state machine (parallel/device_wait.h) with injected poll
// results, as NCCL's ncclCommGetAsyncError would give them: an operation in progress for ever is
// aborted exactly once at the deadline, with the timeout line naming host, rank, operation and
// group; an asynchronous error is aborted once and reported in its own words; a finished one is
// never aborted.
#include "parallel/device_wait.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ltm::parallel
