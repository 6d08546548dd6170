// Taking the whole group down: the one exit path for MPI failures, collective timeouts and a
// vanished launcher (docs/architecture.md "Conventions", second error tier: one dead rank must not leave the
// others hanging).
//
// abort_group prints its message to stderr, then calls MPI_Abort(MPI_COMM_WORLD, code), which asks
// mpirun (or srun) to kill every rank of the job. MPI_Abort itself can hang when the launcher or
// the network is gone, so an enforcer thread is started first: if the process still exists after
// kAbortGraceSeconds, it calls _exit(code). Either way the process ends with a non-zero status.
//
// Threading: any thread may call abort_group; the first caller aborts, later callers print their
// message and wait for the end. No MPI call is needed before it (without MPI it just _exits).
#pragma once

#include "common/exit_codes.h"

#include <string>
#include <functional>
#include <string_view>

namespace ltm::parallel {

// Exit codes of a group abort (also the MPI_Abort error code, so mpirun exits with it); the
// whole list is in common/exit_codes.h.
using ltm::kExitCollectiveTimeout;  // the collective watchdog fired
using ltm::kExitLauncherGone;       // mpirun/srun died while this rank waited
using ltm::kExitMpiFailure;         // an MPI call returned an error (a peer or its link was lost)

// How long MPI_Abort may take before the enforcer thread calls _exit.
inline constexpr double kAbortGraceSeconds = 5.0;

// This machine's host name (cached).
const std::string& this_host();
// This process's rank in MPI_COMM_WORLD, or -1 before MPI_Init (cached once known).
int this_world_rank();
// "ltm: <host>:<world rank>: ", the prefix of every message of this tier.
std::string rank_prefix();

// Prints `message` (one line, newline added) and takes the group down with `exit_code`.
[[noreturn]] void abort_group(int exit_code, std::string_view message);

// A last word before the group goes down: called once, by the first aborting thread, with the
// message, after the enforcer thread has started (so a hook that hangs cannot keep the process
// alive past kAbortGraceSeconds). Rank 0 uses it to answer in-flight requests UNAVAILABLE.
// Set it once, before the runtime starts; the hook must not call MPI.
void set_abort_hook(std::function<void(std::string_view message)> hook);

}  // namespace ltm::parallel
