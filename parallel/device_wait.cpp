#include "parallel/device_wait.h"

#include "absl/strings/str_cat.h"
#include "parallel/group_abort.h"

namespace ltm::parallel {

DeviceWaitOutcome wait_device(absl::FunctionRef<DevicePoll()> poll,
                              absl::FunctionRef<void()> abort_comm, const Watchdog& watchdog,
                              std::string_view what, std::string_view op, size_t bytes,
                              Deadline deadline, int rank, int size) {
  DeviceWaitOutcome out;
  std::string error;
  const PollResult result = poll_until(
      [&] {
        DevicePoll p = poll();
        if (p.state == DevicePoll::kInProgress) return false;
        if (p.state == DevicePoll::kError) {
          out.error = true;
          error = std::move(p.error);
        }
        return true;
      },
      deadline, watchdog.options());
  out.result = result;
  if (out.ok()) return out;
  abort_comm();  // once: peers blocked in the communicator fail instead of hanging
  if (out.error) {
    out.exit_code = kExitMpiFailure;
    out.message = absl::StrCat(rank_prefix(), std::string(what), " ", std::string(op), " on group ", watchdog.group(),
                               " (rank ", rank, " of ", size, ") failed: ", error);
    return out;
  }
  switch (result) {
    case PollResult::kTimedOut:
      out.exit_code = kExitCollectiveTimeout;
      out.message = watchdog.timeout_message(op, bytes, deadline.seconds());
      break;
    case PollResult::kLauncherGone:
      out.exit_code = kExitLauncherGone;
      out.message = absl::StrCat(rank_prefix(),
                                 "the launcher (mpirun/srun) exited while this rank waited in ",
                                 std::string(what), " ", std::string(op), " on group ",
                                 watchdog.group(),
                                 "; aborting the group");
      break;
    case PollResult::kBrokenPipe:
      out.exit_code = kExitMpiFailure;
      out.message = watchdog.broken_pipe_message(op);
      break;
    case PollResult::kDone:
      break;
  }
  return out;
}

void PendingDeviceOps::push(std::string op, size_t bytes, Deadline deadline, int slot) {
  ops_.push_back({std::move(op), bytes, deadline, slot});
}

DeviceWaitOutcome PendingDeviceOps::reap(Poll poll, Release release,
                                         absl::FunctionRef<void()> abort_comm,
                                         const Watchdog& watchdog, std::string_view what, int rank,
                                         int size) {
  while (!ops_.empty()) {
    const Op& op = ops_.front();
    DevicePoll p = poll(op.slot);
    if (p.state == DevicePoll::kInProgress) break;
    if (p.state == DevicePoll::kError) {
      // The same outcome wait_device gives an error, for this operation.
      return wait_device([&] { return p; }, abort_comm, watchdog, what, op.op, op.bytes,
                         op.deadline, rank, size);
    }
    release(op.slot);
    ops_.pop_front();
  }
  return {};
}

DeviceWaitOutcome PendingDeviceOps::wait_all(Poll poll, Release release,
                                             absl::FunctionRef<void()> abort_comm,
                                             const Watchdog& watchdog, std::string_view what,
                                             int rank, int size) {
  while (!ops_.empty()) {
    const Op& op = ops_.front();
    DeviceWaitOutcome out = wait_device([&] { return poll(op.slot); }, abort_comm, watchdog, what,
                                        op.op, op.bytes, op.deadline, rank, size);
    if (!out.ok()) return out;
    release(op.slot);
    ops_.pop_front();
  }
  return {};
}

}  // namespace ltm::parallel
