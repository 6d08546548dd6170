// The world of ranks: where this rank sits (WorldLayout) and the MPI process state (MpiWorld).
//
// Layout (docs/architecture.md "Ranks and slices"):
//   world_size = tp * pp;   rank = pp_rank * tp + tp_rank
// A TP group is the tp contiguous ranks of one pipeline stage (keep it inside a node); a PP group
// is the pp ranks with the same tp_rank, one per stage.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "parallel/mpi_communicator.h"
#include "parallel/watchdog.h"

namespace ltm::parallel {

// Pure arithmetic of one rank's place; no MPI.
struct WorldLayout {
  int world_size = 1;
  int tp = 1;
  int pp = 1;
  int rank = 0;

  int tp_rank() const { return rank % tp; }
  int pp_rank() const { return rank / tp; }
  int rank_of(int pp_rank, int tp_rank) const { return pp_rank * tp + tp_rank; }
  bool is_first_stage() const { return pp_rank() == 0; }
  bool is_last_stage() const { return pp_rank() == pp - 1; }
  // World ranks of this rank's pipeline neighbours (same tp_rank); only valid off the ends.
  int prev_stage_rank() const { return rank_of(pp_rank() - 1, tp_rank()); }
  int next_stage_rank() const { return rank_of(pp_rank() + 1, tp_rank()); }
};

// MPI for the life of the process: initializes MPI in the constructor, finalizes in the
// destructor, and owns the communicators of the three groups.
//
// Thread level: asks for MPI_THREAD_MULTIPLE, because the runtime may drive different
// communicators from different threads (TP all-reduces on the step thread while a pipeline thread
// sends the previous micro-batch's activations), and the abort path may run on any thread. Open
// MPI 4.1 as built by Debian grants it. If a library grants only MPI_THREAD_SERIALIZED, that is
// enough too: every MPI call then takes one process-wide lock (mpi_call.h), held per call, never
// across a wait. A library that grants less (FUNNELED or SINGLE) is refused at start-up.
//
// Without mpirun: a process started alone (./ltm-worker) initializes as a singleton, a world of one
// (Open MPI starts its own helper daemon for that). Every group is then a group of one.
//
// Failure: MPI errors here take the group down like any other (mpi_call.h); a tp x pp that does not
// match the world size is a user error, returned as a Status by create_groups.
// Threading: construct and destroy on the main thread; construct once per process.
class MpiWorld {
 public:
  // MPI_Init_thread(argc, argv) (argc/argv may be null). If MPI is already initialized, uses it and
  // leaves finalizing to whoever initialized it. Creates world() (a duplicate of MPI_COMM_WORLD).
  MpiWorld(int* argc, char*** argv, WatchdogOptions options = {});
  // Frees the communicators, then MPI_Finalize after a barrier under the watchdog (MPI_Finalize
  // waits for every rank; a rank that never arrives must not hang the others' exit).
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int size() const { return size_; }
  int rank() const { return rank_; }
  const std::string& host() const;
  int thread_level() const { return thread_level_; }  // MPI_THREAD_MULTIPLE or _SERIALIZED

  // Splits the world into TP and PP groups (MPI_Comm_split, collective over the world).
  // InvalidArgument unless tp >= 1, pp >= 1 and size() == tp * pp. Call once.
  absl::StatusOr<WorldLayout> create_groups(int tp, int pp);
  bool has_groups() const { return tp_ != nullptr; }
  const WorldLayout& layout() const { return layout_; }  // valid after create_groups

  MpiCommunicator& world() { return *world_; }
  MpiCommunicator& tp() { return *tp_; }  // after create_groups
  MpiCommunicator& pp() { return *pp_; }  // after create_groups

  // Sets the collective timeout of all three communicators (--collective-timeout).
  void set_collective_timeout(double seconds);

 private:
  WatchdogOptions options_;
  bool we_initialized_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  int size_ = 1;
  int rank_ = 0;
  WorldLayout layout_;
  std::unique_ptr<MpiCommunicator> world_;
  std::unique_ptr<MpiCommunicator> tp_;
  std::unique_ptr<MpiCommunicator> pp_;
};

}  // namespace ltm::parallel
