// The watchdog's side of a device communicator (NCCL), without NCCL: how an operation that was
// handed to the device is waited for, and how it ends when it does not finish. Kept free of NCCL
// so that the state machine is unit-tested with injected poll results (device_wait_test).
//
// wait_device(poll, abort_comm, ...) calls poll() (for NCCL: ncclCommGetAsyncError, and a
// cudaEventQuery once enqueued) under the spin-then-nap schedule of poll_until (watchdog.h):
//   kDone        -> returns kDone;
//   kInProgress  -> polls again, until the deadline passes: then abort_comm() once (for NCCL:
//                   ncclCommAbort, so peers blocked in the communicator fail too) and returns
//                   kTimedOut with the watchdog's timeout line (host, rank, operation, group);
//   kError       -> abort_comm() once and returns kError with "<prefix><op> on group <name>
//                   failed: <the poll's message>".
// A vanished launcher or a broken pipe ends the wait the same way (abort_comm once, its message).
// The caller then takes the group down with abort_group(outcome.exit_code, outcome.message).
#pragma once

#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "parallel/watchdog.h"

namespace ltm::parallel {

struct DevicePoll {
  enum State { kDone, kInProgress, kError };
  State state = kInProgress;
  std::string error;  // kError: what the device said
};

struct DeviceWaitOutcome {
  PollResult result = PollResult::kDone;
  bool error = false;       // the device reported an error (result is then kDone)
  int exit_code = 0;        // for abort_group when not ok()
  std::string message;      // one line, with the rank prefix
  bool ok() const { return result == PollResult::kDone && !error; }
};

// `what` names the device library in messages ("NCCL").
DeviceWaitOutcome wait_device(absl::FunctionRef<DevicePoll()> poll,
                              absl::FunctionRef<void()> abort_comm, const Watchdog& watchdog,
                              std::string_view what, std::string_view op, size_t bytes,
                              Deadline deadline, int rank, int size);

}  // namespace ltm::parallel
