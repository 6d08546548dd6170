// The CPU backend: host memory, OpenBLAS GEMMs and OpenMP-threaded kernels (kernels/cpu).
// Ops run synchronously on the calling thread (and its OpenMP/OpenBLAS workers).
#pragma once

#include <memory>

#include "runtime/backend/backend.h"
#include "runtime/backend/weight_slabs.h"

namespace ltm {

class CpuBackend : public Backend {  // not final: tests emulate other backends on it
 public:
  // n_threads: OpenBLAS and OpenMP threads; 0 = all cores.
  explicit CpuBackend(int n_threads);

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string describe() const override;
  int host_threads() const override { return n_threads_; }
  int threads() const { return n_threads_; }
  // On a step-long team (kernels/cpu/step_team.h), unless LTM_STEP_TEAM=0.
  void run_small_step(const std::function<void()>& step) override;

  DeviceBuffer alloc(size_t bytes) override;
  DeviceBuffer alloc_zeroed(size_t bytes) override;
  // On 2 MiB pages (weight_slabs.h's map_huge_pages), faulted in as used, as before. A block of
  // a GPT-2 f32 cache is 4 KiB a head and layer: on 4 KiB pages attention took a TLB miss for
  // every block of every head it read, and a block's first use a page fault for each (slow on
  // the paravirtualized cloud VMs). Concurrency-32 serving, GPT-2-124M, forced AVX2, Zen 5 VM:
  // 1.03-1.11x (docs/benchmarks.md, "The KV cache on huge pages").
  DeviceBuffer alloc_kv_cache(size_t bytes) override;
  // populate_pages (weight_slabs.h): MADV_POPULATE_WRITE.
  void make_resident(const DeviceBuffer& buf) override;
  DeviceBuffer upload(const void* host, size_t bytes, bool host_outlives) override;
  // Host memory is this backend's device memory: the ops read the host array itself.
  const int32_t* stage_i32(const int32_t* host, size_t, DeviceBuffer&) override { return host; }
  const void* stage_bytes(const void* host, size_t, DeviceBuffer&) override { return host; }
  // The host sampler on the logits in place, rows over this backend's threads.
  void sample_rows(const SampleRowsArgs& args) override { sample_rows_host(args, n_threads_); }
  void select_candidates(const CandidateRowsArgs& args) override {
    select_candidates_host(args, n_threads_);
  }
  const void* read_on_host(const void* src, size_t, std::vector<unsigned char>&) override {
    synchronize();
    return src;
  }
  // Weights in f32, bf16 or fp16 packed panels; KV caches of any of the three.
  // Any weight type; caches of f32, bf16 or fp16 (int8 is for weights only).
  bool supports(Precision, Precision kv) const override { return kv != Precision::kInt8; }
  bool supports_head_dim(int64_t head_dim, int64_t* max_head_dim) const override {
    *max_head_dim = 512;  // paged_attention's per-head registers
    return head_dim <= *max_head_dim;
  }
  DeviceBuffer alloc_weight(int64_t k, int64_t n, Precision p) override;
  void write_weight_rows(DeviceBuffer& w, const float* rows, int64_t row_begin, int64_t row_end,
                         int64_t k, int64_t n) override;
  DeviceBuffer alloc_embedding(int64_t rows, int64_t d, Precision p) override;
  void write_embedding_rows(DeviceBuffer& table, const float* e_rows, int64_t row_begin,
                            int64_t row_end, int64_t rows, int64_t d) override;
  void matmul(const float* a, const DeviceBuffer& w, float* c, int64_t m, int64_t n, int64_t k,
              float beta) override;
  void embed(const int32_t* ids, const DeviceBuffer& table, int64_t row_begin, int64_t row_end,
             float* out, int64_t n_tokens, int64_t d) override;
  void lm_head(const float* x, const DeviceBuffer& table, float* logits, int64_t m, int64_t rows,
               int64_t d) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void synchronize() override {}
  bool comm_on_device() const override { return false; }

  void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
            bool b_transposed, float beta) override;
  void gemm_rows_nt(const float* a, const float* b, float* c, int64_t m, int64_t n,
                    int64_t k) override;
  void add_bias(float* x, const float* bias, int64_t rows, int64_t cols) override;
  void add(float* x, const float* y, int64_t n) override;
  void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) override;
  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps) override;
  void embedding(const int32_t* ids, const float* table, int64_t row_begin, int64_t row_end,
                 float* out, int64_t n_tokens, int64_t d) override;
  void add_position_embedding(float* x, const float* table, const int32_t* positions,
                              int64_t n_tokens, int64_t d) override;
  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n,
                   int64_t d) override;
  void kv_cache_write(const AttentionArgs& args, const void* qkv, void* k_cache,
                      void* v_cache) override;
  void paged_attention(const AttentionArgs& args, const void* qkv, const void* k_cache,
                       const void* v_cache, void* out) override;
  bool supports_llama() const override { return true; }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t cols,
                float eps) override;
  void add_residual_rms_norm(float* x, const float* residual, const float* bias, const float* w,
                             float* y, int64_t rows, int64_t cols, float eps) override;
  void rope(float* x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
            int64_t n_heads, int64_t row_stride, int64_t head_dim) override;
  void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols) override;

 private:
  int n_threads_;
  WeightSlabs weight_slabs_;  // alloc_weight's memory (weight_slabs.h: huge pages)
};

}  // namespace ltm
