// Progress of loading the weights, for people watching a large checkpoint load.
//
// make_progress_source(inner, ...) wraps a WeightSource and counts the elements read. On a
// terminal (stderr_is_terminal(): isatty, NO_COLOR unset, TERM not dumb) it redraws one status
// line at most 10 times a second:
//   loading weights: 1.20 / 2.60 GiB (46%), 410.3 MiB/s, 3.5 s left
// and ends it with the totals; elsewhere (a file, a pipe, a job log) it writes nothing while
// loading and one log line at the end, so that each stage of start-up is one line there.
// `total_elements` is what the rank is expected to read (a little more than it reads when the
// vocabulary is padded for tensor parallelism; the display is clamped to 100%), `element_bytes`
// the checkpoint's element size (the bytes shown are bytes of the file). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/model/weight_source.h"

namespace ltm {

class ProgressSource : public WeightSource {
 public:
  // Ends the terminal line and logs "loaded weights: ..." (once; call it when the load worked).
  virtual void finish() = 0;
};

std::unique_ptr<ProgressSource> make_progress_source(std::unique_ptr<WeightSource> inner,
                                                     uint64_t total_elements, int element_bytes,
                                                     bool terminal);

// "1.20 GiB", "410.3 MiB", "12.0 KiB", "100 B".
std::string human_bytes(double bytes);

}  // namespace ltm
