// Backend: where tensors live and how the model's ops run on them.
//
// The model code calls only this interface, never a kernel directly, so the CPU backend
// (OpenBLAS + threaded kernels) and the CUDA backend (cuBLAS + CUDA kernels) run the same model.
// All pointers passed to ops are device pointers of this backend (host memory for the CPU backend).
// Ops are enqueued on the backend's stream and may run asynchronously (CUDA); copy_to_host()
// followed by synchronize() is the point where results are visible on the host.
// Matrices are row-major. Shapes in comments: [rows, cols].
// Threading: a Backend is used by one thread at a time (the rank's step thread).
// Failure: a device error (CUDA, cuBLAS) aborts the process with host:file:line (the group goes down).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <string_view>

#include "runtime/sampling/sample_rows.h"

namespace ltm {

// Element type of a weight matrix, of the KV cache or of the activations between ops as a
// backend holds them. Biases, norms, the residual stream and accumulation are fp32 whatever this
// is (see Backend::activation_precision).
// kInt8: weight matrices only (never a KV cache or activations), symmetric int8 with an fp16
// scale per group of 32 along the reduction dimension (8.5 bits a weight; kernels/cpu/int8_quant.h;
// the CPU's layout kernels/cpu/int8_gemm.h, CUDA's kernels/cuda/int8_gemm.h).
enum class Precision : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kInt8 = 3 };
size_t precision_size(Precision p);       // 4, 2, 2, 1 (int8: the quants, scales apart)
const char* precision_name(Precision p);  // "f32", "bf16", "fp16", "int8"
// Bytes a weight element takes with its share of scales: 4, 2, 2, 1.0625 (memory reports, plans).
double weight_element_bytes(Precision p);
// "f32" | "fp32", "bf16", "fp16" | "f16", "int8"; false for anything else.
bool parse_precision(std::string_view name, Precision* out);
// The activations of a backend that computes in 16 bits (CUDA): the weights' type, fp16 for int8
// weights (the type their many-row GEMMs dequantize into), fp32 for fp32 weights.
Precision device_activation_precision(Precision weights);
// The KV cache's type when --kv-dtype is not given, for weights of `weights` and activations of
// `activations` (Backend::activation_precision): fp32 with fp32 weights (fp32 end to end); with
// 16-bit activations their type, since K and V are values of it already (a cache of another type
// keeps no bit more, and the tensor-core prefill attention takes a cache of the activations'
// type); else fp16, which halves attention's reads for an error of the weights' order and keeps
// 3 more mantissa bits than bf16 of the fp32 K and V (well inside its range: LayerNorm'd
// projections). ltm-worker, ltm-plan and the draft model all ask this.
Precision default_kv_precision(Precision weights, Precision activations);

// Memory owned by a backend (or a view of memory someone else keeps alive). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, std::shared_ptr<void> owner)
      : data_(data), bytes_(bytes), owner_(std::move(owner)) {}
  DeviceBuffer(DeviceBuffer&&) noexcept = default;
  DeviceBuffer& operator=(DeviceBuffer&&) noexcept = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  float* f32() const { return static_cast<float*>(data_); }
  int32_t* i32() const { return static_cast<int32_t*>(data_); }
  bool empty() const { return data_ == nullptr; }
  // What the elements are, for a weight or a cache (set by the backend that made it).
  Precision precision() const { return precision_; }
  void set_precision(Precision p) { precision_ = p; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::shared_ptr<void> owner_;  // frees the memory when the last holder goes
  Precision precision_ = Precision::kF32;
};

// Activations in device memory with their element type: fp32, or 16-bit on a backend whose
// activation_precision() says so. A plain (pointer, type) pair, copied freely.
struct Act {
  void* data = nullptr;
  Precision type = Precision::kF32;
  Act() = default;
  Act(void* d, Precision t) : data(d), type(t) {}
  Act(float* d) : data(d), type(Precision::kF32) {}  // NOLINT: fp32 activations convert freely
  // The element `elems` elements further on.
  Act at(int64_t elems) const {
    return Act(static_cast<char*>(data) + elems * static_cast<int64_t>(precision_size(type)), type);
  }
  // The fp32 pointer (aborts when the elements are 16-bit: a caller that only handles fp32).
  float* f32() const;
};

