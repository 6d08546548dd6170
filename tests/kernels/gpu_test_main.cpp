// main() of the gpu-labelled tests: without a CUDA device there is nothing to test, and the run
// must say so. It exits 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE in
// tests/CMakeLists.txt), instead of letting every test skip itself and the binary pass.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#ifdef LTM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr int kSkipped = 77;

std::string why_no_device() {
#ifndef LTM_HAVE_CUDA
  return "ltm was built without CUDA";
#else
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (count == 0) return "cudaGetDeviceCount returned 0";
  return "";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const std::string why = why_no_device(); !why.empty()) {
    std::printf("SKIPPED: no CUDA device (%s); exit %d so that ctest reports this test skipped\n",
                why.c_str(), kSkipped);
    return kSkipped;
  }
  return RUN_ALL_TESTS();
}
