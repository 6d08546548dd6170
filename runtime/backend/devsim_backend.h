// The emulated device ("devsim"): the CPU backend's kernels behind a device's rules, so that CI
// proves on a CPU what a GPU run relies on (docs/architecture.md "Backends", "The emulated
// device"). Tests only: `ltm-worker --device devsim` (hidden from --help) and the unit tests.
//
// What it emulates:
//   - device memory: every buffer it hands out is recorded in a registry of its own (owns());
//     each op checks that its pointers are in it, so a host pointer handed to an op aborts;
//     fresh buffers (alloc) are filled with NaN, so a read of memory never written shows;
//   - a stream: ops are queued, not run; they run in order only at synchronize() (also called by
//     read_on_host, by the device communicator before each of its operations, and before a
//     buffer is freed, as cudaFree waits). A host array handed to copy_to_device is copied at the
//     call (the CUDA driver stages pageable memory the same way);
//   - asynchronous reads: copy_to_host fills the host destination with NaN at once and the copy
//     lands only when the stream reaches it, so a host that reads before synchronize() sees the
//     poison, not the answer (a sampler turns NaN logits into a failed row, loudly; NaN bits
//     read as a token id are an id far outside any vocab, which the engine refuses);
//   - sampling on the device: sample_rows runs the host sampler, and select_candidates the host's
//     candidate selection (tp > 1), on device buffers in stream order, so the engine's device
//     sampling paths (ids or candidates copied back, not logits) run in CI;
//   - a bound on what comes back: with LTM_DEVSIM_MAX_COPY_BACK=N in the environment, a
//     copy_to_host of more than N bytes aborts naming its size (tests prove a step copies back
//     ids or candidates, not logits);
//   - the size of a GPU's memory: with LTM_DEVSIM_MEMORY_MB=N, device_memory_bytes() is N MiB,
//     so that a server sizes its KV cache as on a GPU (what weights, activations, graphs, the
//     runtime and a draft model on the device leave; kv_cache.h). Nothing bounds the buffers
//     themselves: they are host memory. Unset: 0, a CPU's fixed default budget;
//   - graphs (capture/replay, as CUDA graphs): capture() runs the ops once as usual, then
//     records them instead of queueing them (each op's closure holds the pointers and host
//     scalars it was given, as a CUDA graph's nodes do) together with every device pointer they
//     were handed; replay() re-checks that each of those pointers is still in the registry and
//     queues the recorded list as one op. While capturing, an alloc, a freed buffer, a drain
//     (synchronize, read_on_host, a device communicator's transfer other than an all-reduce) or
//     a copy from or to host memory aborts, as it would break a CUDA capture; the device
//     communicator's all-reduces are recorded in the list (record_if_capturing);
// The device communicator over it is parallel/devsim_communicator.h (refuses pointers that owns()
// does not know, and drains the stream before each operation).
// Threading: one thread at a time, as any Backend.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"

namespace ltm {

struct DevsimRecording;  // a capture's ops and pointers (devsim_backend.cpp)

class DevsimBackend final : public Backend {
 public:
  explicit DevsimBackend(int n_threads);
  ~DevsimBackend() override;

  BackendKind kind() const override { return BackendKind::kDevsim; }
  std::string describe() const override;
  int host_threads() const override { return inner_->host_threads(); }

  // Whether [p, p + bytes) lies inside one buffer this backend handed out and still holds (with
  // bytes 0: p is in it or one past its end, where an empty range may start).
  bool owns(const void* p, size_t bytes) const;
  // Ops queued and not yet run (for tests).
  size_t pending() const;
  // Copies between host and device so far (copy_to_device, copy_to_host and what goes through
  // them: stage_i32, stage_bytes, read_on_host, upload), for tests that count a step's copies.
  struct CopyCounts {
    size_t h2d = 0, h2d_bytes = 0, d2h = 0, d2h_bytes = 0;
  };
  CopyCounts copy_counts() const { return copies_; }

