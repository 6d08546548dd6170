// Exit codes of ltm-worker and ltm-bench: the one list, shared by the launchers and by the Slurm
// job scripts (launcher/slurm/), which requeue a job only for the codes a rerun can cure.
//
//   code  meaning                                                  a rerun can cure it?
//   0     done (one-shot finished, or a server drained)            -
//   1     a runtime error: unreadable or corrupt checkpoint,       no
//         cannot bind the listen address, out of memory, ...
//   2     bad command line: an unknown flag, a bad value, or a     no
//         layout (tp x pp) that does not fit the world or model
//   3     a collective timed out (--collective-timeout)            yes (a stuck or lost rank)
//   4     the launcher (mpirun/srun) vanished while a rank waited  yes
//   5     an MPI call failed: a peer rank or its link was lost     yes
//         (also a connection to a peer broke mid-send, EPIPE, and
//         launcher/ltm-mpirun's for mpirun's own 205: a lost node)
//   6     --model names no folder or config file                   no
//   7     an internal invariant failed (a bug: LTM_ASSERT); the     no
//         message names host, rank and the check
//
// A rank killed by a signal ends its launcher with 128 + the signal (srun, mpirun): SIGKILL (137)
// is how a lost node, the OOM killer or an operator's kill shows, and is treated as curable.
// SIGPIPE (141) no longer kills a rank: ltm-worker and ltm-bench count it (parallel/watchdog.h)
// and end with 5; the job script still requeues 141 for older binaries.
#pragma once

#include "absl/status/status.h"

namespace ltm {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntimeError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCollectiveTimeout = 3;
inline constexpr int kExitLauncherGone = 4;
inline constexpr int kExitMpiFailure = 5;
inline constexpr int kExitModelNotFound = 6;
inline constexpr int kExitInternalError = 7;

// The exit code for a failed start-up (flags, model, layout, loading).
inline int exit_code_for_setup(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return kExitOk;
    case absl::StatusCode::kInvalidArgument: return kExitUsage;
    case absl::StatusCode::kNotFound: return kExitModelNotFound;
    default: return kExitRuntimeError;
  }
}

}  // namespace ltm
