// What ltm-worker does once its flags are parsed: join the MPI world, load this rank's slices,
// then either run one generation (one-shot) or serve the gRPC API (rank 0) while the other ranks
// follow rank 0's step plans. Returns the process exit code.
#pragma once

#include "launcher/worker_options.h"
#include "runtime/sched/scheduler.h"

namespace ltm {

int run_worker(const WorkerOptions& options, int* argc, char*** argv);

// The scheduler settings every use of the worker's scheduler takes from the flags (serving,
// one-shot, --perplexity): --max-batch-tokens, --max-running, --max-queue, --lora-max-rank,
// --lora-max-adapters. Each caller sets the rest.
SchedulerOptions scheduler_options(const WorkerOptions& o);

}  // namespace ltm