  DeviceBuffer alloc(size_t bytes) override;
  DeviceBuffer alloc_zeroed(size_t bytes) override;
  DeviceBuffer upload(const void* host, size_t bytes, bool host_outlives) override;
  bool supports(Precision w, Precision kv) const override { return inner_->supports(w, kv); }
  int64_t device_memory_bytes() const override;
  bool supports_head_dim(int64_t head_dim, int64_t* max_head_dim) const override {
    return inner_->supports_head_dim(head_dim, max_head_dim);
  }
  DeviceBuffer alloc_weight(int64_t k, int64_t n, Precision p) override;
  void write_weight_rows(DeviceBuffer& w, const float* rows, int64_t row_begin, int64_t row_end,
                         int64_t k, int64_t n) override;
  DeviceBuffer alloc_embedding(int64_t rows, int64_t d, Precision p) override;
  void write_embedding_rows(DeviceBuffer& table, const float* e_rows, int64_t row_begin,
                            int64_t row_end, int64_t rows, int64_t d) override;
  // stage_i32 and read_on_host: Backend's defaults (a device copy; a host copy and a wait).
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void synchronize() override;
  bool comm_on_device() const override { return true; }
  void* stream() override { return this; }
  bool supports_graphs() const override { return true; }
  std::unique_ptr<BackendGraph> capture(const std::function<void()>& ops) override;
  void replay(BackendGraph& graph) override;
  // For the device communicator: while capturing, records `op` in the graph and returns true;
  // otherwise false (the caller runs it in stream order itself).
  bool record_if_capturing(std::function<void()> op);
  bool capturing() const;

  void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
            bool b_transposed, float beta) override;
  void gemm_rows_nt(const float* a, const float* b, float* c, int64_t m, int64_t n,
                    int64_t k) override;
  void matmul(const float* a, const DeviceBuffer& w, float* c, int64_t m, int64_t n, int64_t k,
              float beta) override;
  void add_bias(float* x, const float* bias, int64_t rows, int64_t cols) override;
  void add(float* x, const float* y, int64_t n) override;
  void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) override;
  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps) override;
  void embedding(const int32_t* ids, const float* table, int64_t row_begin, int64_t row_end,
                 float* out, int64_t n_tokens, int64_t d) override;
  void embed(const int32_t* ids, const DeviceBuffer& table, int64_t row_begin, int64_t row_end,
             float* out, int64_t n_tokens, int64_t d) override;
  void lm_head(const float* x, const DeviceBuffer& table, float* logits, int64_t m, int64_t rows,
               int64_t d) override;
  void add_position_embedding(float* x, const float* table, const int32_t* positions,
                              int64_t n_tokens, int64_t d) override;
  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n,
                   int64_t d) override;
  void kv_cache_write(const AttentionArgs& args, const void* qkv, void* k_cache,
                      void* v_cache) override;
  void paged_attention(const AttentionArgs& args, const void* qkv, const void* k_cache,
                       const void* v_cache, void* out) override;
  bool supports_llama() const override { return inner_->supports_llama(); }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t cols,
                float eps) override;
  void add_residual_rms_norm(float* x, const float* residual, const float* bias, const float* w,
                             float* y, int64_t rows, int64_t cols, float eps) override;
  void rope(float* x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
            int64_t n_heads, int64_t row_stride, int64_t head_dim) override;
  void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols) override;
  // The host sampler (the CPU backend's op) on device buffers, when the stream gets there: the
  // tokens read before synchronize() are poison (NaN bits, 0x7FC00000 as an id).
  void sample_rows(const SampleRowsArgs& args) override;
  // The host's candidate selection (the CPU backend's op) on device buffers, in stream order.
  void select_candidates(const CandidateRowsArgs& args) override;

 private:
  // The registry and the stream, shared with the buffers' deleters (a buffer may outlive us).
  struct State {
    mutable std::mutex mu;
    std::map<const char*, size_t> buffers;  // start -> bytes (at least 1)
    std::vector<std::function<void()>> queue;
    bool draining = false;
    DevsimRecording* capture = nullptr;  // while capturing: where ops go instead of `queue`
    void drain();
  };
  // Records `inner` (a CPU buffer) as device memory and returns the buffer callers hold.
  DeviceBuffer adopt(DeviceBuffer inner);
  void enqueue(std::function<void()> op);
  // Aborts unless `p` points into device memory of this backend (null passes: optional inputs).
  void check(const void* p, const char* op) const;

  std::unique_ptr<Backend> inner_;
  std::shared_ptr<State> state_;
  CopyCounts copies_;
};

}  // namespace ltm
