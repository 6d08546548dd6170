#include "parallel/group_abort.h"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ltm::parallel {
namespace {

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Ends the process after the grace period, whatever MPI_Abort is doing by then.
void start_enforcer(int exit_code) {
  try {
    std::thread([exit_code] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceSeconds));
      std::fprintf(stderr, "%sMPI_Abort did not end the process within %g s; exiting with %d\n",
                   rank_prefix().c_str(), kAbortGraceSeconds, exit_code);
      std::fflush(stderr);
      _exit(exit_code);
    }).detach();
  } catch (...) {
    alarm(static_cast<unsigned>(kAbortGraceSeconds));  // no thread: SIGALRM's default kills us
  }
}

}  // namespace

const std::string& this_host() {
  static const std::string host = [] {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) return std::string("unknown-host");
    return std::string(name);
  }();
  return host;
}

int this_world_rank() {
  static std::atomic<int> cached{-1};
  int rank = cached.load(std::memory_order_relaxed);
  if (rank >= 0) return rank;
  if (!mpi_usable()) return -1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) return -1;
  cached.store(rank, std::memory_order_relaxed);
  return rank;
}

std::string rank_prefix() {
  return absl::StrCat("ltm: ", this_host(), ":", this_world_rank(), ": ");
}

namespace {
std::function<void(std::string_view)>& abort_hook() {
  static std::function<void(std::string_view)> hook;
  return hook;
}
}  // namespace

void set_abort_hook(std::function<void(std::string_view message)> hook) {
  abort_hook() = std::move(hook);
}

void abort_group(int exit_code, std::string_view message) {
  static std::atomic<bool> aborting{false};
  std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  if (aborting.exchange(true)) {
    for (;;) pause();  // another thread is already taking the group down
  }
  start_enforcer(exit_code);
  if (abort_hook()) abort_hook()(message);
  if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  _exit(exit_code);
}

}  // namespace ltm::parallel
