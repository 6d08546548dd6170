#include "parallel/mpi_communicator.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "parallel/group_abort.h"
#include "parallel/mpi_call.h"

namespace ltm::parallel {
namespace {

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, WatchdogOptions options)
    : comm_(comm), watchdog_(std::move(name), options) {
  LTM_ASSERT(comm_ != MPI_COMM_NULL, "communicator ", watchdog_.group(), " is MPI_COMM_NULL");
  LTM_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "Comm_set_errhandler", this->name());
  LTM_MPI(MPI_Comm_rank(comm_, &rank_), "Comm_rank", this->name());
  LTM_MPI(MPI_Comm_size(comm_, &size_), "Comm_size", this->name());
  // The world rank of each member, so that a timeout names the peer's host (rank_hosts.h).
  MPI_Group group, world_group;
  LTM_MPI(MPI_Comm_group(comm_, &group), "Comm_group", this->name());
  LTM_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "Comm_group", "world");
  std::vector<int> ranks(size_), world_ranks(size_);
  for (int r = 0; r < size_; ++r) ranks[r] = r;
  LTM_MPI(MPI_Group_translate_ranks(group, size_, ranks.data(), world_group, world_ranks.data()),
          "Group_translate_ranks", this->name());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  watchdog_.set_members(std::move(world_ranks));
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ == MPI_COMM_NULL || mpi_finalized()) return;
  flush();  // MPI may still be reading the posted copies
  if (comm_ == MPI_COMM_WORLD || comm_ == MPI_COMM_SELF) return;
  auto lock = lock_mpi();
  MPI_Comm_free(&comm_);  // local; an error here is not worth an abort on the way out
}

void MpiCommunicator::set_max_chunk_bytes(size_t bytes) {
  LTM_ASSERT(bytes >= 1 && bytes <= static_cast<size_t>(INT_MAX), "max chunk bytes ", bytes);
  max_chunk_bytes_ = bytes;
}

void MpiCommunicator::all_reduce_sum(float* data, size_t count) {
  if (count == 0 || size_ == 1) return;
  reap_posted();
  constexpr const char* kOp = "all_reduce_sum";
  const Deadline deadline = watchdog_.deadline();
  const size_t chunk = std::max<size_t>(1, max_chunk_bytes_ / sizeof(float));
  for (size_t offset = 0; offset < count; offset += chunk) {
    const int n = static_cast<int>(std::min(chunk, count - offset));
    MPI_Request request;
    LTM_MPI(MPI_Iallreduce(MPI_IN_PLACE, data + offset, n, MPI_FLOAT, MPI_SUM, comm_, &request),
            kOp, name());
    watchdog_.wait(&request, kOp, count * sizeof(float), deadline);
  }
}

void MpiCommunicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  if (bytes_per_rank == 0) return;
  reap_posted();
  constexpr const char* kOp = "all_gather";
  char* out = static_cast<char*>(recv);
  const bool in_place = send == out + static_cast<size_t>(rank_) * bytes_per_rank;
  const size_t total = bytes_per_rank * static_cast<size_t>(size_);
  const Deadline deadline = watchdog_.deadline();
  if (bytes_per_rank <= max_chunk_bytes_) {
    const int n = static_cast<int>(bytes_per_rank);
    MPI_Request request;
    LTM_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, out, n, MPI_BYTE, comm_,
                           &request),
            kOp, name());
    watchdog_.wait(&request, kOp, total, deadline);
    return;
  }
  // Piece [offset, offset + n) of every rank's slice: rank r's piece lands at
  // out + r * bytes_per_rank + offset, i.e. one element of a type of n bytes and extent
  // bytes_per_rank (MPI_Aint is 64-bit, so the stride may exceed INT_MAX).
  for (size_t offset = 0; offset < bytes_per_rank; offset += max_chunk_bytes_) {
    const int n = static_cast<int>(std::min(max_chunk_bytes_, bytes_per_rank - offset));
    MPI_Datatype piece, strided;
    LTM_MPI(MPI_Type_contiguous(n, MPI_BYTE, &piece), "Type_contiguous", name());
    LTM_MPI(MPI_Type_create_resized(piece, 0, static_cast<MPI_Aint>(bytes_per_rank), &strided),
            "Type_create_resized", name());
    LTM_MPI(MPI_Type_commit(&strided), "Type_commit", name());
    MPI_Request request;
    LTM_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + offset, n,
                           MPI_BYTE, out + offset, 1, strided, comm_, &request),
            kOp, name());
    watchdog_.wait(&request, kOp, total, deadline);
    LTM_MPI(MPI_Type_free(&strided), "Type_free", name());
    LTM_MPI(MPI_Type_free(&piece), "Type_free", name());
  }
}

void MpiCommunicator::broadcast(void* data, size_t bytes, int root) {
  LTM_ASSERT(root >= 0 && root < size_, "broadcast root ", root, " on group ", name(), " of ",
             size_);
  if (bytes == 0 || size_ == 1) return;
  reap_posted();
  const std::string op = absl::StrCat("broadcast(root=", root, ")");
  char* buffer = static_cast<char*>(data);
  const Deadline deadline = watchdog_.deadline();
  for (size_t offset = 0; offset < bytes; offset += max_chunk_bytes_) {
    const int n = static_cast<int>(std::min(max_chunk_bytes_, bytes - offset));
    MPI_Request request;
    LTM_MPI(MPI_Ibcast(buffer + offset, n, MPI_BYTE, root, comm_, &request), op, name());
    watchdog_.wait(&request, op, bytes, deadline);
  }
}

