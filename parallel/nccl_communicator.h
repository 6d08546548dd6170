// NcclCommunicator: the Communicator over NCCL, on device buffers (Backend::comm_on_device()).
//
// Creation is collective over an MPI communicator: rank 0 makes the ncclUniqueId, MPI broadcasts
// it (under the collective watchdog), then every rank joins the NCCL communicator on its `device`.
// The MPI communicator is only used in the constructor and is not owned.
//
// Ordering: operations are enqueued on `stream`; nullptr means the legacy default stream, which
// is ordered both ways with every blocking stream of the device, the CUDA backend's included, so
// a buffer the backend just wrote can be passed in directly. Each operation then waits on the host
// until it has completed (as MpiCommunicator does): when a call returns, the data is in place.
// Point-to-point: NCCL matches send/recv between two ranks in the order they are issued; `tag` is
// not sent, only checked to be non-negative.
//
// Failure, never a hang: the NCCL communicator is non-blocking (ncclConfig_t::blocking = 0), so
// initialisation, enqueueing and completion are all polled (ncclCommGetAsyncError, cudaEventQuery)
// under the collective watchdog's deadline (watchdog.h; timeout_s(), default 300 s, shared with the
// MPI communicators through WatchdogOptions / --collective-timeout). An NCCL error prints
//   ltm: <host>:<world rank>: NCCL <op> on group <name> (rank r of n) failed: <error>: <detail> (<file>:<line>)
// a timeout prints the watchdog's "collective <op> on group <name> ... did not finish within T s"
// line; either way the NCCL communicator is aborted (so peers blocked on it fail too) and the
// group is taken down (abort_group).
//
// Threading: one thread calls a given communicator at a time (Communicator's contract); the
// constructor and the destructor are collective too (the destructor finalises the communicator).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "parallel/communicator.h"
#include "parallel/watchdog.h"

struct ncclComm;     // ncclComm_t
struct CUstream_st;  // cudaStream_t
struct CUevent_st;   // cudaEvent_t

namespace ltm::parallel {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `mpi_comm`. `name` ("tp", "pp", "world") is named in every error message.
  NcclCommunicator(MPI_Comm mpi_comm, std::string name, int device,
                   CUstream_st* stream = nullptr, WatchdogOptions options = {});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return watchdog_.group(); }

  // All buffers are device memory of `device`.
  void all_reduce_sum(float* data, size_t count) override;
  // In place is allowed: send == recv + rank() * bytes_per_rank.
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void send(const void* data, size_t bytes, int dst, int tag) override;
  void recv(void* data, size_t bytes, int src, int tag) override;
  void barrier() override;

  // The collective timeout of the operations that start from now on; <= 0 disables it.
  void set_timeout(double seconds) { watchdog_.set_timeout(seconds); }
  double timeout_s() const { return watchdog_.timeout_s(); }

  int device() const { return device_; }

 private:
  // Runs one NCCL call (`result` is what it returned) and waits for it: first until the
  // non-blocking communicator has taken it (ncclInProgress -> ncclSuccess), then until the stream
  // has executed it. Aborts the group on an error or when `deadline` passes.
  void complete(int result, std::string_view op, size_t bytes, Deadline deadline);
  // Polls ncclCommGetAsyncError until the communicator is no longer ncclInProgress.
  void wait_ready(std::string_view op, size_t bytes, Deadline deadline);
  [[noreturn]] void fail_nccl(int result, std::string_view op, const char* file, int line);
  [[noreturn]] void fail_timeout(std::string_view op, size_t bytes, Deadline deadline);
  [[noreturn]] void fail_launcher_gone(std::string_view op);
  void use_device() const;

  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  CUevent_st* done_ = nullptr;  // recorded after each operation
  float* barrier_buf_ = nullptr;  // one device float for barrier()
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  Watchdog watchdog_;
};

}  // namespace ltm::parallel
