#include "runtime/backend/backend.h"

namespace ltm {

#ifndef LTM_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* error) {
  if (error) *error = "this ltm was built without CUDA (configure with -DLTM_CUDA=ON)";
  return nullptr;
}
#endif

}  // namespace ltm
