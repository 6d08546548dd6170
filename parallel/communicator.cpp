#include "parallel/communicator.h"

#include <cstring>

#include "common/check.h"

namespace ltm::parallel {

void SoloCommunicator::all_gather(const void* send, void* recv, size_t bytes) {
  if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
}
void SoloCommunicator::send(const void*, size_t, int dst, int) {
  LTM_ASSERT(false, "send to rank ", dst, " on a group of one (", name_, ")");
}
void SoloCommunicator::recv(void*, size_t, int src, int) {
  LTM_ASSERT(false, "recv from rank ", src, " on a group of one (", name_, ")");
}

}  // namespace ltm::parallel
