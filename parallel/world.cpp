#include "parallel/world.h"

#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "parallel/group_abort.h"
#include "parallel/mpi_call.h"
#include "parallel/partition.h"
#include "parallel/rank_hosts.h"

namespace ltm::parallel {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// A failed LTM_ASSERT in a rank of the group: the group abort, so every rank goes down with this
// one message (host, rank, check) and the in-flight requests are answered UNAVAILABLE.
[[noreturn]] void assert_through_group_abort(const std::string& message) {
  abort_group(kExitInternalError, absl::StrCat(rank_prefix(), message));
}

}  // namespace

MpiWorld::MpiWorld(int* argc, char*** argv, WatchdogOptions options) : options_(options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&thread_level_);
  } else {
    // MPI_Init_thread fails under MPI_ERRORS_ARE_FATAL (the library prints and exits); the check
    // covers libraries that return instead.
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_);
    if (rc != MPI_SUCCESS) fail_mpi(rc, "Init_thread", "world", __FILE__, __LINE__);
    we_initialized_ = true;
  }
  set_mpi_thread_level(thread_level_);
  if (thread_level_ < MPI_THREAD_SERIALIZED) {
    abort_group(kExitMpiFailure,
                absl::StrCat(rank_prefix(), "the MPI library provides only ",
                             thread_level_name(thread_level_),
                             "; ltm needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE"));
  }
  LTM_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_), "Comm_size", "world");
  LTM_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "Comm_rank", "world");
  this_world_rank();  // caches the rank for messages
  ::ltm::detail::assert_handler().store(&assert_through_group_abort);
  MPI_Comm world;
  LTM_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &world), "Comm_dup", "world");
  world_ = std::make_unique<MpiCommunicator>(world, "world", options_);
  if (size_ > 1) {
    // Every rank's host name, for failure messages that name the lost host (rank_hosts.h).
    constexpr size_t kName = 64;
    std::vector<char> names(kName * static_cast<size_t>(size_), '\0');
    this_host().copy(names.data() + kName * static_cast<size_t>(rank_), kName - 1);
    world_->all_gather(names.data() + kName * static_cast<size_t>(rank_), names.data(), kName);
    std::vector<std::string> hosts(size_);
    for (int r = 0; r < size_; ++r) hosts[r] = std::string(names.data() + kName * r);
    set_rank_hosts(std::move(hosts));
  }
  // A launcher (mpirun/orted/slurmstepd) is our parent only when there are peers; a singleton's
  // parent is a shell that may exit legitimately.
  if (size_ > 1) watch_launcher(getppid());
  layout_ = WorldLayout{size_, size_, 1, rank_};
}

MpiWorld::~MpiWorld() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  tp_.reset();
  pp_.reset();
  if (we_initialized_) world_->barrier();  // under the watchdog, unlike MPI_Finalize
  world_.reset();
  if (we_initialized_) {
    auto lock = lock_mpi();
    MPI_Finalize();
  }
}

const std::string& MpiWorld::host() const { return this_host(); }

absl::StatusOr<WorldLayout> MpiWorld::create_groups(int tp, int pp) {
  LTM_ASSERT(!has_groups(), "create_groups called twice");
  LTM_RETURN_IF_ERROR(validate_world(size_, tp, pp));
  const WorldLayout layout{size_, tp, pp, rank_};
  // MPI_Comm_split blocks and has no watchdog: meet in a watched barrier first, so a rank that
  // never gets here is reported instead of hanging the others in the split.
  world_->barrier();
  MPI_Comm tp_comm, pp_comm;
  LTM_MPI(MPI_Comm_split(world_->comm(), layout.pp_rank(), layout.tp_rank(), &tp_comm),
          "Comm_split", "tp");
  LTM_MPI(MPI_Comm_split(world_->comm(), layout.tp_rank(), layout.pp_rank(), &pp_comm),
          "Comm_split", "pp");
  tp_ = std::make_unique<MpiCommunicator>(tp_comm, "tp", options_);
  pp_ = std::make_unique<MpiCommunicator>(pp_comm, "pp", options_);
  tp_->set_timeout(world_->timeout_s());
  pp_->set_timeout(world_->timeout_s());
  LTM_ASSERT(tp_->size() == tp && tp_->rank() == layout.tp_rank(), "tp group ", tp_->rank(), "/",
             tp_->size());
  LTM_ASSERT(pp_->size() == pp && pp_->rank() == layout.pp_rank(), "pp group ", pp_->rank(), "/",
             pp_->size());
  layout_ = layout;
  return layout;
}

void MpiWorld::set_collective_timeout(double seconds) {
  world_->set_timeout(seconds);
  if (tp_) tp_->set_timeout(seconds);
  if (pp_) pp_->set_timeout(seconds);
}

}  // namespace ltm::parallel
