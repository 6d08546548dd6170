#include "kernels/cuda/cuda_check.h"

namespace ltm::kernels::cuda {
namespace {
__global__ void probe_kernel() {}
}  // namespace

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attributes;
  const cudaError_t error = cudaFuncGetAttributes(&attributes, probe_kernel);
  if (error != cudaSuccess) return error;
  probe_kernel<<<1, 1>>>();
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) return launch;
  return cudaDeviceSynchronize();
}

}  // namespace ltm::kernels::cuda
