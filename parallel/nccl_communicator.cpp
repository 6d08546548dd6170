#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "parallel/group_abort.h"
#include "parallel/mpi_call.h"

namespace ltm::parallel {
namespace {

// A CUDA runtime failure inside the communicator: same tier as an NCCL one.
[[noreturn]] void fail_cuda(cudaError_t e, std::string_view op, std::string_view group,
                            const char* file, int line) {
  abort_group(kExitMpiFailure,
              absl::StrCat(rank_prefix(), "CUDA error ", cudaGetErrorName(e), " in ", std::string(op),
                           " on group ", std::string(group), ": ", cudaGetErrorString(e), " (", file, ":",
                           line, ")"));
}

#define LTM_NCCL_CUDA(expr, op)                                               \
  do {                                                                        \
    const cudaError_t _ltm_e = (expr);                                        \
    if (_ltm_e != cudaSuccess) [[unlikely]]                                   \
      fail_cuda(_ltm_e, (op), watchdog_.group(), __FILE__, __LINE__);         \
  } while (0)

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm mpi_comm, std::string name, int device,
                                   CUstream_st* stream, WatchdogOptions options)
    : stream_(stream), device_(device), watchdog_(std::move(name), options) {
  LTM_ASSERT(mpi_comm != MPI_COMM_NULL, "communicator ", watchdog_.group(), " is MPI_COMM_NULL");
  LTM_MPI(MPI_Comm_rank(mpi_comm, &rank_), "Comm_rank", this->name());
  LTM_MPI(MPI_Comm_size(mpi_comm, &size_), "Comm_size", this->name());

  // The unique id travels over MPI, under the same deadline as any collective.
  ncclUniqueId id{};
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail_nccl(r, "GetUniqueId", __FILE__, __LINE__);
  }
  MPI_Request request;
  LTM_MPI(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, mpi_comm, &request), "broadcast(ncclUniqueId)",
          this->name());
  watchdog_.wait(&request, "broadcast(ncclUniqueId)", sizeof(id), watchdog_.deadline());

  use_device();
  LTM_NCCL_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "init");
  LTM_NCCL_CUDA(cudaMalloc(&barrier_buf_, sizeof(float)), "init");
  LTM_NCCL_CUDA(cudaMemset(barrier_buf_, 0, sizeof(float)), "init");

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every NCCL call returns at once; we poll under the deadline
  const std::string op = absl::StrCat("init(", size_, " ranks, device ", device_, ")");
  const Deadline deadline = watchdog_.deadline();
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  comm_ = comm;
  if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, op, __FILE__, __LINE__);
  wait_ready(op, 0, deadline);
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    use_device();
    // Finalize flushes outstanding work and may wait for peers: bounded like any collective.
    const Deadline deadline = watchdog_.deadline();
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, "finalize", __FILE__, __LINE__);
    wait_ready("finalize", 0, deadline);
    ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
  if (done_ != nullptr) cudaEventDestroy(done_);
}

void NcclCommunicator::use_device() const {
  int current = -1;
  LTM_NCCL_CUDA(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device_) LTM_NCCL_CUDA(cudaSetDevice(device_), "cudaSetDevice");
}

void NcclCommunicator::fail_nccl(int result, std::string_view op, const char* file, int line) {
  const char* detail = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
  const std::string message = absl::StrCat(
      rank_prefix(), "NCCL ", std::string(op), " on group ", name(), " (rank ", rank_, " of ", size_,
      ") failed: ", ncclGetErrorString(static_cast<ncclResult_t>(result)),
      detail && *detail ? ": " : "", detail ? detail : "", " (", file, ":", line, ")");
  // Abort our side of the communicator so that peers blocked in it fail instead of hanging.
  if (comm_ != nullptr) ncclCommAbort(comm_);
  abort_group(kExitMpiFailure, message);
}

void NcclCommunicator::fail_timeout(std::string_view op, size_t bytes, Deadline deadline) {
  const std::string message = watchdog_.timeout_message(op, bytes, deadline.seconds());
  if (comm_ != nullptr) ncclCommAbort(comm_);
  abort_group(kExitCollectiveTimeout, message);
}

