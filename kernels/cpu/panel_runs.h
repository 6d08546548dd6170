// The decode's (one row of A) walk over `panels` column panels (packed_gemm.cpp, int8_gemm.cpp;
// baseline translation units only, see isa_kernels.h): runs of consecutive panels that the
// threads take as they free up (schedule(dynamic)): runs of 4 (gemv_panels' 4 streams a core)
// while more than 4 panels a thread remain, then runs of 2 while more than one a thread, then
// single panels, so that the threads finish together even when one of them gets less of the
// memory bandwidth for a while.
#pragma once

#include <cstdint>

#include "kernels/cpu/step_team.h"

namespace ltm::kernels::cpu {

struct PanelRuns {
  int64_t quads, pairs, singles;
  int64_t count() const { return quads + pairs + singles; }
  // Run i: its first panel and how many.
  void run(int64_t i, int64_t* first, int* n) const {
    if (i < quads) {
      *first = 4 * i, *n = 4;
    } else if (i < quads + pairs) {
      *first = 4 * quads + 2 * (i - quads), *n = 2;
    } else {
      *first = 4 * quads + 2 * pairs + (i - quads - pairs), *n = 1;
    }
  }
};

PanelRuns panel_runs(int64_t panels, int threads);

// fn(first panel, panels) for every run, on `threads` threads.
template <typename Fn>
void for_each_panel_run(int64_t panels, int threads, Fn fn) {
  if (in_step_team()) {  // a small step's team (step_team.h): the same runs, no region
    const PanelRuns runs = panel_runs(panels, step_team_size());
    step_team_for(runs.count(), [&](int64_t i) {
      int64_t first;
      int n;
      runs.run(i, &first, &n);
      fn(first, n);
    });
    return;
  }
  const PanelRuns runs = panel_runs(panels, threads);
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (int64_t i = 0; i < runs.count(); ++i) {
    int64_t first;
    int n;
    runs.run(i, &first, &n);
    fn(first, n);
  }
}

}  // namespace ltm::kernels::cpu
