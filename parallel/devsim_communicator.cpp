#include "parallel/devsim_communicator.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "parallel/group_abort.h"

namespace ltm::parallel {

void DevsimCommunicator::enter(const void* p, size_t bytes, const char* op) {
  check(p, bytes, op);
  drain_();
}

void DevsimCommunicator::check(const void* p, size_t bytes, const char* op) {
  if (!owns_(p, bytes == 0 ? 1 : bytes)) {
    char where[32];
    std::snprintf(where, sizeof(where), "%p", p);
    abort_group(kExitMpiFailure,
                absl::StrCat(rank_prefix(), "devsim: ", op, " on group ", name(), " was handed ",
                             bytes, " bytes at ", where,
                             ", which are not device memory of the emulated device (a host "
                             "buffer on the device communicator)"));
  }
}

void DevsimCommunicator::all_reduce_sum(float* data, size_t count) {
  if (count == 0) return;
  Communicator* host = &host_;
  if (record_ && record_([host, data, count] { host->all_reduce_sum(data, count); })) {
    check(data, count * sizeof(float), "all_reduce_sum");
    return;
  }
  enter(data, count * sizeof(float), "all_reduce_sum");
  host_.all_reduce_sum(data, count);
}

void DevsimCommunicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  if (bytes_per_rank == 0) return;
  enter(send, bytes_per_rank, "all_gather");
  enter(recv, bytes_per_rank * static_cast<size_t>(size()), "all_gather");
  host_.all_gather(send, recv, bytes_per_rank);
}

void DevsimCommunicator::broadcast(void* data, size_t bytes, int root) {
  if (bytes == 0) return;
  enter(data, bytes, "broadcast");
  host_.broadcast(data, bytes, root);
}

void DevsimCommunicator::send(const void* data, size_t bytes, int dst, int tag) {
  enter(data, bytes, "send");
  host_.send(data, bytes, dst, tag);
}

void DevsimCommunicator::recv(void* data, size_t bytes, int src, int tag) {
  enter(data, bytes, "recv");
  host_.recv(data, bytes, src, tag);
}

void DevsimCommunicator::post(const void* data, size_t bytes, int dst, int tag) {
  enter(data, bytes, "post");
  host_.post(data, bytes, dst, tag);
}

void DevsimCommunicator::flush() { host_.flush(); }

void DevsimCommunicator::recv_wait(void* data, size_t bytes, int src, int tag,
                                   double first_piece_timeout_s) {
  enter(data, bytes, "recv_wait");
  host_.recv_wait(data, bytes, src, tag, first_piece_timeout_s);
}

void DevsimCommunicator::barrier() {
  drain_();
  host_.barrier();
}

}  // namespace ltm::parallel
