// CUDA graphs for the CUDA backend (CudaBackend::capture / replay, Backend::capture): a stream's
// work captured once and launched again as one unit (docs/architecture.md, the CUDA backend).
//
// Capture mode: cudaStreamCaptureModeThreadLocal. Under it, a call that is not allowed in a
// capture (cudaMalloc, a synchronisation, a synchronous copy) made by the capturing thread fails
// and invalidates the capture, so a mistake in our own code shows at once; calls made by other
// threads are not affected. Global mode would also fail other threads' such calls while we
// capture (NCCL's proxy thread allocates and synchronises on its own), and Relaxed would let our
// own mistakes through. The backend adds its own checks before CUDA's (CudaBackend: alloc,
// synchronize, host copies abort while capturing, naming the call).
//
// Plain C++ with the CUDA runtime; built into the CUDA backend's plugin.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "runtime/backend/backend.h"

namespace ltm {

// An instantiated graph and the scratch buffers its kernels use (attention workspace, 16-bit
// activations, shared with the other graphs of its backend): they stay allocated as long as the
// graph.
class CudaGraph final : public BackendGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, int device) : exec_(exec), device_(device) {}
  ~CudaGraph() override;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Enqueues the whole graph on `stream`.
  void launch(cudaStream_t stream);
  int device() const { return device_; }

  std::vector<std::shared_ptr<DeviceBuffer>> scratch;

 private:
  cudaGraphExec_t exec_ = nullptr;
  int device_ = 0;
};

// Starts capturing `stream` (thread-local mode).
void begin_stream_capture(cudaStream_t stream);
// Ends the capture of `stream` and instantiates what was captured.
std::unique_ptr<CudaGraph> end_stream_capture(cudaStream_t stream, int device);

}  // namespace ltm
