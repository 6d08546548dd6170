#include "runtime/backend/cuda_graph.h"

#include "kernels/cuda/cuda_check.h"

namespace ltm {

CudaGraph::~CudaGraph() {
  // After the launches enqueued so far (the scratch buffers, freed after this in stream order,
  // are still read by them). At process exit the runtime may be unloading: nothing to report.
  int previous = -1;
  cudaGetDevice(&previous);
  if (previous != device_) cudaSetDevice(device_);
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

void CudaGraph::launch(cudaStream_t stream) {
  LTM_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

void begin_stream_capture(cudaStream_t stream) {
  LTM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

std::unique_ptr<CudaGraph> end_stream_capture(cudaStream_t stream, int device) {
  cudaGraph_t graph = nullptr;
  LTM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  LTM_CUDA_CHECK(e);
  return std::make_unique<CudaGraph>(exec, device);
}

}  // namespace ltm
