// A world of one process, standing in for MPI in the GPU-only build (-DLTM_GPU_ONLY=ON,
// cmake/gpu_only.cmake), which has no MPI library: ltm-worker and ltm-bench there run one rank
// (tp 1, pp 1), and parallel/ keeps its one code path. Only the calls parallel/ makes are here.
// Every communicator has one rank (rank 0): an all-reduce or broadcast leaves the data as it is,
// an all-gather copies this rank's part, a barrier returns; a send to this same rank is queued and
// a receive takes the oldest queued message of its communicator and tag. Requests complete when
// tested. Started under a launcher that says there are several ranks (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE, SLURM_NTASKS above 1), MPI_Init_thread fails with a message saying this build runs
// one rank only. Every build other than the GPU-only one includes the real <mpi.h>.
//
// Thread level: MPI_THREAD_SERIALIZED, so parallel/mpi_call.h serialises the calls and the state
// below needs no lock of its own.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

using MPI_Comm = int;
using MPI_Group = int;
using MPI_Datatype = int;  // bytes per element; derived types are contiguous runs of bytes
using MPI_Op = int;
using MPI_Request = int;
using MPI_Aint = std::intptr_t;
using MPI_Errhandler = int;

struct MPI_Status {
  int MPI_SOURCE = 0;
  int MPI_TAG = 0;
  int MPI_ERROR = 0;
  long long ltm_bytes = 0;  // what the receive got
};

inline constexpr int MPI_SUCCESS = 0;
inline constexpr int MPI_ERR_OTHER = 1;
inline constexpr int MPI_ERR_TRUNCATE = 2;
inline constexpr int MPI_ERR_RANK = 3;
inline constexpr int MPI_ERR_COMM = 4;
inline constexpr int MPI_ERR_REQUEST = 5;
inline constexpr int MPI_ERR_UNSUPPORTED = 6;
inline constexpr int MPI_MAX_ERROR_STRING = 256;

inline constexpr int MPI_THREAD_SINGLE = 0;
inline constexpr int MPI_THREAD_FUNNELED = 1;
inline constexpr int MPI_THREAD_SERIALIZED = 2;
inline constexpr int MPI_THREAD_MULTIPLE = 3;

inline constexpr MPI_Comm MPI_COMM_NULL = 0;
inline constexpr MPI_Comm MPI_COMM_WORLD = 1;
inline constexpr MPI_Comm MPI_COMM_SELF = 2;
inline constexpr MPI_Request MPI_REQUEST_NULL = 0;
inline constexpr MPI_Errhandler MPI_ERRORS_RETURN = 1;
inline constexpr MPI_Errhandler MPI_ERRORS_ARE_FATAL = 2;

inline constexpr MPI_Datatype MPI_BYTE = 1;
inline constexpr MPI_Datatype MPI_CHAR = 1;
inline constexpr MPI_Datatype MPI_INT = 4;
inline constexpr MPI_Datatype MPI_FLOAT = 4;
inline constexpr MPI_Datatype MPI_DOUBLE = 8;
inline constexpr MPI_Datatype MPI_INT64_T = 8;
inline constexpr MPI_Datatype MPI_UINT64_T = 8;

inline constexpr MPI_Op MPI_SUM = 1;
inline constexpr MPI_Op MPI_MAX = 2;
inline constexpr MPI_Op MPI_MIN = 3;

inline void* const MPI_IN_PLACE = reinterpret_cast<void*>(static_cast<std::intptr_t>(-1));
inline MPI_Status* const MPI_STATUS_IGNORE = nullptr;
inline MPI_Status* const MPI_STATUSES_IGNORE = nullptr;

namespace ltm_one_rank_mpi {

struct Message {
  MPI_Comm comm;
  int tag;
  std::vector<char> bytes;
};
struct Receive {
  MPI_Comm comm;
  int tag;
  char* buffer;
  long long capacity;
};
struct State {
  int initialized = 0;
  int finalized = 0;
  MPI_Comm next_comm = 3;
  MPI_Request next_request = 1;
  std::deque<Message> queued;              // sends to this rank not yet received
  std::map<MPI_Request, Receive> receives;  // posted, not yet matched
};
inline State& state() {
  static State s;
  return s;
}
inline bool valid_comm(MPI_Comm c) { return c != MPI_COMM_NULL && c < state().next_comm; }
// Ranks other launchers started beside this process (the world this build cannot join).
inline int launched_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  return 1;
}
inline int copy_unless_in_place(const void* send, void* recv, long long bytes) {
  if (send != MPI_IN_PLACE && send != recv && bytes > 0)
    std::memmove(recv, send, static_cast<size_t>(bytes));
  return MPI_SUCCESS;
}

}  // namespace ltm_one_rank_mpi