// What a GEMM does to its result before storing it (Backend::matmul_act): nothing, + bias, or
// gelu_tanh(. + bias). A backend may fuse it into the GEMM (cuBLASLt epilogues).
enum class Epilogue : uint8_t { kNone = 0, kBias = 1, kBiasGelu = 2 };

// Metadata of one forward step's attention, already on the device (Backend::stage_i32; see
// Model::run_stage). The arrays are device pointers only; the scalars are host-side hints.
// Sequence s owns the batch rows [token_offsets[s], token_offsets[s+1]): its new tokens,
// at positions context_lens[s] - n_new .. context_lens[s] - 1. Its keys/values for positions
// 0 .. context_lens[s]-1 live in the paged cache: position p is in block
// block_tables[s * max_blocks_per_seq + p / block_size], slot p % block_size.
struct AttentionArgs {
  int n_seqs = 0;
  int n_tokens = 0;
  const int32_t* token_offsets = nullptr;  // [n_seqs + 1] device
  const int32_t* context_lens = nullptr;   // [n_seqs] device
  const int32_t* block_tables = nullptr;   // [n_seqs, max_blocks_per_seq] device
  const int32_t* slot_mapping = nullptr;   // [n_tokens] device: cache slot (block * block_size + offset) of each new token
  int max_blocks_per_seq = 0;
  int max_context_len = 0;     // max over context_lens (host-side hint for scratch sizes)
  int max_new_tokens = 0;      // max rows of one sequence in this step
  // [n_seqs] device, or null: nonzero for a sequence whose rows are speculative decoding's verify
  // rows, which the CPU backend's attention computes as one-row steps do whatever their count
  // (kernels/cpu/attention.h, PagedAttentionShape::exact); other backends may ignore it.
  const int32_t* exact_rows = nullptr;
  int n_head = 0;              // query heads on this rank
  int n_kv_head = 0;           // KV heads on this rank (grouped-query attention); 0: n_head
  int head_dim = 0;            // d_k
  int block_size = 0;          // tokens per KV block
  Precision kv = Precision::kF32;  // element type of the K and V caches
  Precision act = Precision::kF32;  // element type of qkv and out (activation_precision())
};

enum class BackendKind { kCpu, kCuda, kDevsim };

// Ops captured once and replayed (Backend::capture): a CUDA graph, or the emulated device's
// recorded queue. Owns the scratch memory its ops use. Must not outlive its backend.
class BackendGraph {
 public:
  virtual ~BackendGraph() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string describe() const = 0;  // "cpu (2 threads, OpenBLAS ...)", "cuda:0 (NVIDIA H200)"
  // Host threads the caller may use beside the backend's work (the engine samples the rows of a
  // step on them): the CPU backend's --threads, 1 for a device backend.
  virtual int host_threads() const { return 1; }
  // The device's own memory, bytes (a GPU's total as cudaMemGetInfo reports it): the default KV
  // budget is what weights, activations and graphs leave of it (runtime/model/kv_cache.h). 0 for
  // the CPU, whose default budget is a fixed one.
  virtual int64_t device_memory_bytes() const { return 0; }

