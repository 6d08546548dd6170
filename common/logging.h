// Where log lines go: stderr, in every executable. stdout is the programs' output (generated
// text, --output json, ltm-bench's JSON lines), which a log line on it would corrupt; spdlog's
// default logger writes to stdout.
#pragma once

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace ltm {

inline void log_to_stderr() {
  if (spdlog::get("ltm") == nullptr) spdlog::set_default_logger(spdlog::stderr_color_mt("ltm"));
}

}  // namespace ltm