inline int MPI_Initialized(int* flag) {
  *flag = ltm_one_rank_mpi::state().initialized;
  return MPI_SUCCESS;
}
inline int MPI_Finalized(int* flag) {
  *flag = ltm_one_rank_mpi::state().finalized;
  return MPI_SUCCESS;
}
inline int MPI_Init_thread(int*, char***, int, int* provided) {
  *provided = MPI_THREAD_SERIALIZED;
  if (ltm_one_rank_mpi::launched_ranks() > 1) return MPI_ERR_UNSUPPORTED;
  ltm_one_rank_mpi::state().initialized = 1;
  return MPI_SUCCESS;
}
inline int MPI_Init(int* argc, char*** argv) {
  int provided = 0;
  return MPI_Init_thread(argc, argv, MPI_THREAD_SINGLE, &provided);
}
inline int MPI_Query_thread(int* provided) {
  *provided = MPI_THREAD_SERIALIZED;
  return MPI_SUCCESS;
}
inline int MPI_Finalize() {
  ltm_one_rank_mpi::state().finalized = 1;
  return MPI_SUCCESS;
}
[[noreturn]] inline void ltm_one_rank_mpi_exit(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}
inline int MPI_Abort(MPI_Comm, int code) { ltm_one_rank_mpi_exit(code); }
inline int MPI_Error_string(int code, char* text, int* length) {
  const char* s = "unknown error";
  switch (code) {
    case MPI_SUCCESS: s = "no error"; break;
    case MPI_ERR_TRUNCATE: s = "message truncated (the receive buffer is smaller)"; break;
    case MPI_ERR_RANK: s = "invalid rank: this build's world has one rank"; break;
    case MPI_ERR_COMM: s = "invalid communicator"; break;
    case MPI_ERR_REQUEST: s = "invalid request"; break;
    case MPI_ERR_UNSUPPORTED:
      s = "this GPU-only build (-DLTM_GPU_ONLY=ON) has no MPI and runs one rank only; the "
          "launcher started several (build ltm without LTM_GPU_ONLY for tp x pp > 1)";
      break;
    default: break;
  }
  std::snprintf(text, MPI_MAX_ERROR_STRING, "%s", s);
  *length = static_cast<int>(std::strlen(text));
  return MPI_SUCCESS;
}

inline int MPI_Comm_set_errhandler(MPI_Comm, MPI_Errhandler) { return MPI_SUCCESS; }
inline int MPI_Comm_rank(MPI_Comm c, int* rank) {
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  *rank = 0;
  return MPI_SUCCESS;
}
inline int MPI_Comm_size(MPI_Comm c, int* size) {
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  *size = 1;
  return MPI_SUCCESS;
}
inline int MPI_Comm_dup(MPI_Comm c, MPI_Comm* out) {
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  *out = ltm_one_rank_mpi::state().next_comm++;
  return MPI_SUCCESS;
}
inline int MPI_Comm_split(MPI_Comm c, int, int, MPI_Comm* out) { return MPI_Comm_dup(c, out); }
inline int MPI_Comm_free(MPI_Comm* c) {
  *c = MPI_COMM_NULL;
  return MPI_SUCCESS;
}
inline int MPI_Comm_group(MPI_Comm c, MPI_Group* g) {
  *g = c;
  return MPI_SUCCESS;
}
inline int MPI_Group_free(MPI_Group* g) {
  *g = 0;
  return MPI_SUCCESS;
}
inline int MPI_Group_translate_ranks(MPI_Group, int n, const int* ranks, MPI_Group, int* out) {
  for (int i = 0; i < n; ++i) {
    if (ranks[i] != 0) return MPI_ERR_RANK;
    out[i] = 0;
  }
  return MPI_SUCCESS;
}

inline int MPI_Type_contiguous(int count, MPI_Datatype old, MPI_Datatype* out) {
  *out = count * old;
  return MPI_SUCCESS;
}
inline int MPI_Type_create_resized(MPI_Datatype old, MPI_Aint, MPI_Aint, MPI_Datatype* out) {
  *out = old;  // one rank: the extent (the stride between ranks' parts) is never used
  return MPI_SUCCESS;
}
inline int MPI_Type_commit(MPI_Datatype*) { return MPI_SUCCESS; }
inline int MPI_Type_free(MPI_Datatype* t) {
  *t = 0;
  return MPI_SUCCESS;
}

