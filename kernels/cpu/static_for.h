// static_for(n, parallel, fn): fn(i) for i in [0, n), split statically over OpenMP's threads when
// `parallel`, else on the calling thread without entering a parallel region. Inside a small
// step's thread team (step_team.h) the split goes to the team's threads instead of a region.
//
// Why not `#pragma omp parallel for if (cond)`: with a false condition libgomp still makes a
// one-thread team and ends it with a futex wake, a system call: 1.1 us each on the Zen 5 VM
// (a loop of empty `if (false)` regions, strace: one futex each), and a one-sequence GPT-2 decode
// step made ~85 of them (the bias, layer norm, GELU and KV-cache writes of one row: see
// docs/benchmarks.md, "One-row regions without a system call").
#pragma once

#include <omp.h>

#include <cstdint>

#include "kernels/cpu/step_team.h"

namespace ltm::kernels::cpu {

// threads: the region's size (0: OpenMP's default).
template <typename Fn>
void static_for(int64_t n, bool parallel, Fn&& fn, int threads = 0) {
  if (!parallel) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (in_step_team()) {
    step_team_static(n, fn);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace ltm::kernels::cpu
