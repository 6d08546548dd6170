#include "parallel/unique_id.h"

namespace ltm::parallel {

void share_unique_id(Communicator& host, void* id, size_t bytes,
                     absl::FunctionRef<void(void* id)> make_id) {
  if (host.rank() == 0) make_id(id);
  host.broadcast(id, bytes, 0);
}

}  // namespace ltm::parallel
