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
//
// PendingDeviceOps: operations enqueued with no host wait after them (the forward pass's
// all-reduces and receives). Each is recorded with a device marker (`slot`: for NCCL, a CUDA
// event recorded after it) and the deadline it was enqueued under; the host wait that comes later
// (a step's copy of its results back, Communicator::settle) waits for them in order, each under its
// own deadline, so the first one that does not finish is the one named in the timeout line. reap()
// pops the finished ones at the front without waiting (called as new ones are enqueued, so the
// list stays as long as the work the device has not reached yet).
#pragma once

#include <cstddef>
#include <deque>
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

class PendingDeviceOps {
 public:
  // poll(slot): the state of the marker after one operation (for NCCL: cudaEventQuery, and the
  // communicator's asynchronous error while not reached). release(slot): the marker may be reused.
  using Poll = absl::FunctionRef<DevicePoll(int slot)>;
  using Release = absl::FunctionRef<void(int slot)>;

  void push(std::string op, size_t bytes, Deadline deadline, int slot);
  size_t size() const { return ops_.size(); }
  bool empty() const { return ops_.empty(); }
  // The operation at the front (the oldest not seen finished); `empty()` must be false.
  const std::string& front_op() const { return ops_.front().op; }

  // Polls the front operations once each, popping (and releasing) the finished ones; stops at the
  // first still in progress. No waiting. An error ends it as in wait_device (abort_comm once, the
  // message names that operation); the list is then left as it is.
  DeviceWaitOutcome reap(Poll poll, Release release, absl::FunctionRef<void()> abort_comm,
                         const Watchdog& watchdog, std::string_view what, int rank, int size);
  // Waits for every operation, oldest first, each under its own deadline (wait_device); on
  // success the list is empty. The first failure ends it, naming the operation that failed.
  DeviceWaitOutcome wait_all(Poll poll, Release release, absl::FunctionRef<void()> abort_comm,
                             const Watchdog& watchdog, std::string_view what, int rank, int size);

 private:
  struct Op {
    std::string op;
    size_t bytes = 0;
    Deadline deadline = Deadline::never();
    int slot = 0;
  };
  std::deque<Op> ops_;
};

}  // namespace ltm::parallel
