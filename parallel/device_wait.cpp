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

}  // namespace ltm::parallel
