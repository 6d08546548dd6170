// Links and calls NcclCommunicator, so that a link error (NCCL, cudart) shows in every build that
// has CUDA and NCCL, GPU or not. Run: a one-rank NCCL communicator on device 0 all-reduces,
// gathers and synchronises; without a CUDA device it exits 77 (ctest: skipped).
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/nccl_communicator.h"

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("nccl_link_check: linked; no CUDA device, so not run (skipped)\n");
    return 77;
  }
  ltm::parallel::SoloCommunicator host("solo");
  ltm::parallel::NcclCommunicator comm(host, 0, nullptr);
  std::vector<float> h = {1, 2, 3, 4};
  float* d = nullptr;
  float* g = nullptr;
  if (cudaMalloc(&d, 16) != cudaSuccess || cudaMalloc(&g, 16) != cudaSuccess) return 1;
  cudaMemcpy(d, h.data(), 16, cudaMemcpyHostToDevice);
  comm.all_reduce_sum(d, 4);
  comm.all_gather(d, g, 16);
  comm.barrier();
  std::vector<float> back(4);
  cudaMemcpy(back.data(), g, 16, cudaMemcpyDeviceToHost);
  cudaFree(d);
  cudaFree(g);
  if (back != h) {
    std::printf("nccl_link_check: one-rank all_gather changed the data\n");
    return 1;
  }
  std::printf("nccl_link_check: ok (%s, %d ranks)\n", comm.name().c_str(), comm.size());
  return 0;
}
