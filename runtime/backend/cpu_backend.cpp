#include "runtime/backend/cpu_backend.h"

#include <omp.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "common/check.h"
#include "common/openmp_wait.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/llama_ops.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/static_for.h"
#include "kernels/cpu/step_team.h"
#include "kernels/cpu/weight_type.h"

namespace ltm {

CpuBackend::CpuBackend(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  n_threads_ = n_threads < 1 ? 1 : n_threads;
  omp_set_num_threads(n_threads_);
  kernels::cpu::set_blas_threads(n_threads_);
}

std::string CpuBackend::describe() const {
  // isa() first: choosing the path may switch OpenBLAS's kernels (blas_core.h).
  const std::string isa = kernels::cpu::isa_name();
  const std::string core = kernels::cpu::blas_core();
  return absl::StrCat("cpu (", n_threads_, " threads, ", kernels::cpu::blas_name(),
                      core.empty() ? "" : " ", core, ", ", isa, ", OpenMP spin ",
                      openmp_spin_setting(), ")");
}

DeviceBuffer CpuBackend::alloc(size_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return DeviceBuffer(p, bytes, std::shared_ptr<void>(p, [](void* q) { std::free(q); }));
}

DeviceBuffer CpuBackend::alloc_zeroed(size_t bytes) {
  // Packed weights and KV caches. Large blocks are mapped fresh (zero pages, nothing written or
  // resident until first use, as calloc would give) but page-aligned: calloc's block starts 16
  // bytes past a page, which put every 64-byte row of a weight panel or a cache row across two
  // cache lines (twice the lines for each AMX tile and AVX-512 load).
  constexpr size_t kMapAt = size_t{1} << 16;
  if (bytes < kMapAt) {
    DeviceBuffer buf = alloc(bytes);
    std::memset(buf.data(), 0, buf.bytes());
    return buf;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return DeviceBuffer(p, bytes, std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); }));
}

DeviceBuffer CpuBackend::alloc_kv_cache(size_t bytes) {
  if (bytes < WeightSlabs::kHugePage) return alloc_zeroed(bytes);
  return map_huge_pages(bytes);
}

void CpuBackend::make_resident(const DeviceBuffer& buf) {
  populate_pages(buf.data(), buf.bytes());
}

DeviceBuffer CpuBackend::upload(const void* host, size_t bytes, bool host_outlives) {
  if (host_outlives) return DeviceBuffer(const_cast<void*>(host), bytes, nullptr);
  DeviceBuffer buf = alloc(bytes);
  if (bytes) std::memcpy(buf.data(), host, bytes);
  return buf;
}

namespace {
namespace kc = kernels::cpu;
kc::WeightType kernel_type(Precision p) {
  switch (p) {
    case Precision::kF32: return kc::WeightType::kF32;
    case Precision::kBF16: return kc::WeightType::kBF16;
    case Precision::kF16: return kc::WeightType::kF16;
    case Precision::kInt8: return kc::WeightType::kInt8;
  }
  return kc::WeightType::kF32;
}
}  // namespace

DeviceBuffer CpuBackend::alloc_weight(int64_t k, int64_t n, Precision p) {
  // Zeroed, so that pad columns past n read as zero whichever row ranges are written; from the
  // huge-page slabs (weight_slabs.h), as decode streams all of it every token.
  DeviceBuffer buf = weight_slabs_.take(kc::packed_bytes(k, n, kernel_type(p)));
  buf.set_precision(p);
  return buf;
}

void CpuBackend::write_weight_rows(DeviceBuffer& w, const float* rows, int64_t row_begin,
                                   int64_t row_end, int64_t k, int64_t n) {
  LTM_ASSERT(w.bytes() >= kc::packed_bytes(k, n, kernel_type(w.precision())),
             "write_weight_rows: buffer of ", w.bytes(), " bytes is not a packed [", k, ", ", n, "]");
  kc::pack_weight_rows(rows, row_begin, row_end, k, n, kernel_type(w.precision()), w.data());
}

DeviceBuffer CpuBackend::alloc_embedding(int64_t rows, int64_t d, Precision p) {
  return alloc_weight(d, rows, p);  // E^T [d, rows]
}

void CpuBackend::write_embedding_rows(DeviceBuffer& table, const float* e_rows, int64_t row_begin,
                                      int64_t row_end, int64_t rows, int64_t d) {
  kc::pack_weight_transposed_rows(e_rows, row_begin, row_end, rows, d,
                                  kernel_type(table.precision()), table.data());
}

void CpuBackend::matmul(const float* a, const DeviceBuffer& w, float* c, int64_t m, int64_t n,
                        int64_t k, float beta) {
  LTM_ASSERT(w.bytes() >= kc::packed_bytes(k, n, kernel_type(w.precision())),
             "matmul: weight buffer of ", w.bytes(), " bytes is not a packed [", k, ", ", n, "]");
  kc::packed_gemm(a, w.data(), kernel_type(w.precision()), c, m, n, k, beta);
}

