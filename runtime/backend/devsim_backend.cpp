#include "runtime/backend/devsim_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ltm {
namespace {

// NaN in every float of [p, p + bytes) (and whatever bytes are left over).
void poison(void* p, size_t bytes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  unsigned char pattern[sizeof(float)];
  std::memcpy(pattern, &nan, sizeof(nan));
  auto* c = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) c[i] = pattern[i % sizeof(float)];
}

// "0x7f..." for messages.
std::string addr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

}  // namespace

// What capture() records: the ops and every device pointer they were handed.
struct DevsimRecording {
  std::vector<std::function<void()>> ops;
  std::vector<const void*> pointers;
};

namespace {

// A captured graph: the recorded ops, run in order as one op of the stream at each replay.
struct DevsimGraph final : BackendGraph {
  std::shared_ptr<void> state;  // keeps the stream alive; drained before the ops go
  std::function<void()> drain;
  DevsimRecording recording;
  ~DevsimGraph() override { drain(); }  // a queued replay still refers to `recording`
};

}  // namespace

void DevsimBackend::State::drain() {
  LTM_ASSERT(capture == nullptr,
             "devsim: the stream was drained (a host wait: synchronize, read_on_host, a freed "
             "buffer or a device communicator's transfer) while capturing a graph; a CUDA graph "
             "capture cannot hold it");
  // Ops may free buffers (whose deleters drain again): run the queue as taken, re-entry is a
  // no-op; ops queued while draining run in the same pass.
  if (draining) return;
  draining = true;
  for (size_t i = 0; i < queue.size(); ++i) {
    std::function<void()> op = std::move(queue[i]);
    op();
  }
  queue.clear();
  draining = false;
}

DevsimBackend::DevsimBackend(int n_threads)
    : inner_(make_cpu_backend(n_threads)), state_(std::make_shared<State>()) {}

DevsimBackend::~DevsimBackend() { synchronize(); }

int64_t DevsimBackend::device_memory_bytes() const {
  static const int64_t mb = [] {
    const char* e = std::getenv("LTM_DEVSIM_MEMORY_MB");
    return e != nullptr ? std::max<int64_t>(0, std::strtoll(e, nullptr, 10)) : int64_t{0};
  }();
  return mb << 20;
}

std::string DevsimBackend::describe() const {
  return absl::StrCat("devsim (emulated device over ", inner_->describe(), ")");
}

bool DevsimBackend::owns(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->buffers.upper_bound(c);
  if (it == state_->buffers.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

size_t DevsimBackend::pending() const { return state_->queue.size(); }

void DevsimBackend::check(const void* p, const char* op) const {
  if (p == nullptr) return;
  LTM_ASSERT(owns(p, 0), "devsim: ", op, " was handed ", addr(p),
             ", which is not device memory of the emulated device (a host pointer on the device)");
  if (state_->capture != nullptr) state_->capture->pointers.push_back(p);
}

bool DevsimBackend::capturing() const { return state_->capture != nullptr; }

std::unique_ptr<BackendGraph> DevsimBackend::capture(const std::function<void()>& ops) {
  LTM_ASSERT(!capturing(), "devsim: capture() inside a capture");
  ops();  // as usual: this step's results (the CPU kernels keep no scratch of their own)
  auto graph = std::make_unique<DevsimGraph>();
  graph->state = state_;
  graph->drain = [state = state_] { state->drain(); };
  state_->capture = &graph->recording;
  ops();  // recorded, not run
  state_->capture = nullptr;
  return graph;
}

void DevsimBackend::replay(BackendGraph& graph) {
  LTM_ASSERT(!capturing(), "devsim: replay() while capturing");
  auto* g = dynamic_cast<DevsimGraph*>(&graph);
  LTM_ASSERT(g != nullptr && g->state == state_,
             "devsim: replay() of a graph another backend made");
  // The registry checks of the ops, again: a buffer freed since the capture would be read or
  // written by the replay (on a GPU: memory reused by something else).
  for (const void* p : g->recording.pointers)
    LTM_ASSERT(owns(p, 0), "devsim: a graph replay would use ", addr(p),
               ", which was device memory at capture and has been freed since");
  DevsimRecording* rec = &g->recording;
  enqueue([rec] {
    for (const std::function<void()>& op : rec->ops) op();
  });
}

bool DevsimBackend::record_if_capturing(std::function<void()> op) {
  if (state_->capture == nullptr) return false;
  state_->capture->ops.push_back(std::move(op));
  return true;
}

DeviceBuffer DevsimBackend::adopt(DeviceBuffer inner) {
  LTM_ASSERT(!capturing(), "devsim: an allocation of ", inner.bytes(),
             " bytes while capturing a graph (size buffers before the capture)");
  void* data = inner.data();
  const size_t bytes = inner.bytes();
  const Precision precision = inner.precision();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->buffers[static_cast<const char*>(data)] = bytes == 0 ? 1 : bytes;
  }
  auto held = std::make_shared<DeviceBuffer>(std::move(inner));
  std::shared_ptr<State> state = state_;
  // Freeing waits for the stream first (as cudaFree does): no queued op reads freed memory.
  std::shared_ptr<void> owner(data, [state, held](void* q) mutable {
    state->drain();
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->buffers.erase(static_cast<const char*>(q));
    }
    held.reset();
  });
  DeviceBuffer out(data, bytes, std::move(owner));
  out.set_precision(precision);
  return out;
}

