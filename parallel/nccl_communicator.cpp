#include "parallel/nccl_communicator.h"

#include <cuda.h>  // CUcontext, CUresult only: the driver is reached through the runtime
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "parallel/group_abort.h"
#include "parallel/unique_id.h"

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

// Errors that say a context is gone or not the thread's: the message names the contexts.
bool context_error(cudaError_t e) {
  return e == cudaErrorContextIsDestroyed || e == cudaErrorInvalidResourceHandle ||
         e == cudaErrorDeviceUninitialized;
}

#define LTM_NCCL_CUDA(expr, op)                                                 \
  do {                                                                          \
    const cudaError_t _ltm_e = (expr);                                          \
    if (_ltm_e != cudaSuccess) [[unlikely]]                                     \
      fail_cuda(_ltm_e,                                                         \
                context_error(_ltm_e)                                           \
                    ? absl::StrCat(std::string(op), " (", context_report(), ")") \
                    : std::string(op),                                          \
                watchdog_.group(), __FILE__, __LINE__);                         \
  } while (0)

// The thread's current CUDA context. On an H100 with NCCL 2.28.9 (2026-12-06, nccl_gpu_test) the
// first collective on a communicator built on a created stream was followed by
// cudaErrorContextIsDestroyed from the next runtime call on that stream, where the legacy
// stream worked; NCCL is known to leave another driver context current on the calling thread
// after its init and operations (NVIDIA/nccl issues 1736 and 2231). So the communicator notes
// the context current when it is built (the device's primary context, which the runtime uses)
// and, in wait_ready (which follows every NCCL call), puts it back where a call changed it, with
// a warning the first time. Not yet
// run on a GPU: the next device run's nccl_gpu_test says whether this was the cause. The
// driver's two functions come through the runtime's entry-point lookup, so nothing links
// libcuda.
//
// A second hypothesis fits the same run: the device's primary context released to no reference
// during NCCL's initialisation (so destroyed: the runtime then makes a new one for the legacy
// stream and for new allocations, which is why the legacy-stream test passed, while a stream or
// event made before belongs to the old one). So the communicator also holds a reference of its
// own to the primary context for its lifetime (cuDevicePrimaryCtxRetain; the runtime holds
// another), and a failing CUDA call on its stream names all the contexts (context_report): the
// next device run tells the two apart.
struct DriverContext {
  CUresult (*get)(CUcontext*) = nullptr;
  CUresult (*set)(CUcontext) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*primary_release)(CUdevice) = nullptr;
  CUresult (*primary_state)(CUdevice, unsigned*, int*) = nullptr;
  CUresult (*stream_context)(CUstream, CUcontext*) = nullptr;
};

void* driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? fn : nullptr;
}

const DriverContext& driver_context() {
  static const DriverContext d = [] {
    DriverContext out;
    out.get = reinterpret_cast<CUresult (*)(CUcontext*)>(driver_entry("cuCtxGetCurrent"));
    out.set = reinterpret_cast<CUresult (*)(CUcontext)>(driver_entry("cuCtxSetCurrent"));
    out.device_get = reinterpret_cast<CUresult (*)(CUdevice*, int)>(driver_entry("cuDeviceGet"));
    out.primary_retain = reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(
        driver_entry("cuDevicePrimaryCtxRetain"));
    out.primary_release =
        reinterpret_cast<CUresult (*)(CUdevice)>(driver_entry("cuDevicePrimaryCtxRelease"));
    out.primary_state = reinterpret_cast<CUresult (*)(CUdevice, unsigned*, int*)>(
        driver_entry("cuDevicePrimaryCtxGetState"));
    out.stream_context = reinterpret_cast<CUresult (*)(CUstream, CUcontext*)>(
        driver_entry("cuStreamGetCtx"));
    return out;
  }();
  return d;
}

void* current_context() {
  CUcontext c = nullptr;
  const DriverContext& d = driver_context();
  return d.get != nullptr && d.get(&c) == CUDA_SUCCESS ? static_cast<void*>(c) : nullptr;
}

// The driver's handle of CUDA device `ordinal`, or -1.
CUdevice driver_device(int ordinal) {
  CUdevice dev = -1;
  const DriverContext& d = driver_context();
  return d.device_get != nullptr && d.device_get(&dev, ordinal) == CUDA_SUCCESS ? dev : -1;
}

}  // namespace

