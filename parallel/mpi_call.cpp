#include "parallel/mpi_call.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "parallel/group_abort.h"

namespace ltm::parallel {
namespace {

std::atomic<int> g_thread_level{MPI_THREAD_SERIALIZED};  // until MpiWorld says otherwise: lock
std::mutex g_mpi_mutex;

}  // namespace

void set_mpi_thread_level(int provided) { g_thread_level.store(provided); }
int mpi_thread_level() { return g_thread_level.load(); }

std::unique_lock<std::mutex> lock_mpi() {
  if (g_thread_level.load(std::memory_order_relaxed) >= MPI_THREAD_MULTIPLE) return {};
  return std::unique_lock<std::mutex>(g_mpi_mutex);
}

void fail_mpi(int error_code, std::string_view op, std::string_view group, const char* file,
              int line, std::string_view who) {
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int length = 0;
  if (MPI_Error_string(error_code, text, &length) != MPI_SUCCESS) length = 0;
  const std::string reason =
      length > 0 ? std::string(text, length) : absl::StrCat("MPI error code ", error_code);
  abort_group(kExitMpiFailure,
              absl::StrCat(rank_prefix(), "MPI ", std::string(op), " on group ", std::string(group),
                           " failed: ", reason, std::string(who), " (", file, ":", line, ")"));
}

}  // namespace ltm::parallel
