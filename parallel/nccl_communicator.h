// NcclCommunicator: the Communicator over NCCL, on device buffers (Backend::comm_on_device()).
//
// Creation is collective over the group's host communicator (MPI): its rank 0 makes the
// ncclUniqueId, the host communicator broadcasts it (share_unique_id, parallel/unique_id.h, under
// the collective watchdog), then every rank joins the NCCL communicator on its `device`. The host
// communicator is only used in the constructor and is not owned. It is the device communicator of
// the group (runtime/engine/engine.h, Comms): activations only.
//
// Ordering: operations are enqueued on `stream` (Backend::stream(), the CUDA backend's compute
// stream), so a buffer the backend just wrote is passed in directly, with no host wait before it;
// nullptr means the legacy default stream. all_reduce_sum and recv (the forward pass's
// operations) have no host wait after them either: each returns once the communicator has taken
// the call, and the data is in place in stream order, for the ops enqueued after it. A CUDA event
// recorded after each (a pool, reused) marks it in a list of pending operations
// (PendingDeviceOps, device_wait.h); finished ones are popped as new ones come, and settle() (the
// step's one host wait, before its results are copied back) waits for the rest, each polled under
// the deadline it was enqueued under, so a hung collective is named and aborted as before. While
// the stream is being captured into a CUDA graph (cudaStreamIsCapturing) the call is captured and
// no event is recorded; settle() then also waits for an event recorded at the wait, which covers
// the graphs replayed since. all_gather, broadcast, send and barrier (set-up, not the forward
// pass) still wait on the host until they have completed.
// Point-to-point: NCCL matches send/recv between two ranks in the order they are issued; `tag` is
// not sent, only checked to be non-negative.
// Pipeline sends (post): neither the host nor the compute stream waits for the receiver. The data
// is copied (device to device, on the compute stream) into one of two staging slots (`hidden`
// double-buffered: the caller may overwrite its buffer at once), an event orders a side stream
// after that copy, and ncclSend runs there inside an NCCL group call. A slot is reused once its
// previous send has completed, waited for under the watchdog (so at most two sends are in flight);
// flush() waits for all of them.
//
// Failure, never a hang: the NCCL communicator is non-blocking (ncclConfig_t::blocking = 0), so
// initialisation, enqueueing and completion are all polled (ncclCommGetAsyncError, cudaEventQuery)
// by wait_device (parallel/device_wait.h: the state machine, unit-tested without NCCL) under the
// collective watchdog's deadline (watchdog.h; timeout_s(), default 300 s, shared with the
// MPI communicators through WatchdogOptions / --collective-timeout). An NCCL error prints
//   ltm: <host>:<world rank>: NCCL <op> on group <name> (rank r of n) failed: <error>: <detail> (<file>:<line>)
// a timeout prints the watchdog's "collective <op> on group <name> ... did not finish within T s"
// line; either way the NCCL communicator is aborted (so peers blocked on it fail too) and the
// group is taken down (abort_group).
//
// Threading: one thread calls a given communicator at a time (Communicator's contract); the
// constructor and the destructor are collective too (the destructor finalises the communicator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/device_wait.h"
#include "parallel/watchdog.h"

struct ncclComm;     // ncclComm_t
struct CUstream_st;  // cudaStream_t
struct CUevent_st;   // cudaEvent_t

namespace ltm::parallel {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `host` (the group's MPI communicator), whose name ("tp", "pp") is named in
  // every error message. `stream`: a cudaStream_t (Backend::stream()) or nullptr.
  NcclCommunicator(Communicator& host, int device, void* stream = nullptr,
                   WatchdogOptions options = {});
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
  void post(const void* data, size_t bytes, int dst, int tag) override;
  // Waits for the posted sends and the pending operations.
  void flush() override;
  // Waits (under the watchdog) for every operation enqueued so far; not while capturing.
  void settle() override;
  // Operations waiting in settle()'s list (tests).
  size_t pending() const { return pending_.size(); }

  // The collective timeout of the operations that start from now on; <= 0 disables it.
  void set_timeout(double seconds) { watchdog_.set_timeout(seconds); }
  double timeout_s() const { return watchdog_.timeout_s(); }

  int device() const { return device_; }
  // The CUDA contexts involved, for error messages and nccl_gpu_test's log: the thread's, the
  // communicator's, whether the device's primary context is active, and the stream's.
  std::string context_report() const;

 private:
  // Runs one NCCL call (`result` is what it returned) and waits for it: first until the
  // non-blocking communicator has taken it (ncclInProgress -> ncclSuccess), then until the stream
  // has executed it. Aborts the group on an error or when `deadline` passes.
  void complete(int result, std::string_view op, size_t bytes, Deadline deadline);
  // Runs one NCCL call with no host wait after it: waits until the communicator has taken it,
  // then (outside a capture) records an event after it and lists it as pending.
  void enqueued(int result, std::string op, size_t bytes, Deadline deadline);
  bool capturing() const;
  // An event of the pool, recorded on the stream now; returns its slot.
  int mark();
  // A stream event's state as a poll result (not reached yet: the communicator's async error).
  DevicePoll poll_event(CUevent_st* event);
  // Polls ncclCommGetAsyncError until the communicator is no longer ncclInProgress.
  void wait_ready(std::string_view op, size_t bytes, Deadline deadline);
  // Aborts the communicator (once) and takes the group down with `outcome`'s message.
  [[noreturn]] void fail(const DeviceWaitOutcome& outcome);
  void abort_comm();
  [[noreturn]] void fail_nccl(int result, std::string_view op, const char* file, int line);
  void use_device() const;
  // Puts back context_ as this thread's current CUDA context if an NCCL call left another one
  // current (`after`: the call, named in a one-time warning). See nccl_communicator.cpp.
  void keep_context(std::string_view after) const;

  // One staging slot of post(): a device buffer, the event after the copy into it and the event
  // after its send.
  struct Slot {
    void* buffer = nullptr;
    size_t capacity = 0;
    CUevent_st* copied = nullptr;
    CUevent_st* sent = nullptr;
    bool busy = false;  // a send from it may still run
    std::string op;
    size_t bytes = 0;
    Deadline deadline = Deadline::never();
  };
  // Waits (under the slot's deadline) until the slot's send has completed.
  void wait_sent(Slot& slot);

  ncclComm* comm_ = nullptr;
  CUstream_st* side_ = nullptr;  // post()'s sends
  Slot slots_[2];
  int next_slot_ = 0;
  CUstream_st* stream_ = nullptr;
  CUevent_st* done_ = nullptr;  // recorded after each operation
  PendingDeviceOps pending_;          // enqueued, not seen finished (settle())
  std::vector<CUevent_st*> events_;   // the pool of pending_'s markers
  std::vector<int> free_events_;      // slots of events_ not in pending_
  int64_t captured_ = 0;              // operations captured into CUDA graphs so far
  float* barrier_buf_ = nullptr;  // one device float for barrier()
  void* context_ = nullptr;  // the thread's CUDA context (CUcontext) when built: device_'s primary
  bool primary_held_ = false;  // this communicator holds a reference to device_'s primary context
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  Watchdog watchdog_;
};

}  // namespace ltm::parallel