  // --- memory ---
  virtual DeviceBuffer alloc(size_t bytes) = 0;  // uninitialised
  // Zero-filled. The CPU backend gets fresh zero pages from the OS (no pass over the memory),
  // so a large KV cache costs nothing until it is used.
  virtual DeviceBuffer alloc_zeroed(size_t bytes) {
    DeviceBuffer buf = alloc(bytes);
    fill_zero(buf.data(), bytes);
    return buf;
  }
  // A KV cache's memory (runtime/model/kv_cache.h), zero-filled. The CPU backend's is on huge
  // pages (CpuBackend::alloc_kv_cache).
  virtual DeviceBuffer alloc_kv_cache(size_t bytes) { return alloc_zeroed(bytes); }
  // Makes `buf`'s memory resident now (ltm-worker --kv-resident): memory that the backend's
  // allocations fault in as used (the CPU backend's host memory) is faulted in whole; device
  // memory is resident once allocated (the default: nothing to do). Throws when the memory
  // cannot be had.
  virtual void make_resident(const DeviceBuffer& buf) { (void)buf; }
  // Weights read from the host. When `host_outlives` and the backend computes in host memory,
  // the buffer may alias `host` (no copy); otherwise it is copied.
  virtual DeviceBuffer upload(const void* host, size_t bytes, bool host_outlives) = 0;
  // Whether this backend holds weights and KV caches of these element types.
  virtual bool supports(Precision weights, Precision kv) const {
    return weights == Precision::kF32 && kv == Precision::kF32;
  }
  // The element type the model keeps its activations in between ops (LayerNorm outputs, QKV,
  // attention output, MLP intermediate) when the weights are `weights`: what the *_act ops and
  // attention read and write. fp32 unless the backend computes in 16 bits (CUDA with bf16 or fp16
  // weights). The residual stream (`hidden`), TP partial sums and logits stay fp32 whatever this
  // is. A backend that returns a 16-bit type here implements every *_act op for it.
  virtual Precision activation_precision(Precision weights) const {
    (void)weights;
    return Precision::kF32;
  }
  // Whether its attention kernels take heads of `head_dim` (= n_embd / n_head); the largest
  // they take otherwise, so a config is refused at load, naming it, not at the first step.
  virtual bool supports_head_dim(int64_t head_dim, int64_t* max_head_dim) const = 0;
  // A weight matrix W [k, n] (row-major, as in the checkpoint) of element type `p`, in the
  // layout matmul() reads, filled by row ranges so that loading never holds a whole fp32 copy:
  // alloc_weight() once, then write_weight_rows() for ranges covering [0, k). The CPU backend
  // packs into column panels (kernels/cpu/packed_gemm.h); the default keeps [k, n] (cuBLAS reads
  // it as is). `rows` holds rows [row_begin, row_end) of W, fp32.
  virtual DeviceBuffer alloc_weight(int64_t k, int64_t n, Precision p);
  virtual void write_weight_rows(DeviceBuffer& w, const float* rows, int64_t row_begin,
                                 int64_t row_end, int64_t k, int64_t n);
  // The tied embedding E [rows, d] (this rank's vocab rows) in the layout embed() and lm_head()
  // read, filled the same way by ranges of E's rows. The CPU backend packs E^T into column
  // panels (one copy serves both); the default keeps [rows, d].
  virtual DeviceBuffer alloc_embedding(int64_t rows, int64_t d, Precision p);
  virtual void write_embedding_rows(DeviceBuffer& table, const float* e_rows, int64_t row_begin,
                                    int64_t row_end, int64_t rows, int64_t d);
  // A whole W or E at once (tests, small tensors).
  DeviceBuffer upload_weight(const float* host, int64_t k, int64_t n,
                             Precision p = Precision::kF32) {
    DeviceBuffer w = alloc_weight(k, n, p);
    write_weight_rows(w, host, 0, k, k, n);
    return w;
  }
  DeviceBuffer upload_embedding(const float* host, int64_t rows, int64_t d,
                                Precision p = Precision::kF32) {
    DeviceBuffer t = alloc_embedding(rows, d, p);
    write_embedding_rows(t, host, 0, rows, rows, d);
    return t;
  }
  // A step's host int32 array `host[0..n)` where this backend's ops read it. The default copies
  // it into `staging` (grown as needed; keep it for the next step) and returns the device copy;
  // the CPU backend, whose device memory is host memory, returns `host` itself. Either way the
  // host array must stay unchanged until the step's ops have run.
  virtual const int32_t* stage_i32(const int32_t* host, size_t n, DeviceBuffer& staging);
  // The same for `bytes` of any plain data (a batch's SampleRowParams and history ids): one
  // copy; the device copy is aligned for any scalar type.
  virtual const void* stage_bytes(const void* host, size_t bytes, DeviceBuffer& staging);
  // The other way: `bytes` of device memory at `src`, readable on the host once the ops enqueued
  // so far have run. The default waits, copies them into `staging` (grown as needed) and returns
  // that; the CPU backend waits and returns `src` itself.
  virtual const void* read_on_host(const void* src, size_t bytes, std::vector<unsigned char>& staging);
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;  // waits for every op enqueued so far
  // True when communicators must be handed device memory (NCCL); false: host memory (MPI).
  virtual bool comm_on_device() const = 0;
  // The queue this backend's ops are enqueued on, as an opaque handle for the device
  // communicator built beside it (a cudaStream_t for CUDA, the emulated stream for devsim), so
  // that collectives and pipeline transfers are ordered with the ops without a host wait.
  // nullptr: ops run at once on the calling thread (CPU).
  virtual void* stream() { return nullptr; }

