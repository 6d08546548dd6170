// The collective watchdog: every communicator operation runs under a deadline, so a peer rank
// that died or never arrives cannot hang the group (docs/architecture.md "Serving": never a silent hang).
//
// How: MpiCommunicator starts each operation non-blocking (MPI_Iallreduce, MPI_Ibcast, MPI_Isend,
// ...) and hands the request to Watchdog::wait, which polls it with MPI_Test:
//   - first it spins (spin_s, 1 ms by default), so a small all-reduce costs about what a blocking
//     MPI_Allreduce costs: 768 floats on 2 ranks, median 3.3-4 us against 1.7-2.1 us for the
//     blocking call (the difference is Open MPI's non-blocking algorithm, not the polling). A 50 us
//     spin matched that median but doubled mid-size (384 KB) all-reduces, whose rounds stall while
//     we nap (tests/parallel/allreduce_latency_bench.cpp measures it);
//   - then it naps between polls, each nap ~1/8 of the time waited so far (at least min_sleep_s,
//     at most max_sleep_s = 250 us), so a long operation is noticed finished within ~12% of its
//     length and a rank waiting for a slow peer does not hold a core;
//   - the deadline is checked at every poll. When it passes, the rank prints
//       ltm: <host>:<rank>: collective <op> on group <name> (<n> bytes) did not finish
//       within <T> s; a peer rank is dead or stuck; aborting the group (peer: rank 2 on h1)
//     (one line; the part in brackets names the peer of a send/recv, or the members of the group
//     for a collective, with their hosts: rank_hosts.h; it is left out while no host is known)
//     and calls abort_group(kExitCollectiveTimeout): MPI_Abort(MPI_COMM_WORLD, 3), with a thread
//     that _exit(3)s if MPI_Abort has not ended the process within kAbortGraceSeconds.
// Open MPI makes progress on non-blocking operations only inside MPI calls; the polling is that
// progress, so nothing else (no progress thread) is needed.
//
// Waiting for work (the idle wait). Ranks other than 0 wait between steps in a receive of rank
// 0's next step plan, which may take hours while the server is idle, so that wait has no deadline
// (MpiCommunicator::recv_wait: Deadline::never() for the first plan); it naps up to
// idle_max_sleep_s (2 ms) between polls, a few hundred cheap MPI_Test calls a second. It still does not hang forever:
//   1. a peer that exits or is killed: mpirun (Open MPI 4.1) and srun see the process end and kill
//      the whole job within a second or two, usually before any deadline (watchdog_test's "kill"
//      case: exit 137, "mpirun noticed that process rank 2 ... exited on signal 9");
//   2. the launcher itself dies (mpirun SIGKILLed, the Slurm step torn down): this process is
//      re-parented. Every poll loop checks getppid() once a second against the parent recorded at
//      MPI start-up (watch_launcher) and then aborts with kExitLauncherGone (checked by
//      watchdog_test: the ranks are gone ~3 s after mpirun is SIGKILLed);
//   3. rank 0 alive but stuck outside MPI cannot be told from an idle server by waiting alone, so
//      a serving rank 0 sends a keep-alive (empty) plan every --keepalive-s while idle, and the
//      other ranks, once the first plan has come, wait with a deadline (Engine::set_idle_timeout:
//      --collective-timeout + 3 x --keepalive-s), which then fires like any collective.
// We chose this over heartbeats everywhere because (1) and (2) cover dead processes at no cost;
// (3) costs one small message per --keepalive-s from rank 0 only.
//
// A peer that vanishes mid-send (its node's processes gone, its kernel answering with resets):
// Open MPI's TCP link fails its writev with EPIPE, prints "mca_btl_tcp_frag_send: writev failed:
// Broken pipe", and leaves the operation unfinished forever; with SIGPIPE's default action the
// rank died of signal 141 instead, with no message of ours. watch_broken_pipes() (every rank, at
// start) counts SIGPIPEs in a handler instead, so the write fails with EPIPE where it was made,
// and every wait that sees a count aborts the group at its next nap (well under a millisecond
// after the spin) with
//   ltm: <host>:<rank>: a connection to a peer broke (EPIPE, "Broken pipe") while this rank
//   waited in <op> on group <name>; a peer rank or its node was lost; aborting the group (peer:
//   rank 2 on h1)
// and kExitMpiFailure, instead of waiting for --collective-timeout. (The count is process-wide:
// the peer named is the one this wait was for, which is the one lost when this rank was sending
// to it, the case that raises SIGPIPE. Our own sockets send with MSG_NOSIGNAL, so they never
// count.)
//
// Threading: a Watchdog is used by the one thread that owns its communicator; set_timeout may be
// called from any thread. poll_until makes no MPI calls itself.
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"