std::string NcclCommunicator::context_report() const {
  const DriverContext& d = driver_context();
  std::string primary = "unknown";
  unsigned flags = 0;
  int active = 0;
  const CUdevice dev = driver_device(device_);
  if (dev >= 0 && d.primary_state != nullptr &&
      d.primary_state(dev, &flags, &active) == CUDA_SUCCESS)
    primary = active ? "active" : "inactive (released or reset)";
  std::string stream = "the legacy stream";
  if (stream_ != nullptr) {
    CUcontext c = nullptr;
    const CUresult r = d.stream_context != nullptr
                           ? d.stream_context(reinterpret_cast<CUstream>(stream_), &c)
                           : CUDA_ERROR_NOT_SUPPORTED;
    char buf[64];
    if (r == CUDA_SUCCESS) std::snprintf(buf, sizeof(buf), "%p", static_cast<void*>(c));
    else std::snprintf(buf, sizeof(buf), "unknown (cuStreamGetCtx error %d)", static_cast<int>(r));
    stream = buf;
  }
  char out[320];
  std::snprintf(out, sizeof(out),
                "thread's CUDA context %p, the communicator's %p, device %d's primary context "
                "%s%s, the stream's context %s",
                current_context(), context_, device_, primary.c_str(),
                primary_held_ ? " (the communicator holds a reference)" : "", stream.c_str());
  return out;
}

void NcclCommunicator::keep_context(std::string_view after) const {
  const DriverContext& d = driver_context();
  if (context_ == nullptr || d.set == nullptr) return;
  void* const now = current_context();
  if (now == context_) return;
  d.set(static_cast<CUcontext>(context_));
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fputs(absl::StrCat(rank_prefix(), "NCCL left another CUDA context current on this thread ",
                            "after ", std::string(after), " on group ", name(), " (device ",
                            device_, "); the communicator's was put back\n")
                   .c_str(),
               stderr);
}

NcclCommunicator::NcclCommunicator(Communicator& host, int device, void* stream,
                                   WatchdogOptions options)
    : stream_(static_cast<cudaStream_t>(stream)),
      device_(device),
      rank_(host.rank()),
      size_(host.size()),
      watchdog_(host.name(), options) {
  // The unique id travels over the host communicator, under the same deadline as any collective.
  ncclUniqueId id{};
  share_unique_id(host, &id, sizeof(id), [&](void* out) {
    const ncclResult_t r = ncclGetUniqueId(static_cast<ncclUniqueId*>(out));
    if (r != ncclSuccess) fail_nccl(r, "GetUniqueId", __FILE__, __LINE__);
  });

  use_device();
  LTM_NCCL_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "init");
  context_ = current_context();  // the runtime's (primary) context, now that a call made it
  {
    const DriverContext& d = driver_context();
    const CUdevice dev = driver_device(device_);
    CUcontext primary = nullptr;
    primary_held_ = dev >= 0 && d.primary_retain != nullptr &&
                    d.primary_retain(&primary, dev) == CUDA_SUCCESS;
  }
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
    flush();
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
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (Slot& slot : slots_) {
    if (slot.buffer != nullptr) cudaFree(slot.buffer);
    if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
    if (slot.sent != nullptr) cudaEventDestroy(slot.sent);
  }
  if (side_ != nullptr) cudaStreamDestroy(side_);
  if (primary_held_) {
    const CUdevice dev = driver_device(device_);
    if (dev >= 0 && driver_context().primary_release != nullptr)
      driver_context().primary_release(dev);
  }
}

void NcclCommunicator::use_device() const {
  int current = -1;
  LTM_NCCL_CUDA(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device_) LTM_NCCL_CUDA(cudaSetDevice(device_), "cudaSetDevice");
}

