// ltm-worker: one rank of an ltm group. Started alone it is a world of one; under mpirun or srun
// every rank runs this same binary (docs/architecture.md "Ranks and slices").
//
//   ltm-worker --model DIR (--prompt TEXT | --prompt-ids 1,2,3) --max-new-tokens N ...
//       one-shot: generate, print the text (or JSON), exit 0.
//   mpirun -n N ltm-worker --model DIR --tp T --pp P --listen ADDR
//       serve the gRPC API from rank 0 (see README).
// Exit codes (common/exit_codes.h): 0 done; 1 a runtime error (bad checkpoint, ...); 2 bad
// command line or layout; 3 a collective timed out; 4 the launcher vanished; 5 an MPI call failed
// (a peer was lost, or its connection broke mid-send); 6 the model is missing. The Slurm job
// script requeues only on 3, 4, 5 and 137 (a rank killed); 141 too, for older binaries.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/openmp_wait.h"
#include "parallel/watchdog.h"
#include "launcher/worker_options.h"
#include "launcher/worker_run.h"

int main(int argc, char** argv) {
  ltm::parallel::watch_broken_pipes();  // a lost peer: the group abort, not SIGPIPE (watchdog.h)
  ltm::bound_openmp_spin(argv);  // first: may exec this program again (common/openmp_wait.h)
  ltm::log_to_stderr();
  ltm::WorkerOptions options;
  std::string error;
  const ltm::ParseResult parsed = ltm::parse_worker_options(argc, argv, &options, &error);
  if (parsed == ltm::ParseResult::kHelp) return 0;
  if (parsed == ltm::ParseResult::kError) {
    std::fprintf(stderr, "ltm-worker: %s\n\n%s", error.c_str(), ltm::worker_usage().c_str());
    return 2;
  }
  if (options.verbose) spdlog::set_level(spdlog::level::debug);
  return ltm::run_worker(options, &argc, &argv);
}
