// The CUDA backend: device memory from a stream-ordered pool, cuBLAS GEMMs, kernels/cuda ops.
//
// Everything is enqueued on one stream per backend, created blocking (cudaStreamCreate, not
// ...NonBlocking): work on the legacy default stream (where NcclCommunicator enqueues unless told
// otherwise) is ordered with it in both directions, so a collective on a buffer this backend just
// wrote, and the op after it, need no extra synchronisation.
//
// Memory: cudaMallocAsync / cudaFreeAsync on that stream, from the device's default pool with its
// release threshold raised so that freed memory is cached (a serving step reallocates the same
// sizes every iteration). A DeviceBuffer keeps the stream alive (shared_ptr) and frees its memory
// stream-ordered, so a buffer dropped while a kernel still reads it is safe.
//
// GEMM: C = A B (+ beta C) row-major through the column-major trick: C^T = B^T A^T, i.e. cuBLAS
// computes the [n, m] column-major C from B (as the left operand) and A. float32 compute without
// TF32 by default, so results agree with the CPU backend at ~1e-5 relative; LTM_CUDA_TF32=1 in the
// environment allows TF32 tensor cores (about 8x the FP32 throughput on H100/H200, ~1e-3 relative
// error).
//
// 16-bit weights and KV caches (--weight-dtype / --kv-dtype bf16 or fp16): weights are stored
// [k, n] in 16 bits (rounded to nearest even on the host as they are written) and multiplied by
// cuBLASLt on tensor cores with float32 accumulation (cuda_lt_gemm.h). With 16-bit weights the
// activations between ops are 16-bit too (activation_precision(): the weights' type): LayerNorm
// writes them rounded once, the GEMMs read them as they are and write their result rounded once
// (bias, and bias + GELU, in cuBLASLt's epilogue), attention reads Q and writes its output in
// them; every sum, norm statistic and softmax is float32. The residual stream (`hidden`), TP
// partial sums and the logits stay float32 (docs/architecture.md says why). LTM_CUDA_F32_ACT=1
// keeps float32 activations (each 16-bit GEMM then rounds its input into a scratch buffer first),
// for comparisons. The embedding table is 16-bit too (embed() converts rows, lm_head() is a
// cuBLASLt GEMM). KV caches of 16-bit elements are written and read by the attention kernels
// directly (kernels/cuda/attention.h), halving decode's cache traffic.
//
// int8 weights (--weight-dtype int8): uploaded by cuda_int8.h, with fp16 activations; GEMMs of
// up to kInt8GemvMaxRows rows stream the quants through a kernel of our own, up to
// kInt8MmaMaxRows multiply them as exact fp16 integers on the tensor cores (int8_mma.h), more
// rows (prefill) dequantize the weight into an fp16 scratch and run cuBLASLt on it (matmul_int8).
//
// Packaging: this file is built into its own shared library, libltm_backend_cuda.so (a plugin
// that make_cuda_backend loads with dlopen), so that CPU ranks never load the CUDA libraries:
// libcublasLt alone cost ~200 MB of resident memory at start-up in every process.
//
// Failure: a CUDA or cuBLAS error prints "ltm: <host>: CUDA error <name> at file:line: <message>"
// (or "cuBLAS error") and aborts.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/int8_gemm.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/llama_ops.h"
#include "kernels/cuda/sampling.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/cublas_check.h"
#include "runtime/backend/cuda_graph.h"
#include "runtime/backend/cuda_int8.h"
#include "runtime/backend/cuda_lt_gemm.h"
#include "runtime/model/dtype.h"

namespace ltm {
namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0 ||
                          std::strcmp(v, "on") == 0 || std::strcmp(v, "yes") == 0);
}

// Makes `device` current on the calling thread (the backend may be built on one thread and used
// on another).
void use_device(int device) {
  int current = -1;
  LTM_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) LTM_CUDA_CHECK(cudaSetDevice(device));
}

// The stream every op of a backend runs on. Shared by the backend and every DeviceBuffer it made,
// so buffers may outlive the backend.
struct StreamContext {
  int device = 0;
  cudaStream_t stream = nullptr;