inline int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op,
                         MPI_Comm c) {
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  return ltm_one_rank_mpi::copy_unless_in_place(send, recv, 1LL * count * type);
}
inline int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                          MPI_Comm c, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return MPI_Allreduce(send, recv, count, type, op, c);
}
inline int MPI_Iallgather(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                          int, MPI_Datatype, MPI_Comm c, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  return ltm_one_rank_mpi::copy_unless_in_place(send, recv, 1LL * send_count * send_type);
}
inline int MPI_Ibcast(void*, int, MPI_Datatype, int root, MPI_Comm c, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  return root == 0 ? MPI_SUCCESS : MPI_ERR_RANK;
}
inline int MPI_Ibarrier(MPI_Comm c, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return ltm_one_rank_mpi::valid_comm(c) ? MPI_SUCCESS : MPI_ERR_COMM;
}
inline int MPI_Isend(const void* buffer, int count, MPI_Datatype type, int dst, int tag,
                     MPI_Comm c, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  if (dst != 0) return MPI_ERR_RANK;
  const char* p = static_cast<const char*>(buffer);
  ltm_one_rank_mpi::state().queued.push_back(
      {c, tag, std::vector<char>(p, p + 1LL * count * type)});
  return MPI_SUCCESS;
}
inline int MPI_Irecv(void* buffer, int count, MPI_Datatype type, int src, int tag, MPI_Comm c,
                     MPI_Request* request) {
  if (!ltm_one_rank_mpi::valid_comm(c)) return MPI_ERR_COMM;
  if (src != 0) return MPI_ERR_RANK;
  ltm_one_rank_mpi::State& s = ltm_one_rank_mpi::state();
  *request = s.next_request++;
  s.receives[*request] = {c, tag, static_cast<char*>(buffer), 1LL * count * type};
  return MPI_SUCCESS;
}
inline int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  *flag = 1;
  if (status != nullptr) *status = MPI_Status{};
  if (*request == MPI_REQUEST_NULL) return MPI_SUCCESS;
  ltm_one_rank_mpi::State& s = ltm_one_rank_mpi::state();
  const auto r = s.receives.find(*request);
  if (r == s.receives.end()) return MPI_ERR_REQUEST;
  for (auto m = s.queued.begin(); m != s.queued.end(); ++m) {
    if (m->comm != r->second.comm || m->tag != r->second.tag) continue;
    const long long n = static_cast<long long>(m->bytes.size());
    const bool fits = n <= r->second.capacity;
    if (fits && n > 0) std::memcpy(r->second.buffer, m->bytes.data(), static_cast<size_t>(n));
    if (status != nullptr) {
      status->MPI_TAG = m->tag;
      status->ltm_bytes = fits ? n : r->second.capacity;
      status->MPI_ERROR = fits ? MPI_SUCCESS : MPI_ERR_TRUNCATE;
    }
    s.queued.erase(m);
    s.receives.erase(r);
    *request = MPI_REQUEST_NULL;
    return fits ? MPI_SUCCESS : MPI_ERR_TRUNCATE;
  }
  *flag = 0;
  return MPI_SUCCESS;
}
inline int MPI_Testall(int n, MPI_Request* requests, int* flag, MPI_Status*) {
  *flag = 1;
  for (int i = 0; i < n; ++i) {
    int done = 0;
    if (const int rc = MPI_Test(&requests[i], &done, nullptr); rc != MPI_SUCCESS) return rc;
    if (!done) *flag = 0;
  }
  return MPI_SUCCESS;
}
inline int MPI_Cancel(MPI_Request* request) {
  ltm_one_rank_mpi::state().receives.erase(*request);
  return MPI_SUCCESS;
}
inline int MPI_Request_free(MPI_Request* request) {
  ltm_one_rank_mpi::state().receives.erase(*request);
  *request = MPI_REQUEST_NULL;
  return MPI_SUCCESS;
}
inline int MPI_Get_count(const MPI_Status* status, MPI_Datatype type, int* count) {
  *count = static_cast<int>(status->ltm_bytes / (type > 0 ? type : 1));
  return MPI_SUCCESS;
}
