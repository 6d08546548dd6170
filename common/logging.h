// Where log lines go and what they carry.
//
// stderr, in every executable: stdout is the programs' output (generated text, --output json,
// ltm-bench's JSON lines), which a log line on it would corrupt; spdlog's default logger writes to
// stdout. Every line names the host and the MPI rank, and the request when one is in scope:
//   [2026-12-01 09:36:44.313] [node7 r0] [info] cpu kernels: avx512 ...
//   [2026-12-01 09:36:44.913] [node7 r0 req 42] [warning] ...
// Colour (level names in ANSI colours) only when stderr is a terminal, NO_COLOR is unset and TERM
// is not "dumb": logs redirected to a file or a pipe carry no escape bytes.
#pragma once

#include <string>
#include <string_view>

#include "spdlog/spdlog.h"

namespace ltm {

// Installs the "ltm" stderr logger as spdlog's default (idempotent). The rank starts as the
// launcher's (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID; 0 when started alone)
// until set_log_rank() gives the MPI world's.
void log_to_stderr();
void set_log_rank(int rank);

// This process's rank as its launcher says (the variables above), before MPI starts; 0 alone.
int launcher_rank();

// Whether stderr is a terminal that should get colour and progress lines (isatty, NO_COLOR
// unset, TERM not "dumb").
bool stderr_is_terminal();

// A progress display (runtime/model/load_progress.h) says it has drawn a status line on the
// terminal (no newline); the next log line erases it first and the display draws it again.
void set_status_line_drawn(bool drawn);

// The host name as log lines carry it.
const std::string& log_host();

// While alive, log lines written by this thread carry "req ID" (control bytes shown as '?', cut
// at 64 bytes). Scopes nest (the inner one wins).
class LogRequestScope {
 public:
  explicit LogRequestScope(std::string_view request_id);
  ~LogRequestScope();
  LogRequestScope(const LogRequestScope&) = delete;
  LogRequestScope& operator=(const LogRequestScope&) = delete;

 private:
  std::string previous_;
};

}  // namespace ltm
