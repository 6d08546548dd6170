#include "parallel/watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "parallel/group_abort.h"
#include "parallel/mpi_call.h"
#include "parallel/rank_hosts.h"

namespace ltm::parallel {
namespace {

using Clock = Deadline::Clock;
using Seconds = std::chrono::duration<double>;

constexpr auto kLauncherCheckPeriod = std::chrono::seconds(1);

std::atomic<pid_t> g_launcher{0};

// Lock-free, so the handler may touch it (async-signal-safe).
std::atomic<uint64_t> g_broken_pipes{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

void count_broken_pipe(int) { g_broken_pipes.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

void watch_broken_pipes() {
  struct sigaction sa {};
  sa.sa_handler = count_broken_pipe;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // the write itself still fails with EPIPE
  sigaction(SIGPIPE, &sa, nullptr);
}

uint64_t broken_pipes() { return g_broken_pipes.load(std::memory_order_relaxed); }

Deadline Deadline::after(double seconds) {
  Deadline d;
  if (!(seconds > 0) || std::isinf(seconds)) return d;
  d.never_ = false;
  d.seconds_ = seconds;
  d.when_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
  return d;
}

void watch_launcher(pid_t parent) { g_launcher.store(parent > 1 ? parent : 0); }

bool launcher_alive() {
  const pid_t launcher = g_launcher.load(std::memory_order_relaxed);
  return launcher == 0 || getppid() == launcher;
}

PollResult poll_until(absl::FunctionRef<bool()> done, Deadline deadline,
                      const WatchdogOptions& options) {
  const Clock::time_point start = Clock::now();
  const auto spin = std::chrono::duration_cast<Clock::duration>(Seconds(options.spin_s));
  const auto min_sleep = std::chrono::duration_cast<Clock::duration>(Seconds(options.min_sleep_s));
  const auto max_sleep = std::chrono::duration_cast<Clock::duration>(
      Seconds(deadline.is_never() ? options.idle_max_sleep_s : options.max_sleep_s));
  Clock::time_point next_launcher_check = start + kLauncherCheckPeriod;

  for (;;) {  // spin: small operations finish here at full speed
    if (done()) return PollResult::kDone;
    const Clock::time_point now = Clock::now();
    if (deadline.expired(now)) return PollResult::kTimedOut;
    if (now - start >= spin) break;
  }
  for (;;) {  // nap between polls, longer the longer we wait
    if (done()) return PollResult::kDone;
    const Clock::time_point now = Clock::now();
    if (deadline.expired(now)) return PollResult::kTimedOut;
    if (broken_pipes() != 0) return PollResult::kBrokenPipe;
    if (now >= next_launcher_check) {
      if (!launcher_alive()) return PollResult::kLauncherGone;
      next_launcher_check = now + kLauncherCheckPeriod;
    }
    Clock::duration nap = std::clamp<Clock::duration>((now - start) / 8, min_sleep, max_sleep);
    if (!deadline.is_never()) nap = std::min<Clock::duration>(nap, deadline.when() - now);
    std::this_thread::sleep_for(nap);
  }
}

Watchdog::Watchdog(std::string group, WatchdogOptions options)
    : group_(std::move(group)), options_(options), timeout_s_(options.timeout_s) {}

std::string Watchdog::who(int peer) const {
  if (peer >= 0) {
    if (peer >= static_cast<int>(members_.size())) return "";
    const std::string peer_text = describe_ranks({members_[peer]});
    return peer_text.empty() ? "" : absl::StrCat(" (peer: ", peer_text, ")");
  }
  const std::string members = describe_ranks(members_);
  return members.empty() ? "" : absl::StrCat(" (members: ", members, ")");
}

std::string Watchdog::timeout_message(std::string_view op, size_t bytes, double seconds,
                                      int peer) const {
  return absl::StrCat(rank_prefix(), "collective ", std::string(op), " on group ", group_, " (",
                      bytes, " bytes) did not finish within ", seconds,
                      " s; a peer rank is dead or stuck; aborting the group", who(peer));
}

std::string Watchdog::broken_pipe_message(std::string_view op, int peer) const {
  return absl::StrCat(rank_prefix(), "a connection to a peer broke (EPIPE, \"Broken pipe\") "
                      "while this rank waited in ", std::string(op), " on group ", group_,
                      "; a peer rank or its node was lost; aborting the group", who(peer));
}

MPI_Status Watchdog::wait(MPI_Request* request, std::string_view op, size_t bytes,
                          Deadline deadline, int peer) const {
  MPI_Status status{};
  const PollResult result = poll_until(
      [&] {
        int flag = 0;
        int rc;
        {
          auto lock = lock_mpi();
          rc = MPI_Test(request, &flag, &status);
        }
        // A failed wait names the peer it waited for (a lost link, a truncated message).
        if (rc != MPI_SUCCESS) [[unlikely]]
          fail_mpi(rc, op, group_, __FILE__, __LINE__, who(peer));
        return flag != 0;
      },
      deadline, options_);
  switch (result) {
    case PollResult::kDone:
      return status;
    case PollResult::kTimedOut:
      abort_group(kExitCollectiveTimeout, timeout_message(op, bytes, deadline.seconds(), peer));
    case PollResult::kLauncherGone:
      abort_group(kExitLauncherGone,
                  absl::StrCat(rank_prefix(), "the launcher (mpirun/srun, pid ", g_launcher.load(),
                               ") exited while this rank waited in ", std::string(op), " on group ",
                               group_, "; aborting the group"));
    case PollResult::kBrokenPipe:
      abort_group(kExitMpiFailure, broken_pipe_message(op, peer));
  }
  abort_group(kExitMpiFailure, "unreachable");
}

}  // namespace ltm::parallel