  explicit StreamContext(int d) : device(d) {
    use_device(device);
    LTM_CUDA_CHECK(cudaStreamCreate(&stream));
  }
  ~StreamContext() {
    // At process exit the runtime may already be unloading; nothing useful to report then.
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;
};

kernels::cuda::ElemType elem_type(Precision p) {
  switch (p) {
    case Precision::kF32: return kernels::cuda::ElemType::kF32;
    case Precision::kBF16: return kernels::cuda::ElemType::kBF16;
    case Precision::kF16: return kernels::cuda::ElemType::kF16;
    case Precision::kInt8: break;  // weights only: activations are fp16 (activation_precision)
  }
  return kernels::cuda::ElemType::kF32;
}

cudaDataType_t lt_type(Precision p) { return p == Precision::kBF16 ? CUDA_R_16BF : CUDA_R_16F; }

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const cudaDeviceProp& prop)
      : device_(device), ctx_(std::make_shared<StreamContext>(device)) {
    allow_tf32_ = env_flag("LTM_CUDA_TF32");
    f32_activations_ = env_flag("LTM_CUDA_F32_ACT");
    name_ = absl::StrCat("cuda:", device, " (", prop.name, ", ",
                         prop.totalGlobalMem / (size_t{1} << 30), " GiB, sm_", prop.major,
                         prop.minor, ", cuBLAS fp32", allow_tf32_ ? " TF32" : "",
                         ", cuBLASLt bf16/fp16", f32_activations_ ? ", fp32 activations" : "",
                         ")");
    // Keep freed pool memory cached instead of returning it to the driver at each sync.
    cudaMemPool_t pool;
    LTM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = UINT64_MAX;
    LTM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    LTM_CUBLAS_CHECK(cublasCreate(&cublas_));
    LTM_CUBLAS_CHECK(cublasSetStream(cublas_, ctx_->stream));
    // A workspace of our own (after cublasSetStream, which resets it): cuBLAS then allocates
    // nothing while a graph is captured.
    LTM_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    LTM_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
    LTM_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    lt_ = std::make_unique<LtGemm>(device);
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(ctx_->stream);
    for (PinnedSlot& slot : pinned_) {
      if (slot.event) cudaEventDestroy(slot.event);
      if (slot.data) cudaFreeHost(slot.data);
    }
    lt_.reset();
    cublasDestroy(cublas_);
    if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string describe() const override { return name_; }
  // f32, bf16, fp16 and int8 weights (kernels/cuda/int8_gemm.h); f32, bf16 and fp16 caches.
  bool supports(Precision w, Precision kv) const override { return kv != Precision::kInt8; }
  // 16-bit weights: activations of the same type (cuBLASLt multiplies two operands of one type);
  // int8 weights: fp16 (the type their many-row GEMMs dequantize into).
  Precision activation_precision(Precision weights) const override {
    if (f32_activations_) return Precision::kF32;
    return device_activation_precision(weights);
  }
  int64_t device_memory_bytes() const override {
    size_t free_bytes = 0, total_bytes = 0;
    cudaSetDevice(device_);
    return cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess
               ? static_cast<int64_t>(total_bytes) : 0;
  }
  bool supports_head_dim(int64_t head_dim, int64_t* max_head_dim) const override {
    *max_head_dim = 256;  // the prefill kernel's shared tiles; decode reads float4 above 128
    return head_dim <= 128 || (head_dim <= *max_head_dim && head_dim % 4 == 0);
  }

  // TF32 for GEMMs (off unless LTM_CUDA_TF32 is set); takes effect at the next gemm.
  void set_allow_tf32(bool allow) { allow_tf32_ = allow; }

  // --- memory ---
  DeviceBuffer alloc(size_t bytes) override {
    LTM_ASSERT(!capturing_, "CUDA backend: an allocation of ", bytes,
               " bytes while capturing a graph (buffers are sized before the capture)");
    use_device(device_);
    void* p = nullptr;
    // A 0-byte request still gets a distinct, freeable pointer.
    LTM_CUDA_CHECK(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, ctx_->stream));
    std::shared_ptr<StreamContext> ctx = ctx_;
    return DeviceBuffer(p, bytes, std::shared_ptr<void>(p, [ctx](void* q) {
                          // Freed in stream order: kernels already enqueued may still read q.
                          int previous = -1;
                          cudaGetDevice(&previous);
                          if (previous != ctx->device) cudaSetDevice(ctx->device);
                          const cudaError_t e = cudaFreeAsync(q, ctx->stream);
                          if (previous >= 0 && previous != ctx->device) cudaSetDevice(previous);
                          // At process exit the runtime may be unloading already: nothing to free.
                          if (e != cudaSuccess && e != cudaErrorCudartUnloading)
                            kernels::cuda::cuda_fail(e, "cudaFreeAsync", __FILE__, __LINE__);
                        }));
  }

  DeviceBuffer upload(const void* host, size_t bytes, bool /*host_outlives*/) override {
    DeviceBuffer buf = alloc(bytes);  // always a copy: device memory never aliases the host
    copy_to_device(buf.data(), host, bytes);
    return buf;
  }

  // Pageable host memory is staged by the driver before this returns, so `host` may be reused
  // at once; the copy itself completes in stream order.
  void copy_to_device(void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return;
    LTM_ASSERT(!capturing_, "CUDA backend: copy_to_device of ", bytes,
               " bytes of host memory while capturing a graph");
    use_device(device_);
    LTM_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx_->stream));
  }

  // A step's host arrays (stage_i32, and the sample op's inputs in one piece) go through pinned
  // memory: one asynchronous copy each, without the driver's pageable bounce. A ring of pinned
  // slots, each reused only once the copy that last read it has completed (its event; in a
  // steady state long before), so the caller's array may change at once, as with the default.
  const void* stage_bytes(const void* host, size_t bytes, DeviceBuffer& staging) override {
    const size_t need = std::max<size_t>(bytes, 1);
    if (staging.bytes() < need) staging = alloc(std::max(need, staging.bytes() * 2));
    if (bytes == 0) return staging.data();
    use_device(device_);
    PinnedSlot& slot = pinned_[next_pinned_];
    next_pinned_ = (next_pinned_ + 1) % kPinnedSlots;
    if (slot.event == nullptr) {
      LTM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.event, cudaEventDisableTiming));
    } else {
      LTM_CUDA_CHECK(cudaEventSynchronize(slot.event));  // its last copy has read it
    }
    if (slot.bytes < bytes) {
      if (slot.data) LTM_CUDA_CHECK(cudaFreeHost(slot.data));
      slot.bytes = std::max(bytes, slot.bytes * 2);
      LTM_CUDA_CHECK(cudaMallocHost(&slot.data, slot.bytes));
    }
    std::memcpy(slot.data, host, bytes);
    LTM_CUDA_CHECK(cudaMemcpyAsync(staging.data(), slot.data, bytes, cudaMemcpyHostToDevice,
                                   ctx_->stream));
    LTM_CUDA_CHECK(cudaEventRecord(slot.event, ctx_->stream));
    return staging.data();
  }

  void copy_to_host(void* host, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    LTM_ASSERT(!capturing_, "CUDA backend: copy_to_host of ", bytes,
               " bytes while capturing a graph");
    use_device(device_);
    LTM_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx_->stream));
  }

  void fill_zero(void* dst, size_t bytes) override {
    if (bytes == 0) return;
    use_device(device_);
    LTM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, ctx_->stream));
  }

  void synchronize() override {
    LTM_ASSERT(!capturing_, "CUDA backend: synchronize() (a host wait) while capturing a graph");
    use_device(device_);
    LTM_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  }

  bool comm_on_device() const override { return true; }
  // The compute stream: the NCCL communicator enqueues its collectives and transfers on it.
  void* stream() override { return ctx_->stream; }

  // --- CUDA graphs (cuda_graph.h) ---
  bool supports_graphs() const override { return true; }
  std::unique_ptr<BackendGraph> capture(const std::function<void()>& ops) override {
    LTM_ASSERT(!capturing_, "CUDA backend: capture() inside a capture");
    use_device(device_);
    // The scratch that ops grow lazily (scratch_buffers(): attention workspace, 16-bit
    // activations and biases) is the graphs' own, not the eager steps': every graph keeps the
    // buffers it recorded, so no later step may reallocate them. The graphs share it (they run
    // one at a time on the stream): the eager run grows it when this graph needs more, and
    // older graphs keep the smaller ones.
    const std::array<DeviceBuffer*, kScratchBuffers> scratch = scratch_buffers();
    std::array<DeviceBuffer, kScratchBuffers> eager;
    for (size_t i = 0; i < scratch.size(); ++i)
      eager[i] = std::exchange(*scratch[i], view(graph_scratch_[i]));
    ops();  // as usual: this step's results, and the scratch sized for it
    capturing_ = true;
    begin_stream_capture(ctx_->stream);
    ops();  // recorded, not run
    std::unique_ptr<CudaGraph> graph = end_stream_capture(ctx_->stream, device_);
    capturing_ = false;
    for (size_t i = 0; i < scratch.size(); ++i) {
      keep_grown(*scratch[i], graph_scratch_[i]);
      graph->scratch.push_back(graph_scratch_[i]);
      *scratch[i] = std::move(eager[i]);
    }
    return graph;
  }
  void replay(BackendGraph& graph) override {
    LTM_ASSERT(!capturing_, "CUDA backend: replay() while capturing");
    auto* g = dynamic_cast<CudaGraph*>(&graph);
    LTM_ASSERT(g != nullptr && g->device() == device_, "CUDA backend: replay() of a graph "
               "another backend made");
    use_device(device_);
    g->launch(ctx_->stream);
  }

  // --- 16-bit weights: [k, n] (or [rows, d]) as in the checkpoint, 2 bytes an element ---
  // --- int8 weights: n columns of k quants, then their scales (kernels/cuda/int8_gemm.h) ---
  DeviceBuffer alloc_weight(int64_t k, int64_t n, Precision p) override {
    if (p == Precision::kF32) return Backend::alloc_weight(k, n, p);
    DeviceBuffer w = alloc(p == Precision::kInt8 ? kernels::cuda::int8_weight_bytes(n, k)
                                                 : static_cast<size_t>(k * n) * precision_size(p));
    w.set_precision(p);
    return w;
  }
  void write_weight_rows(DeviceBuffer& w, const float* rows, int64_t row_begin, int64_t row_end,
                         int64_t k, int64_t n) override {
    if (w.precision() == Precision::kF32)
      return Backend::write_weight_rows(w, rows, row_begin, row_end, k, n);
    if (w.precision() == Precision::kInt8) {
      use_device(device_);
      return int8_uploader_.write_rows(w.data(), w.bytes(), rows, row_begin, row_end, k, n,
                                       ctx_->stream);
    }
    LTM_ASSERT(0 <= row_begin && row_begin <= row_end && row_end <= k &&
               w.bytes() >= static_cast<size_t>(k * n) * 2);
    const int64_t count = (row_end - row_begin) * n;
    weight_staging_.resize(static_cast<size_t>(count));
    const bool bf16 = w.precision() == Precision::kBF16;
    for (int64_t i = 0; i < count; ++i)
      weight_staging_[i] = bf16 ? f32_to_bf16(rows[i]) : f32_to_f16(rows[i]);
    copy_to_device(static_cast<uint16_t*>(w.data()) + row_begin * n, weight_staging_.data(),
                   static_cast<size_t>(count) * 2);
    synchronize();  // weight_staging_ is rewritten by the next call (loading is not hot)
  }
  // The tied embedding E [rows, d]: 16-bit [rows, d] as the default keeps it; int8 as a weight of
  // n = rows columns of k = d (a row of E is a column of E^T, lm_head's weight).
  DeviceBuffer alloc_embedding(int64_t rows, int64_t d, Precision p) override {
    return p == Precision::kInt8 ? alloc_weight(d, rows, p) : Backend::alloc_embedding(rows, d, p);
  }
  void write_embedding_rows(DeviceBuffer& table, const float* e_rows, int64_t row_begin,
                            int64_t row_end, int64_t rows, int64_t d) override {
    if (table.precision() != Precision::kInt8)
      return Backend::write_embedding_rows(table, e_rows, row_begin, row_end, rows, d);
    use_device(device_);
    int8_uploader_.write_table_rows(table.data(), table.bytes(), e_rows, row_begin, row_end, rows,
                                    d, ctx_->stream);
  }

  // --- ops ---
  void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
            bool b_transposed, float beta) override {
    if (m <= 0 || n <= 0) return;
    use_device(device_);
    if (k <= 0) {  // A B is empty: C = beta C
      LTM_ASSERT(beta == 0.0f || beta == 1.0f, "gemm with k = 0 and beta ", beta);
      if (beta == 0.0f) fill_zero(c, static_cast<size_t>(m * n) * sizeof(float));
      return;
    }
    const float alpha = 1.0f;
    // Column-major view: C^T [n, m] = op(B^T) [n, k] x A^T [k, m]. B [k, n] row-major is B^T
    // column-major with ld n (no transpose); B [n, k] row-major needs op = T with ld k.
    const cublasOperation_t op_b = b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t ld_b = b_transposed ? k : n;
    const cublasComputeType_t compute =
        allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LTM_CUBLAS_CHECK(cublasGemmEx_64(cublas_, op_b, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_32F,
                                     ld_b, a, CUDA_R_32F, k, &beta, c, CUDA_R_32F, n, compute,
                                     CUBLAS_GEMM_DEFAULT));
  }

  // C[m, n] = A[m, k] W (+ beta C): fp32 W through cuBLAS; 16-bit W through cuBLASLt, after
  // rounding A to W's type (column-major C^T [n, m] = W^T [n, k] A^T [k, m]).
  void matmul(const float* a, const DeviceBuffer& w, float* c, int64_t m, int64_t n, int64_t k,
              float beta) override {
    if (w.precision() == Precision::kF32) return gemm(a, w.f32(), c, m, n, k, false, beta);
    if (m <= 0 || n <= 0) return;
    use_device(device_);
    if (k <= 0) return gemm(a, nullptr, c, m, n, k, false, beta);  // C = beta C
    if (w.precision() == Precision::kInt8)
      return matmul_int8(Act(const_cast<float*>(a)), w, Act(c), m, n, k, beta, nullptr,
                         Epilogue::kNone);
    const void* a16 = activations_16(a, m * k, w.precision());
    lt_->run(w.data(), /*a_trans=*/false, a16, c, n, m, k, lt_type(w.precision()), beta,
             ctx_->stream);
  }
  // logits[m, rows] = x[m, d] E^T: C^T [rows, m] = E [rows, d] (stored [d, rows] column-major,
  // hence transposed) x^T [d, m].
  void lm_head(const float* x, const DeviceBuffer& table, float* logits, int64_t m, int64_t rows,
               int64_t d) override {
    if (table.precision() == Precision::kF32)
      return gemm(x, table.f32(), logits, m, rows, d, true, 0.0f);
    if (m <= 0 || rows <= 0) return;
    use_device(device_);
    if (d <= 0) return gemm(x, nullptr, logits, m, rows, d, true, 0.0f);
    if (table.precision() == Precision::kInt8)  // E [rows, d] is the int8 weight of E^T
      return matmul_int8(Act(const_cast<float*>(x)), table, Act(logits), m, rows, d, 0.0f,
                         nullptr, Epilogue::kNone);
    const void* x16 = activations_16(x, m * d, table.precision());
    lt_->run(table.data(), /*a_trans=*/true, x16, logits, rows, m, d, lt_type(table.precision()),
             0.0f, ctx_->stream);
  }
  void embed(const int32_t* ids, const DeviceBuffer& table, int64_t row_begin, int64_t row_end,
             float* out, int64_t n_tokens, int64_t d) override {
    use_device(device_);
    if (table.precision() == Precision::kInt8)
      return kernels::cuda::int8_embedding(
          ids, kernels::cuda::int8_weight(table.data(), row_end - row_begin, d), row_begin,
          row_end, out, n_tokens, ctx_->stream);
    kernels::cuda::embedding(ids, table.data(), elem_type(table.precision()), row_begin, row_end,
                             out, n_tokens, d, ctx_->stream);
  }

  void add_bias(float* x, const float* bias, int64_t rows, int64_t cols) override {
    use_device(device_);
    kernels::cuda::add_bias(x, bias, rows, cols, ctx_->stream);
  }
  void add(float* x, const float* y, int64_t n) override {
    use_device(device_);
    kernels::cuda::add(x, y, n, ctx_->stream);
  }
  void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) override {
    use_device(device_);
    kernels::cuda::bias_gelu(x, bias, rows, cols, ctx_->stream);
  }
  void layer_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                  int64_t cols, float eps) override {
    layer_norm_act(x, gamma, beta, y, rows, cols, eps);
  }
  void add_bias_residual_layer_norm(float* x, float* residual, const float* bias,
                                    const float* gamma, const float* beta, float* y, int64_t rows,
                                    int64_t cols, float eps) override {
    add_bias_residual_layer_norm_act(x, residual, bias, gamma, beta, y, rows, cols, eps);
  }

  // --- activations of activation_precision() ---
  // C = epilogue(A W + beta C): one cuBLASLt GEMM with the epilogue fused where cuBLASLt has an
  // algorithm for it, else the GEMM and then the epilogue as a kernel.
  void matmul_act(Act a, const DeviceBuffer& w, Act c, int64_t m, int64_t n, int64_t k,
                  float beta, const float* bias, Epilogue epilogue,
                  const void* bias_act) override {
    const Precision wp = w.precision();
    if (m <= 0 || n <= 0) return;
    // fp32 weights (fp32 activations), or the degenerate k = 0 (C = beta C, fp32 only).
    if (wp == Precision::kF32 || k <= 0)
      return Backend::matmul_act(a, w, c, m, n, k, beta, bias, epilogue);
    if (wp == Precision::kInt8)
      return matmul_int8(a, w, c, m, n, k, beta, bias, epilogue, bias_act);
    LTM_ASSERT((a.type == Precision::kF32 || a.type == wp) &&
                   (c.type == Precision::kF32 || c.type == wp),
               "matmul of ", precision_name(wp), " weights: activations ", precision_name(a.type),
               " -> ", precision_name(c.type), " (each must be f32 or the weights' type)");
    LTM_ASSERT(epilogue == Epilogue::kNone || bias != nullptr, "bias epilogue without a bias");
    use_device(device_);
    const void* a16 = a.type == wp ? a.data : activations_16(a.f32(), m * k, wp);
    lt_epilogue(w.data(), /*w_trans=*/false, wp, a16, c, m, n, k, beta, bias, epilogue, bias_act);
  }
  // cuBLASLt's bias epilogue takes the output's type: 16-bit activations get a 16-bit copy, made
  // once (the same rounding as bias_16's at every call). LTM_CUDA_BIAS_AT_LOAD=0 makes none (the
  // rounding at every call, as before 2026-12-06), to compare in one run.
  DeviceBuffer epilogue_bias(const DeviceBuffer& bias, int64_t n, Precision act) override {
    static const bool at_load = [] {
      const char* e = std::getenv("LTM_CUDA_BIAS_AT_LOAD");
      return !(e != nullptr && std::strcmp(e, "0") == 0);
    }();
    if (!at_load || bias.empty() || n <= 0 || act == Precision::kF32) return {};
    LTM_ASSERT(act == Precision::kBF16 || act == Precision::kF16, "epilogue bias of ",
               precision_name(act));
    use_device(device_);
    DeviceBuffer out = alloc(static_cast<size_t>(n) * 2);
    kernels::cuda::convert_from_f32(bias.f32(), out.data(), elem_type(act), n, ctx_->stream);
    return out;
  }
  void layer_norm_act(const float* x, const float* gamma, const float* beta, Act y, int64_t rows,
                      int64_t cols, float eps) override {
    use_device(device_);
    kernels::cuda::layer_norm(x, gamma, beta, y.data, elem_type(y.type), rows, cols, eps,
                              ctx_->stream);
  }
  void add_bias_residual_layer_norm_act(float* x, float* residual, const float* bias,
                                        const float* gamma, const float* beta, Act y,
                                        int64_t rows, int64_t cols, float eps) override {
    use_device(device_);
    kernels::cuda::add_bias_residual_layer_norm(x, residual, bias, gamma, beta, y.data,
                                                elem_type(y.type), rows, cols, eps, ctx_->stream);
  }
  // --- the Llama family (kernels/cuda/llama_ops.h; grouped-query attention in attention.h) ---
  bool supports_llama() const override { return true; }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t cols,
                float eps) override {
    rms_norm_act(x, w, y, rows, cols, eps);
  }
  void add_residual_rms_norm(float* x, const float* residual, const float* bias, const float* w,
                             float* y, int64_t rows, int64_t cols, float eps) override {
    add_residual_rms_norm_act(x, residual, bias, w, y, rows, cols, eps);
  }
  void rope(float* x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
            int64_t n_heads, int64_t row_stride, int64_t head_dim) override {
    rope_act(x, positions, inv_freq, n_tokens, n_heads, row_stride, head_dim);
  }
  void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols) override {
    silu_mul_act(Act(const_cast<float*>(gate_up)), out, rows, cols);
  }
  void rms_norm_act(const float* x, const float* w, Act y, int64_t rows, int64_t cols,
                    float eps) override {
    use_device(device_);
    kernels::cuda::rms_norm(x, w, y.data, elem_type(y.type), rows, cols, eps, ctx_->stream);
  }
  void add_residual_rms_norm_act(float* x, const float* residual, const float* bias,
                                 const float* w, Act y, int64_t rows, int64_t cols,
                                 float eps) override {
    use_device(device_);
    kernels::cuda::add_residual_rms_norm(x, residual, bias, w, y.data, elem_type(y.type), rows,
                                         cols, eps, ctx_->stream);
  }
  void rope_act(Act x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
                int64_t n_heads, int64_t row_stride, int64_t head_dim) override {
    use_device(device_);
    kernels::cuda::rope(x.data, elem_type(x.type), positions, inv_freq, n_tokens, n_heads,
                        row_stride, head_dim, ctx_->stream);
  }
  void silu_mul_act(Act gate_up, Act out, int64_t rows, int64_t cols) override {
    LTM_ASSERT(gate_up.type == out.type, "silu_mul: ", precision_name(gate_up.type), " in, ",
               precision_name(out.type), " out");
    use_device(device_);
    kernels::cuda::silu_mul(gate_up.data, out.data, elem_type(out.type), rows, cols,
                            ctx_->stream);
  }

  void add_bias_act(Act x, const float* bias, int64_t rows, int64_t cols) override {
    use_device(device_);
    kernels::cuda::add_bias(x.data, elem_type(x.type), bias, rows, cols, ctx_->stream);
  }
  void bias_gelu_act(Act x, const float* bias, int64_t rows, int64_t cols) override {
    use_device(device_);
    kernels::cuda::bias_gelu(x.data, elem_type(x.type), bias, rows, cols, ctx_->stream);
  }
  void act_to_f32(Act x, float* out, int64_t n) override {
    use_device(device_);
    kernels::cuda::convert_to_f32(x.data, elem_type(x.type), out, n, ctx_->stream);
  }
  void add_f32_to_act(Act x, const float* y, int64_t n) override {
    use_device(device_);
    kernels::cuda::add(x.data, elem_type(x.type), y, n, ctx_->stream);
  }
  void embedding(const int32_t* ids, const float* table, int64_t row_begin, int64_t row_end,
                 float* out, int64_t n_tokens, int64_t d) override {
    use_device(device_);
    kernels::cuda::embedding(ids, table, row_begin, row_end, out, n_tokens, d, ctx_->stream);
  }
  void add_position_embedding(float* x, const float* table, const int32_t* positions,
                              int64_t n_tokens, int64_t d) override {
    use_device(device_);
    kernels::cuda::add_position_embedding(x, table, positions, n_tokens, d, ctx_->stream);
  }
  void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n,
                   int64_t d) override {
    use_device(device_);
    kernels::cuda::gather_rows(src, rows, dst, n, d, ctx_->stream);
  }
  void kv_cache_write(const AttentionArgs& a, const void* qkv, void* k_cache,
                      void* v_cache) override {
    use_device(device_);
    kernels::cuda::kv_cache_write(qkv, elem_type(a.act), a.slot_mapping, a.n_tokens, a.n_head,
                                  a.n_kv_head,
                                  a.head_dim, a.block_size, k_cache, v_cache, elem_type(a.kv),
                                  ctx_->stream);
  }
  // The device sampler (kernels/cuda/sampling.h): the host sampler's tokens; its workspace
  // grows to the largest batch seen and is then reused (no allocation in a steady state).
  void sample_rows(const SampleRowsArgs& a) override {
    if (a.rows <= 0) return;
    use_device(device_);
    const size_t need = kernels::cuda::sample_rows_workspace_bytes(a.vocab, a.rows);
    if (need > sample_workspace_.bytes()) sample_workspace_ = alloc(need);
    kernels::cuda::sample_rows(a, sample_workspace_.data(), sample_workspace_.bytes(),
                               ctx_->stream);
  }

  // tp > 1: this rank's candidates of every row (kernels/cuda/sampling.h), in the sampler's
  // workspace.
  void select_candidates(const CandidateRowsArgs& a) override {
    if (a.rows <= 0) return;
    use_device(device_);
    const size_t need = kernels::cuda::sample_rows_workspace_bytes(a.valid, a.rows);
    if (need > sample_workspace_.bytes()) sample_workspace_ = alloc(need);
    kernels::cuda::select_candidates(a, sample_workspace_.data(), sample_workspace_.bytes(),
                                     ctx_->stream);
  }

  void paged_attention(const AttentionArgs& a, const void* qkv, const void* k_cache,
                       const void* v_cache, void* out) override {
    if (a.n_tokens == 0) return;
    // The kernels size their grids from these host hints; a stale hint would drop rows silently.
    LTM_ASSERT(a.max_new_tokens >= 1 && a.max_new_tokens <= a.n_tokens &&
                   a.max_context_len >= a.max_new_tokens,
               "AttentionArgs hints: max_new_tokens ", a.max_new_tokens, ", n_tokens ", a.n_tokens,
               ", max_context_len ", a.max_context_len);
    use_device(device_);
    kernels::cuda::PagedAttentionShape shape;
    shape.n_seqs = a.n_seqs;
    shape.n_head = a.n_head;
    shape.n_kv_head = a.n_kv_head;
    shape.head_dim = a.head_dim;
    shape.block_size = a.block_size;
    shape.max_blocks_per_seq = a.max_blocks_per_seq;
    shape.max_context_len = a.max_context_len;
    shape.max_new_tokens = a.max_new_tokens;
    shape.token_offsets = a.token_offsets;
    shape.context_lens = a.context_lens;
    shape.block_tables = a.block_tables;
    shape.kv = elem_type(a.kv);
    shape.act = elem_type(a.act);
    const size_t need = kernels::cuda::paged_attention_workspace_bytes(shape);
    // Grows geometrically; the old buffer is freed in stream order, after the kernels using it.
    if (need > workspace_.bytes()) workspace_ = alloc(need * 2);
    kernels::cuda::paged_attention(shape, qkv, k_cache, v_cache, out,
                                   need ? workspace_.data() : nullptr, ctx_->stream);
  }

 private:
  // C = epilogue(A W + beta C) for an int8 W [k, n] (int8_gemm.h): the weight-streaming kernel up
  // to kInt8GemvMaxRows rows of A; up to kInt8MmaMaxRows the int8 x fp16 tensor-core kernel
  // (int8_scratch_ holds its split-k partial sums); more rows (or LTM_CUDA_INT8_MMA=0, or a GPU
  // before sm_80) dequantize W into int8_scratch_ ([n, k] fp16) and multiply on tensor cores as
  // a 16-bit weight read transposed (lm_head's table).
  void matmul_int8(Act a, const DeviceBuffer& w, Act c, int64_t m, int64_t n, int64_t k,
                   float beta, const float* bias, Epilogue epilogue,
                   const void* bias_act = nullptr) {
    LTM_ASSERT((a.type == Precision::kF32 || a.type == Precision::kF16) &&
                   (c.type == Precision::kF32 || c.type == Precision::kF16),
               "matmul of int8 weights: activations ", precision_name(a.type), " -> ",
               precision_name(c.type), " (each must be f32 or fp16)");
    LTM_ASSERT(epilogue == Epilogue::kNone || bias != nullptr, "bias epilogue without a bias");
    use_device(device_);
    const kernels::cuda::Int8Weight v = kernels::cuda::int8_weight(w.data(), n, k);
    if (m <= kernels::cuda::kInt8GemvMaxRows) {
      kernels::cuda::int8_gemv(a.data, elem_type(a.type), v, c.data, elem_type(c.type), m, beta,
                               epilogue == Epilogue::kNone ? nullptr : bias,
                               epilogue == Epilogue::kBiasGelu, ctx_->stream);
      return;
    }
    const void* a16 = a.type == Precision::kF16 ? a.data
                                                : activations_16(a.f32(), m * k, Precision::kF16);
    if (m <= kernels::cuda::kInt8MmaMaxRows && kernels::cuda::int8_mma_available()) {
      const size_t part = kernels::cuda::int8_mma_workspace_bytes(m, n, k);
      if (part > int8_scratch_.bytes()) int8_scratch_ = alloc(part);
      kernels::cuda::int8_gemm_mma(a16, v, c.data, elem_type(c.type), m, beta,
                                   epilogue == Epilogue::kNone ? nullptr : bias,
                                   epilogue == Epilogue::kBiasGelu,
                                   part ? int8_scratch_.data() : nullptr, ctx_->stream);
      return;
    }
    const size_t need = static_cast<size_t>(n * k) * 2;
    if (need > int8_scratch_.bytes()) int8_scratch_ = alloc(std::max(need, int8_scratch_.bytes()));
    kernels::cuda::int8_dequantize(v, int8_scratch_.data(), kernels::cuda::ElemType::kF16,
                                   ctx_->stream);
    lt_epilogue(int8_scratch_.data(), /*w_trans=*/true, Precision::kF16, a16, c, m, n, k, beta,
                bias, epilogue, bias_act);
  }

  // C = epilogue(A16 W16 + beta C) on cuBLASLt for a 16-bit W of `wp` ([k, n], or [n, k] when
  // w_trans) and A16 of the same type: the epilogue fused where cuBLASLt has an algorithm for it
  // (its bias is of D's type: a 16-bit C takes epilogue_bias()'s copy, bias_act, or the bias
  // rounded into bias16_ now), else the plain GEMM and the epilogue as a kernel.
  void lt_epilogue(const void* w16, bool w_trans, Precision wp, const void* a16, Act c, int64_t m,
                   int64_t n, int64_t k, float beta, const float* bias, Epilogue epilogue,
                   const void* bias_act) {
    const cudaDataType_t d_type = c.type == Precision::kF32 ? CUDA_R_32F : lt_type(wp);
    if (epilogue != Epilogue::kNone) {
      const void* b = c.type == Precision::kF32 ? static_cast<const void*>(bias)
                      : bias_act != nullptr     ? bias_act
                                                : bias_16(bias, n, wp);
      const LtEpilogue e =
          epilogue == Epilogue::kBias ? LtEpilogue::kBias : LtEpilogue::kGeluBias;
      if (lt_->run(w16, w_trans, a16, c.data, d_type, n, m, k, lt_type(wp), beta, e, b,
                   ctx_->stream))
        return;
    }
    lt_->run(w16, w_trans, a16, c.data, d_type, n, m, k, lt_type(wp), beta, LtEpilogue::kNone,
             nullptr, ctx_->stream);
    if (epilogue == Epilogue::kBias) add_bias_act(c, bias, m, n);
    if (epilogue == Epilogue::kBiasGelu) bias_gelu_act(c, bias, m, n);
  }

  // bias (n floats) rounded to `p` in bias16_, for a 16-bit cuBLASLt epilogue (whose bias is of
  // D's type).
  const void* bias_16(const float* bias, int64_t n, Precision p) {
    const size_t need = static_cast<size_t>(n) * 2;
    if (need > bias16_.bytes()) bias16_ = alloc(std::max(need, bias16_.bytes() * 2));
    kernels::cuda::convert_from_f32(bias, bias16_.data(), elem_type(p), n, ctx_->stream);
    return bias16_.data();
  }

  // x (n floats) rounded to `p` in act16_ (grown geometrically, freed in stream order).
  const void* activations_16(const float* x, int64_t n, Precision p) {
    const size_t need = static_cast<size_t>(n) * 2;
    if (need > act16_.bytes()) act16_ = alloc(std::max(need, act16_.bytes() * 2));
    kernels::cuda::convert_from_f32(x, act16_.data(), elem_type(p), n, ctx_->stream);
    return act16_.data();
  }

  int device_;
  std::shared_ptr<StreamContext> ctx_;
  cublasHandle_t cublas_ = nullptr;
  bool allow_tf32_ = false;
  bool f32_activations_ = false;  // LTM_CUDA_F32_ACT: fp32 activations with 16-bit weights
  std::string name_;
  DeviceBuffer workspace_;  // attention scratch (decode partitions), reused across calls
  DeviceBuffer sample_workspace_;  // sample_rows' scratch
  struct PinnedSlot {
    void* data = nullptr;  // cudaMallocHost
    size_t bytes = 0;
    cudaEvent_t event = nullptr;  // recorded after the copy that last read `data`
  };
  static constexpr int kPinnedSlots = 16;  // more than the arrays one step stages
  PinnedSlot pinned_[kPinnedSlots];
  int next_pinned_ = 0;
  std::unique_ptr<LtGemm> lt_;           // 16-bit GEMMs
  DeviceBuffer act16_;                   // fp32 activations rounded to 16 bits for lt_
  DeviceBuffer bias16_;                  // a bias rounded to 16 bits for a 16-bit epilogue
  std::vector<uint16_t> weight_staging_;  // 16-bit rows on their way to the device
  CudaInt8Uploader int8_uploader_;        // int8 rows on their way to the device
  DeviceBuffer int8_scratch_;             // an int8 weight dequantized for a many-row GEMM
  // A buffer that does not own its memory, seen through `b` (empty when b is null).
  static DeviceBuffer view(const std::shared_ptr<DeviceBuffer>& b) {
    return b ? DeviceBuffer(b->data(), b->bytes(), nullptr) : DeviceBuffer();
  }
  // After a capture: `used` is either the view of `shared` or a buffer the ops grew, which then
  // becomes the graphs' shared scratch.
  static void keep_grown(DeviceBuffer& used, std::shared_ptr<DeviceBuffer>& shared) {
    if (used.empty() || (shared && used.data() == shared->data())) return;
    shared = std::make_shared<DeviceBuffer>(std::move(used));
  }
  // Every buffer an op grows lazily and reuses across calls: a graph must own its own.
  static constexpr size_t kScratchBuffers = 4;
  std::array<DeviceBuffer*, kScratchBuffers> scratch_buffers() {
    return {&workspace_, &act16_, &bias16_, &int8_scratch_};
  }
  std::array<std::shared_ptr<DeviceBuffer>, kScratchBuffers> graph_scratch_;  // the graphs'
  // Graphs: while capture() records, no op may allocate, wait or copy host memory.
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  void* cublas_workspace_ = nullptr;
  bool capturing_ = false;
};

}  // namespace