namespace ltm::parallel {

inline constexpr double kDefaultCollectiveTimeoutSeconds = 300.0;  // --collective-timeout

struct WatchdogOptions {
  double timeout_s = kDefaultCollectiveTimeoutSeconds;  // <= 0: no deadline (not for production)
  double spin_s = 1e-3;                                 // busy polling before the first nap
  double min_sleep_s = 5e-6;                            // shortest nap between polls
  double max_sleep_s = 250e-6;     // longest nap while an operation runs (under a deadline)
  double idle_max_sleep_s = 2e-3;  // longest nap of a wait with no deadline (waiting for work)
};

// When a wait gives up: a point on the steady clock, or never.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // `seconds` from now; seconds <= 0 means never.
  static Deadline after(double seconds);
  static Deadline never() { return Deadline(); }

  bool is_never() const { return never_; }
  bool expired(Clock::time_point now) const { return !never_ && now >= when_; }
  Clock::time_point when() const { return when_; }
  double seconds() const { return seconds_; }  // what it was made from, for messages

 private:
  Deadline() = default;
  bool never_ = true;
  Clock::time_point when_{};
  double seconds_ = 0;
};

enum class PollResult { kDone, kTimedOut, kLauncherGone, kBrokenPipe };

// Installs the SIGPIPE handler that counts broken pipes (above); call it first in main, before
// any thread starts. Without it (tests, tools) SIGPIPE keeps whatever disposition it has.
void watch_broken_pipes();
// SIGPIPEs counted since watch_broken_pipes().
uint64_t broken_pipes();

// Calls done() until it returns true (kDone), the deadline passes (kTimedOut), the launcher
// recorded by watch_launcher is gone (kLauncherGone) or a broken pipe has been counted
// (kBrokenPipe, checked after the spin), spinning then napping as described above.
PollResult poll_until(absl::FunctionRef<bool()> done, Deadline deadline,
                      const WatchdogOptions& options);

// Records the launcher (mpirun, orted, slurmstepd) as this process's parent: poll loops abort when
// the parent changes. 0, or a parent that is already init (pid 1), turns the check off.
void watch_launcher(pid_t parent);
bool launcher_alive();

// One communicator's watchdog: its group name, its timeout, and the wait that enforces it.
class Watchdog {
 public:
  Watchdog(std::string group, WatchdogOptions options);

  const std::string& group() const { return group_; }
  const WatchdogOptions& options() const { return options_; }
  void set_timeout(double seconds) { timeout_s_.store(seconds, std::memory_order_relaxed); }
  double timeout_s() const { return timeout_s_.load(std::memory_order_relaxed); }
  // now + timeout_s(): the deadline of an operation that starts now.
  Deadline deadline() const { return Deadline::after(timeout_s()); }

  // The world ranks of the group's members, indexed by group rank (for messages). Set once, before
  // the communicator is used.
  void set_members(std::vector<int> world_ranks) { members_ = std::move(world_ranks); }

  // Polls `request` until it completes and returns its status. Never returns on failure: an MPI
  // error, a passed deadline or a vanished launcher take the group down with the message above.
  // `op` ("all_reduce_sum", "send(dst=1,tag=7)") and `bytes` (the whole operation's) are named
  // in the message; `peer` is the group rank waited for (a send or receive), or -1 for a
  // collective of the whole group.
  MPI_Status wait(MPI_Request* request, std::string_view op, size_t bytes, Deadline deadline,
                  int peer = -1) const;

  // The timeout message, exposed for tests.
  std::string timeout_message(std::string_view op, size_t bytes, double seconds,
                              int peer = -1) const;
  // The broken-pipe message (above), exposed for MpiCommunicator's posted sends and tests.
  std::string broken_pipe_message(std::string_view op, int peer = -1) const;
  // " (peer: rank 2 on h1)", " (members: ranks 0, 1 on h0)", or "" when no host is known.
  std::string who(int peer) const;

 private:
  std::string group_;
  std::vector<int> members_;
  WatchdogOptions options_;
  std::atomic<double> timeout_s_;
};

}  // namespace ltm::parallel
