// Signals the client binaries (ltm-client, ltm-loadgen) set up the same way. The ranks
// (ltm-worker, ltm-bench) count SIGPIPE instead, to take their group down naming the lost peer:
// parallel/watchdog.h, watch_broken_pipes.
#pragma once

#include <signal.h>

namespace ltm {

// A write to a socket or pipe whose reader has gone must fail (EPIPE) where it was made, not kill
// the process with signal 141 and no message. gRPC sends with MSG_NOSIGNAL already; this covers
// everything else (stdout into a closed pipe, a library that does not). Call it first in main,
// before any thread starts (the disposition is process-wide and survives exec).
inline void ignore_sigpipe() { ::signal(SIGPIPE, SIG_IGN); }

}  // namespace ltm