void NcclCommunicator::fail_launcher_gone(std::string_view op) {
  const std::string message =
      absl::StrCat(rank_prefix(), "the launcher (mpirun/srun) exited while this rank waited in ",
                   std::string(op), " on group ", name(), "; aborting the group");
  if (comm_ != nullptr) ncclCommAbort(comm_);
  abort_group(kExitLauncherGone, message);
}

void NcclCommunicator::wait_ready(std::string_view op, size_t bytes, Deadline deadline) {
  const PollResult result = poll_until(
      [&] {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) fail_nccl(r, op, __FILE__, __LINE__);
        if (state == ncclInProgress) return false;
        if (state != ncclSuccess) fail_nccl(state, op, __FILE__, __LINE__);
        return true;
      },
      deadline, watchdog_.options());
  if (result == PollResult::kTimedOut) fail_timeout(op, bytes, deadline);
  if (result == PollResult::kLauncherGone) fail_launcher_gone(op);
}

void NcclCommunicator::complete(int result, std::string_view op, size_t bytes,
                                Deadline deadline) {
  if (result != ncclSuccess && result != ncclInProgress) fail_nccl(result, op, __FILE__, __LINE__);
  wait_ready(op, bytes, deadline);  // enqueued
  LTM_NCCL_CUDA(cudaEventRecord(done_, stream_), op);
  const PollResult poll = poll_until(
      [&] {
        const cudaError_t e = cudaEventQuery(done_);
        if (e == cudaSuccess) return true;
        if (e != cudaErrorNotReady) fail_cuda(e, op, name(), __FILE__, __LINE__);
        // A peer's failure shows up here while our kernel waits for it.
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) fail_nccl(r, op, __FILE__, __LINE__);
        if (state != ncclSuccess && state != ncclInProgress)
          fail_nccl(state, op, __FILE__, __LINE__);
        return false;
      },
      deadline, watchdog_.options());
  if (poll == PollResult::kTimedOut) fail_timeout(op, bytes, deadline);
  if (poll == PollResult::kLauncherGone) fail_launcher_gone(op);
}

void NcclCommunicator::all_reduce_sum(float* data, size_t count) {
  if (count == 0 || size_ == 1) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  complete(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_),
           "all_reduce_sum", count * sizeof(float), deadline);
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  if (bytes_per_rank == 0) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  if (size_ == 1) {
    if (send != recv)
      LTM_NCCL_CUDA(cudaMemcpyAsync(recv, send, bytes_per_rank, cudaMemcpyDeviceToDevice, stream_),
                    "all_gather");
    LTM_NCCL_CUDA(cudaStreamSynchronize(stream_), "all_gather");
    return;
  }
  complete(ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream_), "all_gather",
           bytes_per_rank * static_cast<size_t>(size_), deadline);
}

void NcclCommunicator::broadcast(void* data, size_t bytes, int root) {
  LTM_ASSERT(root >= 0 && root < size_, "broadcast root ", root, " on group ", name(), " of ",
             size_);
  if (bytes == 0 || size_ == 1) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  complete(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_),
           absl::StrCat("broadcast(root=", root, ")"), bytes, deadline);
}

void NcclCommunicator::send(const void* data, size_t bytes, int dst, int tag) {
  LTM_ASSERT(dst >= 0 && dst < size_ && dst != rank_, "send to rank ", dst, " on group ", name(),
             " of ", size_, " from rank ", rank_);
  LTM_ASSERT(tag >= 0, "send tag ", tag);
  if (bytes == 0) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  complete(ncclSend(data, bytes, ncclUint8, dst, comm_, stream_),
           absl::StrCat("send(dst=", dst, ",tag=", tag, ")"), bytes, deadline);
}

void NcclCommunicator::recv(void* data, size_t bytes, int src, int tag) {
  LTM_ASSERT(src >= 0 && src < size_ && src != rank_, "recv from rank ", src, " on group ",
             name(), " of ", size_, " at rank ", rank_);
  LTM_ASSERT(tag >= 0, "recv tag ", tag);
  if (bytes == 0) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  complete(ncclRecv(data, bytes, ncclUint8, src, comm_, stream_),
           absl::StrCat("recv(src=", src, ",tag=", tag, ")"), bytes, deadline);
}

void NcclCommunicator::barrier() {
  if (size_ == 1) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  complete(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_),
           "barrier", sizeof(float), deadline);
}

}  // namespace ltm::parallel
