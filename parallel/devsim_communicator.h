// DevsimCommunicator: the device communicator of the emulated device (runtime/backend/
// devsim_backend.h), over a host communicator (MPI) of the same group.
//
// It keeps a device communicator's rules: every buffer it is handed must be device memory of the
// emulated device (`owns`), or the group goes down with
//   ltm: <host>:<rank>: devsim: <op> on group <name> was handed <n> bytes at <ptr>, which are not
//   device memory of the emulated device (a host buffer on the device communicator)
// and each operation is ordered on the emulated stream: the queued ops run first (`drain`), then
// the transfer, as a collective enqueued on a CUDA stream runs after the kernels before it. (A
// real stream runs by itself; the emulated one runs only when drained, so a communication is a
// point where it catches up, and a peer blocked on it is never left waiting for a stream that
// nobody runs.) An all-reduce made while the stream is being captured (a decode step's graph,
// runtime/model/decode_graphs.h) is recorded in the graph instead, and runs (on the host
// communicator) at each replay, in the graph's order; any other transfer during a capture drains
// the stream, which aborts.
// Threading and failure: those of the host communicator, which does the transfers.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "parallel/communicator.h"

namespace ltm::parallel {

class DevsimCommunicator final : public Communicator {
 public:
  using Owns = std::function<bool(const void* p, size_t bytes)>;
  using Drain = std::function<void()>;
  // While the emulated stream is being captured into a graph: records the op in it and returns
  // true (DevsimBackend::record_if_capturing); false otherwise.
  using Record = std::function<bool(std::function<void()> op)>;
  // `host` is not owned and must outlive this.
  DevsimCommunicator(Communicator& host, Owns owns, Drain drain, Record record = nullptr)
      : host_(host), owns_(std::move(owns)), drain_(std::move(drain)),
        record_(std::move(record)) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const std::string& name() const override { return host_.name(); }

  void all_reduce_sum(float* data, size_t count) override;
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void send(const void* data, size_t bytes, int dst, int tag) override;
  void recv(void* data, size_t bytes, int src, int tag) override;
  void post(const void* data, size_t bytes, int dst, int tag) override;
  void flush() override;
  // The emulated stream runs when drained: settle() drains it.
  void settle() override { drain_(); }
  void recv_wait(void* data, size_t bytes, int src, int tag,
                 double first_piece_timeout_s = 0) override;
  void barrier() override;

 private:
  // Takes the group down unless [p, p + bytes) is device memory; then drains the stream.
  void enter(const void* p, size_t bytes, const char* op);
  // Takes the group down unless [p, p + bytes) is device memory.
  void check(const void* p, size_t bytes, const char* op);

  Communicator& host_;
  Owns owns_;
  Drain drain_;
  Record record_;
};

}  // namespace ltm::parallel