void MpiCommunicator::check_peer(int peer, int tag, const char* what) const {
  LTM_ASSERT(peer >= 0 && peer < size_ && peer != rank_, what, " with rank ", peer, " from rank ",
             rank_, " on group ", name(), " of ", size_);
  LTM_ASSERT(tag >= 0 && tag <= 32767, "tag ", tag, " outside [0, 32767] (MPI_TAG_UB minimum)");
}

void MpiCommunicator::send(const void* data, size_t bytes, int dst, int tag) {
  check_peer(dst, tag, "send");
  reap_posted();
  const std::string op = absl::StrCat("send(dst=", dst, ",tag=", tag, ")");
  const char* buffer = static_cast<const char*>(data);
  const Deadline deadline = watchdog_.deadline();
  size_t offset = 0;
  do {  // a zero-byte send is still one message: it orders the ranks like any other
    const int n = static_cast<int>(std::min(max_chunk_bytes_, bytes - offset));
    MPI_Request request;
    LTM_MPI(MPI_Isend(buffer + offset, n, MPI_BYTE, dst, tag, comm_, &request), op, name());
    watchdog_.wait(&request, op, bytes, deadline, dst);
    offset += n;
  } while (offset < bytes);
}

void MpiCommunicator::post(const void* data, size_t bytes, int dst, int tag) {
  check_peer(dst, tag, "post");
  reap_posted();
  Posted p;
  p.op = absl::StrCat("post(dst=", dst, ",tag=", tag, ")");
  p.peer = dst;
  p.deadline = watchdog_.deadline();
  p.data.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  size_t offset = 0;
  do {
    const int n = static_cast<int>(std::min(max_chunk_bytes_, bytes - offset));
    MPI_Request request;
    LTM_MPI(MPI_Isend(p.data.data() + offset, n, MPI_BYTE, dst, tag, comm_, &request), p.op,
            name());
    p.requests.push_back(request);
    offset += n;
  } while (offset < bytes);
  posted_.push_back(std::move(p));  // moving the vector keeps its heap buffer where MPI has it
}

void MpiCommunicator::reap_posted() {
  if (posted_.empty()) return;
  const Deadline::Clock::time_point now = Deadline::Clock::now();
  for (auto it = posted_.begin(); it != posted_.end();) {
    int done = 0;
    LTM_MPI(MPI_Testall(static_cast<int>(it->requests.size()), it->requests.data(), &done,
                        MPI_STATUSES_IGNORE),
            it->op, name());
    if (done) {
      it = posted_.erase(it);
      continue;
    }
    // A posted send still pending when a pipe broke (watchdog.h): its peer is the likely loss.
    if (broken_pipes() != 0)
      abort_group(kExitMpiFailure, watchdog_.broken_pipe_message(it->op, it->peer));
    if (it->deadline.expired(now))
      abort_group(kExitCollectiveTimeout,
                  watchdog_.timeout_message(it->op, it->data.size(), it->deadline.seconds(),
                                            it->peer));
    ++it;
  }
}

void MpiCommunicator::flush() {
  for (Posted& p : posted_)
    for (MPI_Request& request : p.requests)
      if (request != MPI_REQUEST_NULL)
        watchdog_.wait(&request, p.op, p.data.size(), p.deadline, p.peer);
  posted_.clear();
}

void MpiCommunicator::recv(void* data, size_t bytes, int src, int tag) {
  recv_impl(data, bytes, src, tag, watchdog_.deadline(), "recv");
}

void MpiCommunicator::recv_wait(void* data, size_t bytes, int src, int tag,
                                double first_piece_timeout_s) {
  recv_impl(data, bytes, src, tag, Deadline::after(first_piece_timeout_s), "recv_wait");
}

void MpiCommunicator::recv_impl(void* data, size_t bytes, int src, int tag, Deadline first_piece,
                                const char* what) {
  check_peer(src, tag, what);
  reap_posted();
  const std::string op = absl::StrCat(what, "(src=", src, ",tag=", tag, ")");
  char* buffer = static_cast<char*>(data);
  Deadline deadline = first_piece;
  size_t offset = 0;
  do {
    const int n = static_cast<int>(std::min(max_chunk_bytes_, bytes - offset));
    MPI_Request request;
    LTM_MPI(MPI_Irecv(buffer + offset, n, MPI_BYTE, src, tag, comm_, &request), op, name());
    MPI_Status status = watchdog_.wait(&request, op, bytes, deadline, src);
    int got = 0;
    LTM_MPI(MPI_Get_count(&status, MPI_BYTE, &got), op, name());
    // A longer message fails in MPI_Test (MPI_ERR_TRUNCATE); a shorter one is a sender's bug.
    LTM_ASSERT(got == n, op, " on group ", name(), ": got ", got,
               " bytes where the receiver expects ", n, " (piece at offset ", offset, " of ", bytes,
               ")");
    offset += n;
    deadline = watchdog_.deadline();  // after the first piece the sender is sending: normal timeout
  } while (offset < bytes);
}

void MpiCommunicator::barrier() {
  if (size_ == 1) return;
  reap_posted();
  MPI_Request request;
  LTM_MPI(MPI_Ibarrier(comm_, &request), "barrier", name());
  watchdog_.wait(&request, "barrier", 0, watchdog_.deadline());
}

}  // namespace ltm::parallel
