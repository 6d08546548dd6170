// NcclCommunicator on a real device (skipped, exit 77, without one): a two-rank init whose second
// rank never comes times out under the watchdog, aborts the NCCL communicator and takes the
// process down with the collective-timeout code and the watchdog's line; a one-rank communicator
// moves data; and its all-reduce captured inside a CUDA graph runs at every replay, with settle()
// (the watched host wait) covering the replays. (The unit tests of the same logic without a
// device: device_wait_test, unique_id_mpi_test.) And a stream created before the communicator
// stays usable after its first collectives.
#include <gtest/gtest.h>

#ifdef LTM_HAVE_NCCL
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "common/exit_codes.h"
#include "parallel/communicator.h"
#include "parallel/nccl_communicator.h"

namespace ltm::parallel {
namespace {

// Rank 0 of a group of two whose rank 1 never starts: the id "broadcast" goes nowhere.
class AloneOfTwo final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void*, void*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void send(const void*, size_t, int, int) override {}
  void recv(void*, size_t, int, int) override {}
  void barrier() override {}

 private:
  std::string name_ = "tp";
};

TEST(NcclGpu, NcclInitTimeoutAbortsWithTheTimeoutCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        AloneOfTwo host;
        WatchdogOptions options;
        options.timeout_s = 3;
        NcclCommunicator comm(host, 0, nullptr, options);
      },
      ::testing::ExitedWithCode(kExitCollectiveTimeout),
      "collective init\\(2 ranks, device 0\\) on group tp .*did not finish within 3");
}

TEST(NcclGpu, OneRankCommunicatorMovesData) {
  SoloCommunicator host("solo");
  NcclCommunicator comm(host, 0, nullptr);
  std::vector<float> h = {1, 2, 3, 4};
  float* d = nullptr;
  float* g = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&g, 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, h.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  comm.all_reduce_sum(d, 4);
  comm.all_gather(d, g, 16);
  comm.barrier();
  std::vector<float> back(4);
  ASSERT_EQ(cudaMemcpy(back.data(), g, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);
  cudaFree(d);
  cudaFree(g);
}

// The first device run (H100, NCCL 2.28.9, 2026-12-06): on a communicator built on a stream the
// caller created before it, the first all-reduce was followed by cudaErrorContextIsDestroyed from
// the next runtime call on that stream (NcclAllReduceInGraph below, also with an eager all-reduce
// first), where the legacy stream worked (OneRankCommunicatorMovesData). ltm-worker builds its
// communicators on the backend's stream, created first, so this is that order: the stream stays
// usable after the communicator's init and first collectives, on this thread, and the thread's
// CUDA context is the one it had before (NcclCommunicator::keep_context puts it back where NCCL
// left another).
TEST(NcclGpu, AStreamCreatedBeforeTheCommunicatorStaysUsable) {
  constexpr size_t kCount = 1024;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);  // blocking, as the CUDA backend's
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  SoloCommunicator host("solo");
  NcclCommunicator comm(host, device, stream);
  std::printf("after init: %s\n", comm.context_report().c_str());
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kCount * sizeof(float)), cudaSuccess);
  std::vector<float> h(kCount, 1.5f), back(kCount);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemcpyAsync(buf, h.data(), kCount * sizeof(float), cudaMemcpyHostToDevice,
                              stream),
              cudaSuccess);
    comm.all_reduce_sum(buf, kCount);
    std::printf("after all-reduce %d: %s\n", round, comm.context_report().c_str());
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess) << "round " << round;
    comm.settle();
    ASSERT_EQ(cudaMemcpyAsync(back.data(), buf, kCount * sizeof(float), cudaMemcpyDeviceToHost,
                              stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "round " << round;
    EXPECT_EQ(back, h) << "round " << round;
  }
  cudaFree(buf);
  cudaStreamDestroy(stream);
}

// A one-rank communicator's all-reduce captured in a CUDA graph between two copies (src -> buf,
// all-reduce of buf, buf -> out), replayed three times over new contents of src: out holds the
// sum over the one rank (src itself) after each replay, the capture lists nothing as pending, and
// settle() after a replay waits for it under the watchdog. Then an eager all-reduce on the same
// communicator still works (graph and eager NCCL work mixed).
TEST(NcclGpu, NcclAllReduceInGraph) {
  constexpr size_t kCount = 4096;
  constexpr size_t kBytes = kCount * sizeof(float);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  SoloCommunicator host("solo");
  NcclCommunicator comm(host, 0, stream);
  float* src = nullptr;
  float* buf = nullptr;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&src, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&buf, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, kBytes), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(buf, src, kBytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  comm.all_reduce_sum(buf, kCount);
  ASSERT_EQ(cudaMemcpyAsync(out, buf, kBytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(comm.pending(), 0u) << "a captured all-reduce was listed as pending";
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  std::printf("captured graph: %zu nodes (2 copies + NCCL's)\n", nodes);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  std::vector<float> h(kCount), back(kCount);
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < kCount; ++i) h[i] = static_cast<float>(round * 1000 + i % 997) - 0.5f;
    ASSERT_EQ(cudaMemcpy(src, h.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    comm.settle();  // the watched wait: covers the replay's NCCL work
    EXPECT_EQ(comm.pending(), 0u);
    ASSERT_EQ(cudaMemcpy(back.data(), out, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, h) << "replay " << round;
  }
  // Eager, on the same communicator, after the graph: enqueued, pending until settled.
  comm.all_reduce_sum(out, kCount);
  comm.settle();
  EXPECT_EQ(comm.pending(), 0u);
  ASSERT_EQ(cudaMemcpy(back.data(), out, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(src);
  cudaFree(buf);
  cudaFree(out);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace ltm::parallel
#endif  // LTM_HAVE_NCCL