void CpuBackend::run_small_step(const std::function<void()>& step) {
  static const bool on = [] {
    const char* e = std::getenv("LTM_STEP_TEAM");
    return !(e != nullptr && std::string(e) == "0");
  }();
  if (on) {
    kc::run_step_team(n_threads_, step);
  } else {
    step();
  }
}

void CpuBackend::embed(const int32_t* ids, const DeviceBuffer& table, int64_t row_begin,
                       int64_t row_end, float* out, int64_t n_tokens, int64_t d) {
  // A column of the packed E^T panels per token (strided reads): on every thread when there are
  // enough tokens, so that the others do not wait for the step thread.
  kc::static_for(n_tokens, n_tokens >= 8, [&](int64_t t) {
    const int64_t id = ids[t];
    if (id >= row_begin && id < row_end)
      kc::packed_column(table.data(), kernel_type(table.precision()), d, id - row_begin,
                        out + t * d);
    else
      std::memset(out + t * d, 0, sizeof(float) * d);
  });
}

void CpuBackend::lm_head(const float* x, const DeviceBuffer& table, float* logits, int64_t m,
                         int64_t rows, int64_t d) {
  kc::packed_gemm(x, table.data(), kernel_type(table.precision()), logits, m, rows, d, 0.0f);
}

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuBackend::gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                      bool b_transposed, float beta) {
  kernels::cpu::gemm(a, b, c, m, n, k, b_transposed, beta);
}
void CpuBackend::gemm_rows_nt(const float* a, const float* b, float* c, int64_t m, int64_t n,
                              int64_t k) {
  kernels::cpu::gemm_rows_nt(a, b, c, m, n, k);
}
void CpuBackend::add_bias(float* x, const float* bias, int64_t rows, int64_t cols) {
  kernels::cpu::add_bias(x, bias, rows, cols);
}
void CpuBackend::add(float* x, const float* y, int64_t n) { kernels::cpu::add(x, y, n); }
void CpuBackend::bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) {
  kernels::cpu::bias_gelu(x, bias, rows, cols);
}
void CpuBackend::layer_norm(const float* x, const float* gamma, const float* beta, float* y,
                            int64_t rows, int64_t cols, float eps) {
  kernels::cpu::layer_norm(x, gamma, beta, y, rows, cols, eps);
}
void CpuBackend::embedding(const int32_t* ids, const float* table, int64_t row_begin,
                           int64_t row_end, float* out, int64_t n_tokens, int64_t d) {
  kernels::cpu::embedding(ids, table, row_begin, row_end, out, n_tokens, d);
}
void CpuBackend::add_position_embedding(float* x, const float* table, const int32_t* positions,
                                        int64_t n_tokens, int64_t d) {
  kernels::cpu::add_position_embedding(x, table, positions, n_tokens, d);
}
void CpuBackend::gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n,
                             int64_t d) {
  kernels::cpu::gather_rows(src, rows, dst, n, d);
}
void CpuBackend::kv_cache_write(const AttentionArgs& a, const void* qkv, void* k_cache,
                                void* v_cache) {
  LTM_ASSERT(a.act == Precision::kF32, "the CPU backend keeps fp32 activations");
  kernels::cpu::kv_cache_write(static_cast<const float*>(qkv), a.slot_mapping, a.n_tokens,
                               a.n_head, a.head_dim, a.block_size, kernel_type(a.kv), k_cache,
                               v_cache, a.n_kv_head);
}
void CpuBackend::paged_attention(const AttentionArgs& a, const void* qkv, const void* k_cache,
                                 const void* v_cache, void* out) {
  LTM_ASSERT(a.act == Precision::kF32, "the CPU backend keeps fp32 activations");
  LTM_ASSERT(a.head_dim <= 512, "head_dim ", a.head_dim, " > 512 is not supported on CPU");
  kernels::cpu::PagedAttentionShape shape{a.n_seqs,
                                          a.n_head,
                                          a.head_dim,
                                          a.block_size,
                                          a.max_blocks_per_seq,
                                          a.token_offsets,
                                          a.context_lens,
                                          a.block_tables,
                                          kernel_type(a.kv),
                                          a.n_kv_head,
                                          a.exact_rows};
  kernels::cpu::paged_attention(shape, static_cast<const float*>(qkv), k_cache, v_cache,
                                static_cast<float*>(out));
}

void CpuBackend::rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t cols,
                          float eps) {
  kernels::cpu::rms_norm(x, w, y, rows, cols, eps);
}
void CpuBackend::add_residual_rms_norm(float* x, const float* residual, const float* bias,
                                       const float* w, float* y, int64_t rows, int64_t cols,
                                       float eps) {
  kernels::cpu::add_residual_rms_norm(x, residual, bias, w, y, rows, cols, eps);
}
void CpuBackend::rope(float* x, const int32_t* positions, const float* inv_freq,
                      int64_t n_tokens, int64_t n_heads, int64_t row_stride, int64_t head_dim) {
  kernels::cpu::rope(x, positions, inv_freq, n_tokens, n_heads, row_stride, head_dim);
}
void CpuBackend::silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols) {
  kernels::cpu::silu_mul(gate_up, out, rows, cols);
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace ltm
