#include "runtime/backend/backend.h"

#include <algorithm>

namespace ltm {

const int32_t* Backend::stage_i32(const int32_t* host, size_t n, DeviceBuffer& staging) {
  const size_t bytes = std::max<size_t>(n, 1) * sizeof(int32_t);
  if (staging.bytes() < bytes) staging = alloc(std::max(bytes, staging.bytes() * 2));
  copy_to_device(staging.data(), host, n * sizeof(int32_t));
  return staging.i32();
}

#ifndef LTM_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* error) {
  if (error) *error = "this ltm was built without CUDA (configure with -DLTM_CUDA=ON)";
  return nullptr;
}
#endif

}  // namespace ltm