void NcclCommunicator::abort_comm() {
  if (comm_ == nullptr) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclCommunicator::fail_nccl(int result, std::string_view op, const char* file, int line) {
  const char* detail = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
  const std::string message = absl::StrCat(
      rank_prefix(), "NCCL ", std::string(op), " on group ", name(), " (rank ", rank_, " of ", size_,
      ") failed: ", ncclGetErrorString(static_cast<ncclResult_t>(result)),
      detail && *detail ? ": " : "", detail ? detail : "", " (", file, ":", line, ")");
  // Abort our side of the communicator so that peers blocked in it fail instead of hanging.
  abort_comm();
  abort_group(kExitMpiFailure, message);
}

void NcclCommunicator::fail(const DeviceWaitOutcome& outcome) {
  abort_comm();  // wait_device has aborted it already; nullptr now
  abort_group(outcome.exit_code, outcome.message);
}

namespace {

// The communicator's asynchronous state as a poll result: an error carries NCCL's own words.
DevicePoll poll_async_error(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  if (r != ncclSuccess) state = r;
  if (state == ncclInProgress) return {DevicePoll::kInProgress, ""};
  if (state == ncclSuccess) return {DevicePoll::kDone, ""};
  const char* detail = ncclGetLastError(comm);
  return {DevicePoll::kError, absl::StrCat(ncclGetErrorString(state),
                                           detail && *detail ? ": " : "", detail ? detail : "")};
}

}  // namespace

void NcclCommunicator::wait_ready(std::string_view op, size_t bytes, Deadline deadline) {
  const DeviceWaitOutcome outcome = wait_device(
      [&] { return poll_async_error(comm_); }, [&] { abort_comm(); }, watchdog_, "NCCL", op,
      bytes, deadline, rank_, size_);
  keep_context(op);  // every NCCL call is followed by this wait before any CUDA runtime call
  if (!outcome.ok()) fail(outcome);
}

DevicePoll NcclCommunicator::poll_event(cudaEvent_t event) {
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaSuccess) return {DevicePoll::kDone, ""};
  if (e != cudaErrorNotReady)
    return {DevicePoll::kError,
            absl::StrCat("CUDA ", cudaGetErrorName(e), ": ", cudaGetErrorString(e))};
  // A peer's failure shows up here while our kernel waits for it.
  DevicePoll p = poll_async_error(comm_);
  if (p.state == DevicePoll::kDone) p.state = DevicePoll::kInProgress;
  return p;
}

void NcclCommunicator::complete(int result, std::string_view op, size_t bytes,
                                Deadline deadline) {
  if (result != ncclSuccess && result != ncclInProgress) fail_nccl(result, op, __FILE__, __LINE__);
  wait_ready(op, bytes, deadline);  // enqueued
  LTM_NCCL_CUDA(cudaEventRecord(done_, stream_), op);
  const DeviceWaitOutcome outcome =
      wait_device([&] { return poll_event(done_); }, [&] { abort_comm(); }, watchdog_, "NCCL", op,
                  bytes, deadline, rank_, size_);
  if (!outcome.ok()) fail(outcome);
}

bool NcclCommunicator::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream_, &status);
  if (e != cudaSuccess) [[unlikely]] {
    // Where the H100 run failed (benchmarks.md, "The first device run"): say which contexts.
    fail_cuda(e, absl::StrCat("cudaStreamIsCapturing (", context_report(), ")"), watchdog_.group(),
              __FILE__, __LINE__);
  }
  LTM_ASSERT(status != cudaStreamCaptureStatusInvalidated,
             "the CUDA graph capture on NCCL group ", name(), "'s stream was invalidated");
  return status == cudaStreamCaptureStatusActive;
}

int NcclCommunicator::mark() {
  if (free_events_.empty()) {
    cudaEvent_t e = nullptr;
    LTM_NCCL_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    events_.push_back(e);
    free_events_.push_back(static_cast<int>(events_.size()) - 1);
  }
  const int slot = free_events_.back();
  free_events_.pop_back();
  LTM_NCCL_CUDA(cudaEventRecord(events_[slot], stream_), "cudaEventRecord");
  return slot;
}

void NcclCommunicator::enqueued(int result, std::string op, size_t bytes, Deadline deadline) {
  if (result != ncclSuccess && result != ncclInProgress) fail_nccl(result, op, __FILE__, __LINE__);
  wait_ready(op, bytes, deadline);  // taken by the communicator; the stream runs it later
  if (capturing()) {  // a node of the graph: it runs at each replay (settle() covers those)
    ++captured_;
    return;
  }
  auto poll = [&](int slot) { return poll_event(events_[slot]); };
  auto release = [&](int slot) { free_events_.push_back(slot); };
  // The finished ones first, so the list stays as long as what the device has not reached.
  DeviceWaitOutcome outcome =
      pending_.reap(poll, release, [&] { abort_comm(); }, watchdog_, "NCCL", rank_, size_);
  if (!outcome.ok()) fail(outcome);
  pending_.push(std::move(op), bytes, deadline, mark());
  // A host that never settles (a first stage posts its output instead) is held back by post()'s
  // two staging slots; this bound is a second guard: wait for the oldest beyond it.
  constexpr size_t kMaxPending = 4096;
  if (pending_.size() > kMaxPending) settle();
}