void DevsimBackend::enqueue(std::function<void()> op) {
  if (state_->capture != nullptr) {
    state_->capture->ops.push_back(std::move(op));
    return;
  }
  state_->queue.push_back(std::move(op));
}

void DevsimBackend::synchronize() { state_->drain(); }

DeviceBuffer DevsimBackend::alloc(size_t bytes) {
  DeviceBuffer buf = inner_->alloc(bytes);
  poison(buf.data(), bytes);  // never-written device memory reads as NaN
  return adopt(std::move(buf));
}

DeviceBuffer DevsimBackend::alloc_zeroed(size_t bytes) {
  return adopt(inner_->alloc_zeroed(bytes));
}

DeviceBuffer DevsimBackend::upload(const void* host, size_t bytes, bool /*host_outlives*/) {
  DeviceBuffer buf = alloc(bytes);  // always a copy, as on a real device
  copy_to_device(buf.data(), host, bytes);
  return buf;
}

DeviceBuffer DevsimBackend::alloc_weight(int64_t k, int64_t n, Precision p) {
  return adopt(inner_->alloc_weight(k, n, p));
}

void DevsimBackend::write_weight_rows(DeviceBuffer& w, const float* rows, int64_t row_begin,
                                      int64_t row_end, int64_t k, int64_t n) {
  check(w.data(), "write_weight_rows");
  synchronize();  // at load: in stream order, then packed at once from the caller's rows
  inner_->write_weight_rows(w, rows, row_begin, row_end, k, n);
}

DeviceBuffer DevsimBackend::alloc_embedding(int64_t rows, int64_t d, Precision p) {
  return adopt(inner_->alloc_embedding(rows, d, p));
}

void DevsimBackend::write_embedding_rows(DeviceBuffer& table, const float* e_rows,
                                         int64_t row_begin, int64_t row_end, int64_t rows,
                                         int64_t d) {
  check(table.data(), "write_embedding_rows");
  synchronize();
  inner_->write_embedding_rows(table, e_rows, row_begin, row_end, rows, d);
}

void DevsimBackend::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  LTM_ASSERT(!capturing(), "devsim: copy_to_device of ", bytes,
             " bytes of host memory while capturing a graph (copy the inputs before replay)");
  LTM_ASSERT(owns(dst, bytes), "devsim: copy_to_device into ", addr(dst), " (", bytes,
             " bytes), which is not device memory of the emulated device");
  ++copies_.h2d;
  copies_.h2d_bytes += bytes;
  auto staged = std::make_shared<std::vector<unsigned char>>(
      static_cast<const unsigned char*>(host_src),
      static_cast<const unsigned char*>(host_src) + bytes);
  enqueue([dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
}

void DevsimBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  LTM_ASSERT(!capturing(), "devsim: copy_to_host of ", bytes, " bytes while capturing a graph");
  LTM_ASSERT(owns(src, bytes), "devsim: copy_to_host from ", addr(src), " (", bytes,
             " bytes), which is not device memory of the emulated device");
  ++copies_.d2h;
  copies_.d2h_bytes += bytes;
  static const char* max_env = std::getenv("LTM_DEVSIM_MAX_COPY_BACK");
  if (max_env != nullptr) {
    const unsigned long long most = std::strtoull(max_env, nullptr, 10);
    LTM_ASSERT(bytes <= most, "devsim: copy_to_host of ", bytes,
               " bytes, more than LTM_DEVSIM_MAX_COPY_BACK=", most);
  }
  LTM_ASSERT(!owns(host_dst, 1), "devsim: copy_to_host into device memory ", addr(host_dst));
  poison(host_dst, bytes);  // what the host sees until the stream gets there
  enqueue([host_dst, src, bytes] { std::memcpy(host_dst, src, bytes); });
}

void DevsimBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  LTM_ASSERT(owns(dst, bytes), "devsim: fill_zero of ", addr(dst), " (", bytes,
             " bytes), which is not device memory of the emulated device");
  enqueue([dst, bytes] { std::memset(dst, 0, bytes); });
}

// --- ops: checked now, run when the stream gets there ---

void DevsimBackend::gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                         bool b_transposed, float beta) {
  check(a, "gemm");
  check(b, "gemm");
  check(c, "gemm");
  Backend* in = inner_.get();
  enqueue([=] { in->gemm(a, b, c, m, n, k, b_transposed, beta); });
}

void DevsimBackend::gemm_rows_nt(const float* a, const float* b, float* c, int64_t m, int64_t n,
                                 int64_t k) {
  check(a, "gemm_rows_nt");
  check(b, "gemm_rows_nt");
  check(c, "gemm_rows_nt");
  Backend* in = inner_.get();
  enqueue([=] { in->gemm_rows_nt(a, b, c, m, n, k); });
}

void DevsimBackend::matmul(const float* a, const DeviceBuffer& w, float* c, int64_t m, int64_t n,
                           int64_t k, float beta) {
  check(a, "matmul");
  check(w.data(), "matmul");
  check(c, "matmul");
  Backend* in = inner_.get();
  const DeviceBuffer* wp = &w;
  enqueue([=] { in->matmul(a, *wp, c, m, n, k, beta); });
}

void DevsimBackend::add_bias(float* x, const float* bias, int64_t rows, int64_t cols) {
  check(x, "add_bias");
  check(bias, "add_bias");
  Backend* in = inner_.get();
  enqueue([=] { in->add_bias(x, bias, rows, cols); });
}

void DevsimBackend::add(float* x, const float* y, int64_t n) {
  check(x, "add");
  check(y, "add");
  Backend* in = inner_.get();
  enqueue([=] { in->add(x, y, n); });
}

void DevsimBackend::bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) {
  check(x, "bias_gelu");
  check(bias, "bias_gelu");
  Backend* in = inner_.get();
  enqueue([=] { in->bias_gelu(x, bias, rows, cols); });
}

void DevsimBackend::layer_norm(const float* x, const float* gamma, const float* beta, float* y,
                               int64_t rows, int64_t cols, float eps) {
  check(x, "layer_norm");
  check(gamma, "layer_norm");
  check(beta, "layer_norm");
  check(y, "layer_norm");
  Backend* in = inner_.get();
  enqueue([=] { in->layer_norm(x, gamma, beta, y, rows, cols, eps); });
}

void DevsimBackend::embedding(const int32_t* ids, const float* table, int64_t row_begin,
                              int64_t row_end, float* out, int64_t n_tokens, int64_t d) {
  check(ids, "embedding");
  check(table, "embedding");
  check(out, "embedding");
  Backend* in = inner_.get();
  enqueue([=] { in->embedding(ids, table, row_begin, row_end, out, n_tokens, d); });
}

void DevsimBackend::embed(const int32_t* ids, const DeviceBuffer& table, int64_t row_begin,
                          int64_t row_end, float* out, int64_t n_tokens, int64_t d) {
  check(ids, "embed");
  check(table.data(), "embed");
  check(out, "embed");
  Backend* in = inner_.get();
  const DeviceBuffer* tp = &table;
  enqueue([=] { in->embed(ids, *tp, row_begin, row_end, out, n_tokens, d); });
}

void DevsimBackend::lm_head(const float* x, const DeviceBuffer& table, float* logits, int64_t m,
                            int64_t rows, int64_t d) {
  check(x, "lm_head");
  check(table.data(), "lm_head");
  check(logits, "lm_head");
  Backend* in = inner_.get();
  const DeviceBuffer* tp = &table;
  enqueue([=] { in->lm_head(x, *tp, logits, m, rows, d); });
}