  // Runs `step`, a stage's step of at most kSmallStepRows rows (a one-sequence decode, a
  // speculative verify step, a few sequences' decode), whose ops are enqueued from this thread.
  // The CPU backend runs it on a step-long team of its threads (kernels/cpu/step_team.h): one
  // thread region a step instead of one a kernel. The default calls it.
  static constexpr int64_t kSmallStepRows = 8;
  virtual void run_small_step(const std::function<void()>& step) { step(); }

  // --- captured graphs (decode steps replayed whole: runtime/model/decode_graphs.h) ---
  // Whether capture() and replay() exist here: the CUDA backend (CUDA graphs) and the emulated
  // device (a recorded queue); not the CPU backend, whose ops run at once.
  virtual bool supports_graphs() const { return false; }
  // Calls `ops` twice. The first call runs them as usual: its results are this call's results,
  // and the scratch memory the backend's own ops grow (attention workspace, 16-bit copies of
  // activations) is the graphs' own, not the eager steps', and grows then if it must. The second
  // call is captured: nothing runs, the ops are recorded with the pointers and host scalars they
  // are given, and the graph keeps that scratch alive (graphs share it: they run one at a time
  // on the stream; a later graph that needs more gets a larger one). While capturing, alloc,
  // freeing a buffer, synchronize, read_on_host and copies from or to host memory abort (a CUDA
  // graph cannot hold them); the device communicator's all-reduces are captured with the ops.
  // The default aborts.
  virtual std::unique_ptr<BackendGraph> capture(const std::function<void()>& ops);
  // Enqueues the graph's ops on the stream, as captured (same pointers, same host scalars).
  virtual void replay(BackendGraph& graph);

  // --- sampling ---
  // Samples every row of `args` (runtime/sampling/sample_rows.h) where the logits lie, in stream
  // order: every pointer is this backend's memory, and tokens / logprobs are readable on the host
  // after read_on_host, so a step copies back ids, not [rows, vocab] logits. Each row's token is
  // the one sample() (runtime/sampling/sampler.h) draws with Rng::for_step(seed, token_index).
  // The default copies the inputs to the host, runs the host sampler and copies the results back
  // (correct anywhere, no faster than sampling on the host); the CPU backend runs the host
  // sampler in place, the emulated device does so when its stream gets there, and the CUDA
  // backend runs kernels/cuda/sampling.h.
  virtual void sample_rows(const SampleRowsArgs& args);
  // A tp > 1 last stage's rank: every row's candidates from this rank's vocab slice
  // (CandidateRowsArgs in runtime/sampling/sample_rows.h: local_candidates' set, as pairs or the
  // penalized slice) where the logits lie, in stream order; `out` is readable on the host after
  // read_on_host, so a step copies back candidates, not [rows, vocab / tp] logits. The default
  // copies the inputs to the host, runs select_candidates_host and copies the result back; the
  // CPU backend runs it in place, the emulated device when its stream gets there, and the CUDA
  // backend runs kernels/cuda/sampling.h.
  virtual void select_candidates(const CandidateRowsArgs& args);

