#pragma once
// How long the kernels' idle OpenMP threads spin before they sleep.
//
// The CPU kernels run on libgomp's persistent thread team. Between parallel regions its waiting
// threads spin GOMP_SPINCOUNT times (300,000 pause loops by default: milliseconds on current
// Xeons) before they sleep on a futex. On a host where the cores are shared, with other ranks,
// rank 0's gRPC threads or anything else, a spinning thread holds a core that the thread with
// work needs, and a team whose member was descheduled stalls at its barrier: measured on this
// 2-core VM while other processes were busy, one-sequence decode ran at 1.5-3 tokens/s with the
// default against 18-21 with passive waiting (docs/benchmarks.md, "Threads"). We keep
// the team (starting threads per kernel would cost more) and bound the spin instead.
//
// libgomp reads its environment once, in its load-time constructor, before main() runs, so the
// only way for a program to choose the policy for itself is to set the variable and exec itself
// again, before it starts any thread or MPI. bound_openmp_spin() does that, first thing in main()
// of every binary that runs kernels, unless the user chose already (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT set: theirs is kept) or LTM_OMP_SPIN=keep asks for libgomp's default.
// LTM_OMP_SPIN=N sets the spin count. The process keeps its pid, arguments and environment, so
// mpirun, srun and PMIx see the same rank.

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace ltm {

// Spins before sleeping: each is one pause loop in libgomp, so a few microseconds to a few tens
// of microseconds in all, enough to cover the gap between back-to-back kernels of one layer and
// short enough that a waiting thread gives its core away between steps.
inline constexpr const char* kDefaultOpenMpSpin = "2000";

// The spin count the team runs with (what GOMP_SPINCOUNT says; "passive" under
// OMP_WAIT_POLICY=passive, "default" when neither is set).
inline std::string openmp_spin_setting() {
  if (const char* s = std::getenv("GOMP_SPINCOUNT")) return s;
  if (const char* p = std::getenv("OMP_WAIT_POLICY")) return std::string("OMP_WAIT_POLICY=") + p;
  return "default";
}

// See above. Returns only when no exec was needed (or exec failed: then libgomp's default holds).
inline void bound_openmp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  const char* want = std::getenv("LTM_OMP_SPIN");
  if (want != nullptr && std::strcmp(want, "keep") == 0) return;
  const char* spin = want != nullptr && *want != '\0' ? want : kDefaultOpenMpSpin;
  for (const char* c = spin; *c; ++c) {
    if (*c < '0' || *c > '9') return;  // not a count: leave libgomp alone
  }
  // Exec the binary by its real path, not /proc/self/exe: the kernel names the process after
  // the file exec'd (/proc/PID/comm), and ps, pgrep and job scripts look for "ltm-worker".
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0 || n >= static_cast<ssize_t>(sizeof(self) - 1)) return;
  self[n] = '\0';
  if (::setenv("GOMP_SPINCOUNT", spin, 1) != 0) return;
  ::execv(self, argv);
  ::unsetenv("GOMP_SPINCOUNT");  // exec failed: carry on as we are
}

}  // namespace ltm