void DevsimBackend::add_position_embedding(float* x, const float* table, const int32_t* positions,
                                           int64_t n_tokens, int64_t d) {
  check(x, "add_position_embedding");
  check(table, "add_position_embedding");
  check(positions, "add_position_embedding");
  Backend* in = inner_.get();
  enqueue([=] { in->add_position_embedding(x, table, positions, n_tokens, d); });
}

void DevsimBackend::gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n,
                                int64_t d) {
  check(src, "gather_rows");
  check(rows, "gather_rows");
  check(dst, "gather_rows");
  Backend* in = inner_.get();
  enqueue([=] { in->gather_rows(src, rows, dst, n, d); });
}

void DevsimBackend::kv_cache_write(const AttentionArgs& args, const void* qkv, void* k_cache,
                                   void* v_cache) {
  check(qkv, "kv_cache_write");
  check(k_cache, "kv_cache_write");
  check(v_cache, "kv_cache_write");
  check(args.slot_mapping, "kv_cache_write");
  Backend* in = inner_.get();
  enqueue([=] { in->kv_cache_write(args, qkv, k_cache, v_cache); });
}

void DevsimBackend::paged_attention(const AttentionArgs& args, const void* qkv,
                                    const void* k_cache, const void* v_cache, void* out) {
  check(qkv, "paged_attention");
  check(k_cache, "paged_attention");
  check(v_cache, "paged_attention");
  check(out, "paged_attention");
  check(args.token_offsets, "paged_attention");
  check(args.context_lens, "paged_attention");
  check(args.block_tables, "paged_attention");
  Backend* in = inner_.get();
  enqueue([=] { in->paged_attention(args, qkv, k_cache, v_cache, out); });
}

void DevsimBackend::rms_norm(const float* x, const float* w, float* y, int64_t rows,
                             int64_t cols, float eps) {
  check(x, "rms_norm");
  check(w, "rms_norm");
  check(y, "rms_norm");
  Backend* in = inner_.get();
  enqueue([=] { in->rms_norm(x, w, y, rows, cols, eps); });
}

void DevsimBackend::add_residual_rms_norm(float* x, const float* residual, const float* bias,
                                          const float* w, float* y, int64_t rows, int64_t cols,
                                          float eps) {
  check(x, "add_residual_rms_norm");
  check(residual, "add_residual_rms_norm");
  check(bias, "add_residual_rms_norm");
  check(w, "add_residual_rms_norm");
  check(y, "add_residual_rms_norm");
  Backend* in = inner_.get();
  enqueue([=] { in->add_residual_rms_norm(x, residual, bias, w, y, rows, cols, eps); });
}

void DevsimBackend::rope(float* x, const int32_t* positions, const float* inv_freq,
                         int64_t n_tokens, int64_t n_heads, int64_t row_stride, int64_t head_dim) {
  check(x, "rope");
  check(positions, "rope");
  check(inv_freq, "rope");
  Backend* in = inner_.get();
  enqueue([=] { in->rope(x, positions, inv_freq, n_tokens, n_heads, row_stride, head_dim); });
}

void DevsimBackend::silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols) {
  check(gate_up, "silu_mul");
  check(out, "silu_mul");
  Backend* in = inner_.get();
  enqueue([=] { in->silu_mul(gate_up, out, rows, cols); });
}

void DevsimBackend::sample_rows(const SampleRowsArgs& args) {
  if (args.rows <= 0) return;
  check(args.logits, "sample_rows");
  check(args.params, "sample_rows");
  check(args.history, "sample_rows");
  check(args.tokens, "sample_rows");
  check(args.logprobs, "sample_rows");
  Backend* in = inner_.get();
  enqueue([=] { in->sample_rows(args); });
}

void DevsimBackend::select_candidates(const CandidateRowsArgs& args) {
  if (args.rows <= 0) return;
  check(args.logits, "select_candidates");
  check(args.params, "select_candidates");
  check(args.history, "select_candidates");
  check(args.out, "select_candidates");
  Backend* in = inner_.get();
  enqueue([=] { in->select_candidates(args); });
}

std::unique_ptr<Backend> make_devsim_backend(int n_threads) {
  return std::make_unique<DevsimBackend>(n_threads);
}

}  // namespace ltm