  // --- ops (float32) ---
  // C[m, n] = A[m, k] @ B + beta * C, where B is [k, n] (b_transposed=false) or [n, k] (true).
  virtual void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                    bool b_transposed, float beta) = 0;
  // C[m, n] = A[m, k] @ B^T for B [n, k]: a LoRA adapter's down projection (n its rank). Where
  // the backend can, each row of C has the bits it would have alone (the CPU backend:
  // kernels/cpu/gemm.h, gemm_rows_nt), so that speculative decoding's verify rows compute what
  // one-row decode steps do; the default is gemm.
  virtual void gemm_rows_nt(const float* a, const float* b, float* c, int64_t m, int64_t n,
                            int64_t k) {
    gemm(a, b, c, m, n, k, true, 0.0f);
  }
  // C[m, n] = A[m, k] @ W + beta * C for a weight W from upload_weight(w, k, n).
  virtual void matmul(const float* a, const DeviceBuffer& w, float* c, int64_t m, int64_t n,
                      int64_t k, float beta) {
    gemm(a, w.f32(), c, m, n, k, false, beta);
  }
  // x[r, :] += bias[:] for every row.
  virtual void add_bias(float* x, const float* bias, int64_t rows, int64_t cols) = 0;
  // x[i] += y[i].
  virtual void add(float* x, const float* y, int64_t n) = 0;
  // x[r, :] = gelu_tanh(x[r, :] + bias[:]).
  virtual void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols) = 0;
  // y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * gamma + beta.
  virtual void layer_norm(const float* x, const float* gamma, const float* beta, float* y,
                          int64_t rows, int64_t cols, float eps) = 0;
  // The end of a residual block followed by the next LayerNorm:
  //   x[r, :] = x[r, :] + (residual[r, :] + bias[:])   (x[r, :] + bias[:] when residual is null)
  //   y[r, :] = layer_norm(x[r, :])
  // The default runs add_bias (on residual, else on x), add and layer_norm, leaving `residual`
  // holding residual + bias; a device backend fuses them into one pass over x (the CUDA backend
  // leaves `residual` unchanged). y must not alias x or residual.
  virtual void add_bias_residual_layer_norm(float* x, float* residual, const float* bias,
                                            const float* gamma, const float* beta, float* y,
                                            int64_t rows, int64_t cols, float eps) {
    if (residual) {
      add_bias(residual, bias, rows, cols);
      add(x, residual, rows * cols);
    } else {
      add_bias(x, bias, rows, cols);
    }
    layer_norm(x, gamma, beta, y, rows, cols, eps);
  }
  // out[t, :] = table[ids[t] - row_begin, :] when row_begin <= ids[t] < row_end, else 0.
  // (A vocab-parallel rank holds rows [row_begin, row_end) of the embedding.)
  virtual void embedding(const int32_t* ids, const float* table, int64_t row_begin,
                         int64_t row_end, float* out, int64_t n_tokens, int64_t d) = 0;
  // embedding() on a table from upload_embedding(table, row_end - row_begin, d).
  virtual void embed(const int32_t* ids, const DeviceBuffer& table, int64_t row_begin,
                     int64_t row_end, float* out, int64_t n_tokens, int64_t d) {
    embedding(ids, table.f32(), row_begin, row_end, out, n_tokens, d);
  }
  // logits[m, rows] = x[m, d] @ E^T for a table E from upload_embedding(E, rows, d).
  virtual void lm_head(const float* x, const DeviceBuffer& table, float* logits, int64_t m,
                       int64_t rows, int64_t d) {
    gemm(x, table.f32(), logits, m, rows, d, true, 0.0f);
  }
  // x[t, :] += table[positions[t], :] (learned) or the sinusoid for positions[t] (table == null).
  virtual void add_position_embedding(float* x, const float* table, const int32_t* positions,
                                      int64_t n_tokens, int64_t d) = 0;
  // dst[i, :] = src[rows[i], :].
  virtual void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n,
                           int64_t d) = 0;
  // Writes each new token's K and V (from the fused qkv rows [n_tokens, (n_head + 2 n_kv_head)
  // * d_k], elements of args.act) into the paged cache ([n_blocks, n_kv_head, block_size, d_k]
  // each, elements of args.kv) at its slot. Query head h reads KV head h / (n_head / n_kv_head).
  virtual void kv_cache_write(const AttentionArgs& args, const void* qkv, void* k_cache,
                              void* v_cache) = 0;
  // out[t, h*d_k ...] = causal softmax(q k^T / sqrt(d_k)) v over the sequence's cached keys.
  // q is read from qkv (the first n_head * d_k columns of each row); qkv and out hold elements
  // of args.act, the arithmetic is fp32.
  virtual void paged_attention(const AttentionArgs& args, const void* qkv, const void* k_cache,
                               const void* v_cache, void* out) = 0;

  // --- ops on activations of activation_precision() (Act) ---
  // The defaults take fp32 activations only (they abort on a 16-bit Act) and run the fp32 ops
  // above in the order the model ran them before these existed, so a backend that keeps fp32
  // activations computes the same bits either way.
  // C[m, n] = epilogue(A[m, k] @ W + beta * C) for a weight from upload_weight(w, k, n); bias
  // [n] fp32 (null for kNone). Accumulation is fp32; C is rounded to its type once. bias_act:
  // the same bias as epilogue_bias() made it for C's type, or null (the backend then rounds
  // `bias` itself where it needs to, at every call).
  virtual void matmul_act(Act a, const DeviceBuffer& w, Act c, int64_t m, int64_t n, int64_t k,
                          float beta, const float* bias, Epilogue epilogue,
                          const void* bias_act = nullptr);
  // A bias [n] (fp32, uploaded) as matmul_act's fused epilogue reads it when C is of `act`: a
  // copy rounded to `act` once, where the backend's epilogue takes the output's type (CUDA's
  // cuBLASLt with 16-bit C), or an empty buffer where it reads the fp32 bias as it is (the
  // default). The model makes these at load for the biases its GEMMs fuse (QKV, MLP fc): on the
  // H100 (2026-12-06) rounding them at every call was 2 of a 6.7B decode layer's ~11 kernels.
  virtual DeviceBuffer epilogue_bias(const DeviceBuffer& bias, int64_t n, Precision act) {
    (void)bias;
    (void)n;
    (void)act;
    return {};
  }
  // layer_norm() with y of another type (x fp32; y must not alias x when 16-bit).
  virtual void layer_norm_act(const float* x, const float* gamma, const float* beta, Act y,
                              int64_t rows, int64_t cols, float eps);
  // add_bias_residual_layer_norm() with y of another type.
  virtual void add_bias_residual_layer_norm_act(float* x, float* residual, const float* bias,
                                                const float* gamma, const float* beta, Act y,
                                                int64_t rows, int64_t cols, float eps);
  // add_bias() and bias_gelu() on activations of another type (bias fp32).
  virtual void add_bias_act(Act x, const float* bias, int64_t rows, int64_t cols);
  virtual void bias_gelu_act(Act x, const float* bias, int64_t rows, int64_t cols);
  // out[i] = x[i] widened to fp32, i < n (a copy for fp32).
  virtual void act_to_f32(Act x, float* out, int64_t n);
  // x[i] += y[i] (rounded to x's type), i < n.
  virtual void add_f32_to_act(Act x, const float* y, int64_t n);

  // --- the Llama family's ops (RMSNorm, rotary positions, gated SiLU: docs/architecture.md) ---
  // Whether this backend has them: a Llama-family model is refused at load otherwise, naming the
  // backend. The fp32 ops' defaults abort; the *_act ones run them on fp32 activations.
  virtual bool supports_llama() const { return false; }
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:], fp32 arithmetic (x, y may alias).
  virtual void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t cols,
                        float eps);
  // The end of a residual block and the next RMSNorm: x[r, :] += residual[r, :] + bias[:]
  // (each only when non-null), then y[r, :] = rms_norm(x[r, :]). residual is left unchanged;
  // y must not alias x or residual.
  virtual void add_residual_rms_norm(float* x, const float* residual, const float* bias,
                                     const float* w, float* y, int64_t rows, int64_t cols,
                                     float eps);
  // Rotate-half RoPE in place on the first n_heads heads of each of n_tokens rows (row_stride
  // elements apart), by angles positions[t] * inv_freq[i] (i < head_dim / 2; kernels/cpu/llama_ops.h).
  virtual void rope(float* x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
                    int64_t n_heads, int64_t row_stride, int64_t head_dim);
  // out[r, j] = silu(gate_up[r, j]) * gate_up[r, cols + j]; gate_up [rows, 2 cols].
  virtual void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols);
  // The same on activations of activation_precision() (norm weights, residual stream fp32).
  virtual void rms_norm_act(const float* x, const float* w, Act y, int64_t rows, int64_t cols,
                            float eps);
  virtual void add_residual_rms_norm_act(float* x, const float* residual, const float* bias,
                                         const float* w, Act y, int64_t rows, int64_t cols,
                                         float eps);
  virtual void rope_act(Act x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
                        int64_t n_heads, int64_t row_stride, int64_t head_dim);
  virtual void silu_mul_act(Act gate_up, Act out, int64_t rows, int64_t cols);
};

// The CPU backend with `n_threads` threads for OpenBLAS and the kernels (0: all cores).
std::unique_ptr<Backend> make_cpu_backend(int n_threads);
// The emulated device over the CPU backend (runtime/backend/devsim_backend.h): tests only.
std::unique_ptr<Backend> make_devsim_backend(int n_threads);
// The CUDA backend on `device` (nullptr with a message in *error when built without CUDA or
// when the device cannot be opened).
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* error);

}  // namespace ltm
