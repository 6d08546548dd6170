// Bootstrapping a device communicator (NCCL) over the group's host communicator: the group's
// first rank makes the unique id, the host communicator broadcasts it (under the collective
// watchdog), every rank returns with the same bytes. No NCCL here: the maker is injected
// (ncclGetUniqueId in nccl_communicator.cpp, a fake in unique_id_mpi_test).
#pragma once

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "parallel/communicator.h"

namespace ltm::parallel {

// Rank 0 of `host` calls make_id(id) (which fills `bytes` bytes); then every rank of `host`
// holds rank 0's bytes in id[0..bytes). Collective over `host`.
void share_unique_id(Communicator& host, void* id, size_t bytes,
                     absl::FunctionRef<void(void* id)> make_id);

}  // namespace ltm::parallel
