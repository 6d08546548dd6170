// How this process calls MPI: the thread-level lock and the error check every call goes through.
//
// MpiWorld asks for MPI_THREAD_MULTIPLE and records what the library granted here. Under
// MPI_THREAD_MULTIPLE, lock_mpi() returns an empty lock and calls run concurrently. Under
// MPI_THREAD_SERIALIZED it returns a lock on one process-wide mutex, so threads that each own a
// communicator (a step thread, a pipeline send/recv thread) still never call MPI at the same time.
// The lock is held for one call only (one MPI_Test, one MPI_Iallreduce), never across a wait, so a
// thread polling an idle broadcast does not block the others.
//
// LTM_MPI(call, op, group) takes that lock, runs `call` and, when it returns an error (the
// communicators use MPI_ERRORS_RETURN), prints
//   ltm: <host>:<world rank>: MPI <op> on group <group> failed: <MPI error string>[ (peer: rank
//   2 on h1)] (<file>:<line>)
// and takes the group down (abort_group, exit code kExitMpiFailure). It never returns an error.
#pragma once

#include <mpi.h>

#include <mutex>
#include <string_view>

namespace ltm::parallel {

// Records the thread level MPI_Init_thread provided (MpiWorld calls it once).
void set_mpi_thread_level(int provided);
int mpi_thread_level();

// An engaged lock unless the library provides MPI_THREAD_MULTIPLE.
std::unique_lock<std::mutex> lock_mpi();

// The message and abort of a failed MPI call; see the top of this file. `who` (" (peer: rank 2
// on h1)", Watchdog::who) follows the MPI error string when the call waited for one peer.
[[noreturn]] void fail_mpi(int error_code, std::string_view op, std::string_view group,
                           const char* file, int line, std::string_view who = {});

}  // namespace ltm::parallel

#define LTM_MPI(call, op, group)                                                 \
  do {                                                                           \
    int _ltm_mpi_rc;                                                             \
    {                                                                            \
      auto _ltm_mpi_lock = ::ltm::parallel::lock_mpi();                          \
      _ltm_mpi_rc = (call);                                                      \
    }                                                                            \
    if (_ltm_mpi_rc != MPI_SUCCESS) [[unlikely]]                                 \
      ::ltm::parallel::fail_mpi(_ltm_mpi_rc, (op), (group), __FILE__, __LINE__); \
  } while (0)