void NcclCommunicator::settle() {
  if (comm_ == nullptr) return;
  use_device();
  LTM_ASSERT(!capturing(), "settle() on NCCL group ", name(),
             " while its stream is being captured into a CUDA graph (a host wait in a capture)");
  if (captured_ > 0) {
    // Graphs with our operations in them may have been replayed since the last wait: an event
    // recorded now comes after them.
    pending_.push(absl::StrCat("the stream's work before the host wait (its CUDA graphs hold ",
                               captured_, " captured NCCL operations)"),
                  0, watchdog_.deadline(), mark());
  }
  if (pending_.empty()) return;
  const DeviceWaitOutcome outcome = pending_.wait_all(
      [&](int slot) { return poll_event(events_[slot]); },
      [&](int slot) { free_events_.push_back(slot); }, [&] { abort_comm(); }, watchdog_, "NCCL",
      rank_, size_);
  if (!outcome.ok()) fail(outcome);
}

void NcclCommunicator::all_reduce_sum(float* data, size_t count) {
  // A group of one still calls NCCL (a copy at most): the graph tests capture it.
  if (count == 0) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  enqueued(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_),
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
  enqueued(ncclRecv(data, bytes, ncclUint8, src, comm_, stream_),
           absl::StrCat("recv(src=", src, ",tag=", tag, ")"), bytes, deadline);
}

void NcclCommunicator::wait_sent(Slot& slot) {
  if (!slot.busy) return;
  const DeviceWaitOutcome outcome =
      wait_device([&] { return poll_event(slot.sent); }, [&] { abort_comm(); }, watchdog_, "NCCL",
                  slot.op, slot.bytes, slot.deadline, rank_, size_);
  if (!outcome.ok()) fail(outcome);
  slot.busy = false;
}

void NcclCommunicator::post(const void* data, size_t bytes, int dst, int tag) {
  LTM_ASSERT(dst >= 0 && dst < size_ && dst != rank_, "post to rank ", dst, " on group ", name(),
             " of ", size_, " from rank ", rank_);
  LTM_ASSERT(tag >= 0, "post tag ", tag);
  if (bytes == 0) return;
  use_device();
  LTM_ASSERT(!capturing(), "post on NCCL group ", name(),
             " while its stream is being captured into a CUDA graph (pipeline sends are not "
             "captured)");
  Slot& slot = slots_[next_slot_];
  next_slot_ ^= 1;
  wait_sent(slot);  // the send before last from this slot
  const std::string op = absl::StrCat("post(dst=", dst, ",tag=", tag, ")");
  if (side_ == nullptr)
    LTM_NCCL_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), op);
  if (slot.copied == nullptr) {
    LTM_NCCL_CUDA(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming), op);
    LTM_NCCL_CUDA(cudaEventCreateWithFlags(&slot.sent, cudaEventDisableTiming), op);
  }
  if (slot.capacity < bytes) {
    if (slot.buffer != nullptr) LTM_NCCL_CUDA(cudaFree(slot.buffer), op);  // its send is done
    slot.buffer = nullptr;
    LTM_NCCL_CUDA(cudaMalloc(&slot.buffer, bytes), op);
    slot.capacity = bytes;
  }
  // The copy is ordered after the ops that wrote `data`; the send after the copy; the compute
  // stream goes on without waiting for the send.
  LTM_NCCL_CUDA(cudaMemcpyAsync(slot.buffer, data, bytes, cudaMemcpyDeviceToDevice, stream_), op);
  LTM_NCCL_CUDA(cudaEventRecord(slot.copied, stream_), op);
  LTM_NCCL_CUDA(cudaStreamWaitEvent(side_, slot.copied, 0), op);
  const Deadline deadline = watchdog_.deadline();
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess || r == ncclInProgress)
    r = ncclSend(slot.buffer, bytes, ncclUint8, dst, comm_, side_);
  const ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, op, __FILE__, __LINE__);
  wait_ready(op, bytes, deadline);  // taken by the communicator (not yet sent)
  LTM_NCCL_CUDA(cudaEventRecord(slot.sent, side_), op);
  slot.busy = true;
  slot.op = op;
  slot.bytes = bytes;
  slot.deadline = deadline;
}

void NcclCommunicator::flush() {
  if (comm_ == nullptr) return;
  use_device();
  for (Slot& slot : slots_) wait_sent(slot);
  if (!capturing()) settle();
}

void NcclCommunicator::barrier() {
  if (size_ == 1) return;
  use_device();
  const Deadline deadline = watchdog_.deadline();
  complete(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_),
           "barrier", sizeof(float), deadline);
}

}  // namespace ltm::parallel
