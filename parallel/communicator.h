// Communicator: collectives and point-to-point transfers over one group of ranks (a TP group,
// a PP group, or the whole world). Knows nothing of the model: it moves raw buffers.
//
// Buffers are host memory for the MPI implementation and device memory for NCCL; the caller
// passes what its backend uses (Backend::comm_on_device says which).
// Threading: one thread calls a given communicator at a time (the rank's step thread).
// Failure: an error or a timeout (the collective watchdog) prints host:rank:operation:group and
// takes the whole group down with a non-zero exit. These calls never return an error and never hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ltm::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank inside this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "tp", "pp", "world": named in error messages

  // In place: every rank ends with the element-wise sum of every rank's `data[0..count)`.
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  // recv[r * bytes_per_rank ...] = rank r's send buffer. recv holds size() * bytes_per_rank.
  virtual void all_gather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // root's data[0..bytes) reaches every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Blocking point-to-point, matched by (peer, tag).
  virtual void send(const void* data, size_t bytes, int dst, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int src, int tag) = 0;
  // Fire-and-forget send: takes a copy of data[0..bytes) and returns at once, without waiting for
  // `dst` to receive it; the transfer finishes in the background under the usual deadline (later
  // calls on this communicator reap it). recv matches it like a send, in the order posted. This is
  // how rank 0 hands out step plans and a stage passes activations on without stalling behind a
  // peer that is still busy with the previous micro-batch.
  virtual void post(const void* data, size_t bytes, int dst, int tag) { send(data, bytes, dst, tag); }
  // Returns once every posted message has been delivered (before shutdown).
  virtual void flush() {}
  // A device communicator (NCCL) leaves all_reduce_sum and recv enqueued on the backend's stream,
  // with no host wait (the data is in place in stream order, for the ops enqueued after them);
  // settle() is the host wait: it returns once every operation enqueued so far has completed,
  // polled under the collective watchdog, so a hung collective still takes the group down with
  // its name. Call it before the host reads results the stream produced (Engine: before the
  // logits are read back). Host communicators complete every call before it returns: a no-op.
  virtual void settle() {}
  // The idle wait for work as a receive: the first piece may take up to `first_piece_timeout_s`
  // (<= 0: any time, no deadline); dead peers are still detected.
  virtual void recv_wait(void* data, size_t bytes, int src, int tag,
                         double first_piece_timeout_s = 0) {
    (void)first_piece_timeout_s;
    recv(data, bytes, src, tag);
  }
  virtual void barrier() = 0;
};

// A group of one: every collective is a no-op (or a copy). Used by one-rank runs and unit tests.
class SoloCommunicator final : public Communicator {
 public:
  explicit SoloCommunicator(std::string name = "solo") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void* send, void* recv, size_t bytes) override;
  void broadcast(void*, size_t, int) override {}
  void send(const void*, size_t, int, int) override;
  void recv(void*, size_t, int, int) override;
  void barrier() override {}

 private:
  std::string name_;
};

}  // namespace ltm::parallel
