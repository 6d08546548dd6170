// NcclCommunicator on a real device (skipped, exit 77, without one): a two-rank init whose second
// rank never comes times out under the watchdog, aborts the NCCL communicator and takes the
// process down with the collective-timeout code and the watchdog's line; a one-rank communicator
// moves data. (The unit tests of the same logic without a device: device_wait_test,
// unique_id_mpi_test.)
#include <gtest/gtest.h>

#ifdef LTM_HAVE_NCCL
#include <cuda_runtime.h>

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

}  // namespace
}  // namespace ltm::parallel
#endif  // LTM_HAVE_NCCL
