// MpiCommunicator: the Communicator over one MPI communicator, on host buffers.
//
// Every operation is started non-blocking and waited for under the collective watchdog (see
// watchdog.h): it returns when done or takes the whole group down; it never returns an error and
// never hangs past its deadline (timeout_s(), default 300 s, set from --collective-timeout).
//
// Failure: the MPI communicator gets MPI_ERRORS_RETURN; any error becomes
//   ltm: <host>:<world rank>: MPI <op> on group <name> failed: <MPI error string> (<file>:<line>)
// then MPI_Abort(MPI_COMM_WORLD) and a non-zero exit (mpi_call.h).
//
// Large buffers: MPI counts are int. Each operation is cut into pieces of at most
// max_chunk_bytes() (1 GiB: safely below INT_MAX bytes, which some MPI internals still compute in
// int) run one after the other under one deadline, so buffers of any size_t length work.
//
// Results: all_reduce_sum uses MPI_SUM on MPI_FLOAT. Open MPI's algorithms reduce each element on
// one rank and distribute the result, so every rank ends with the same bits (the TP ranks'
// activations must not drift apart); mpi_communicator_mpi_test checks this.
//
// Ownership and threading: owns its MPI_Comm (freed in the destructor, unless MPI is already
// finalized). One thread calls a given communicator at a time (Communicator's contract); different
// communicators may be used from different threads (mpi_call.h says how under SERIALIZED).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/watchdog.h"

namespace ltm::parallel {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`. `name` ("world", "tp", "pp") is named in every error message.
  MpiCommunicator(MPI_Comm comm, std::string name, WatchdogOptions options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return watchdog_.group(); }

  void all_reduce_sum(float* data, size_t count) override;
  // In place is allowed: send == recv + rank() * bytes_per_rank.
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void send(const void* data, size_t bytes, int dst, int tag) override;
  void recv(void* data, size_t bytes, int src, int tag) override;
  void barrier() override;
  // post(): MPI_Isend from a private copy; each later operation on this communicator reaps the
  // posted sends that completed and aborts the group (watchdog message) if one is past its
  // deadline. flush() waits for all of them; the destructor flushes too.
  void post(const void* data, size_t bytes, int dst, int tag) override;
  void flush() override;
  void recv_wait(void* data, size_t bytes, int src, int tag,
                 double first_piece_timeout_s = 0) override;
  size_t posted_in_flight() const { return posted_.size(); }  // for tests


  // The collective timeout of the operations that start from now on; <= 0 disables it.
  void set_timeout(double seconds) { watchdog_.set_timeout(seconds); }
  double timeout_s() const { return watchdog_.timeout_s(); }

  // The largest piece one MPI call moves (1 <= bytes <= INT_MAX). Every rank of the group must use
  // the same value. Tests lower it to cover the chunked paths cheaply.
  void set_max_chunk_bytes(size_t bytes);
  size_t max_chunk_bytes() const { return max_chunk_bytes_; }

  MPI_Comm comm() const { return comm_; }

 private:
  void recv_impl(void* data, size_t bytes, int src, int tag, Deadline first_piece, const char* what);
  void check_peer(int peer, int tag, const char* what) const;
  // Reaps the posted sends that completed; aborts the group if one is past its deadline.
  void reap_posted();

  struct Posted {
    std::vector<char> data;
    std::vector<MPI_Request> requests;  // one per piece
    std::string op;
    int peer = -1;
    Deadline deadline = Deadline::never();
  };
  std::deque<Posted> posted_;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  size_t max_chunk_bytes_ = size_t{1} << 30;
  Watchdog watchdog_;
};

}  // namespace ltm::parallel