namespace {

std::unique_ptr<Backend> create_cuda_backend(int device, std::string* error) {
  auto fail = [&](std::string message) -> std::unique_ptr<Backend> {
    if (error) *error = std::move(message);
    return nullptr;
  };
  int count = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&count);
  if (count_error != cudaSuccess)
    return fail(absl::StrCat("no usable CUDA device: ", cudaGetErrorName(count_error), ": ",
                             cudaGetErrorString(count_error)));
  if (count == 0) return fail("no CUDA device found");
  if (device < 0 || device >= count)
    return fail(absl::StrCat("CUDA device ", device, " does not exist (this node has ", count,
                             " device", count == 1 ? "" : "s", ": 0..", count - 1, ")"));
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess)
    return fail(absl::StrCat("cannot open CUDA device ", device, ": ", cudaGetErrorString(e)));
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess)
    return fail(absl::StrCat("cannot query CUDA device ", device, ": ", cudaGetErrorString(e)));
  e = kernels::cuda::probe_kernel_image();
  if (e != cudaSuccess)
    return fail(absl::StrCat("CUDA device ", device, " (", prop.name, ", sm_", prop.major,
                             prop.minor, ") cannot run this build's kernels: ",
                             cudaGetErrorString(e),
                             "; reconfigure with -DCMAKE_CUDA_ARCHITECTURES=", prop.major,
                             prop.minor));
  return std::make_unique<CudaBackend>(device, prop);
}

}  // namespace
}  // namespace ltm

// The plugin's one entry point, found by make_cuda_backend (backend.cpp) with dlsym.
extern "C" __attribute__((visibility("default"))) ltm::Backend* ltm_cuda_backend_create(
    int device, std::string* error) {
  return ltm::create_cuda_backend(device, error).release();
}
