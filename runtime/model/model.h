// The forward pass of both families, GPT-2/GPT-3 and Llama (Llama, Mistral, Qwen2), on one
// rank's slices (docs/architecture.md "The model", "Ranks and slices"). The families share the
// block's shape and its communication; they differ in the norm (LayerNorm / RMSNorm), positions
// (learned or sinusoidal / RoPE on Q and K), MLP (GELU / SwiGLU), K/V heads (as many as Q /
// grouped), biases and the LM head (tied / untied): the few places forward() asks the config.
// model_llama.cpp reads the Llama tensors into the same fused layout.
//
// A Model holds this rank's weights: its pipeline stage's layers, its TP rank's heads and FFN
// columns, and (first/last stage) its vocab rows of the embedding (and of an untied LM head). One call of run_stage()
// runs a whole batch of sequences, some in prefill (many new tokens) and some in decode (one),
// through the stage's layers, reading and writing K/V through per-sequence block tables.
// Communication is visible here: the two all-reduces per block go through the TP communicator,
// the device one (engine.h, Comms::tp_device): it takes this backend's memory, in stream order.
// Threading: one thread drives a Model. Failure: device/communicator errors abort the group;
// loading errors come back as Status.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "parallel/partition.h"
#include "runtime/backend/backend.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/lora.h"
#include "runtime/model/model_config.h"
#include "runtime/model/step_input.h"
#include "runtime/model/weight_source.h"

namespace ltm {

// Which part of the model this rank holds.
struct ShardSpec {
  int tp = 1;
  int tp_rank = 0;
  int pp = 1;
  int pp_rank = 0;
  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp - 1; }
};

// One block's weights. q, kv: this rank's Q columns (n_head_local * d_k) and K (or V) columns
// (n_kv_head_local * d_k; = q for GPT-2). Llama: ln_*_b, mlp biases and (unless the config has
// them) the attention biases are empty; mlp_fc_w is gate | up, [d, 2 * d_ff_local].
struct LayerWeights {
  DeviceBuffer ln_1_g, ln_1_b;      // [d]
  DeviceBuffer attn_qkv_w;          // [d, q + 2 kv]     Q | K | V columns of this rank's heads
  DeviceBuffer attn_qkv_b;          // [q + 2 kv]
  DeviceBuffer attn_proj_w;         // [q, d]            rows of this rank's heads
  DeviceBuffer attn_proj_b;         // [d]               added once, after the all-reduce
  DeviceBuffer ln_2_g, ln_2_b;      // [d]
  DeviceBuffer mlp_fc_w;            // [d, d_ff_local]   (Llama: gate | up, [d, 2 d_ff_local])
  DeviceBuffer mlp_fc_b;            // [d_ff_local]
  DeviceBuffer mlp_proj_w;          // [d_ff_local, d]
  DeviceBuffer mlp_proj_b;          // [d]               added once, after the all-reduce
  // attn_qkv_b and mlp_fc_b as the fused GEMM epilogues read them (Backend::epilogue_bias: a
  // 16-bit copy on CUDA with 16-bit activations; empty where the fp32 bias is read as it is).
  DeviceBuffer attn_qkv_b_act, mlp_fc_b_act;
};

// How the weights are held: the matrices and the tied embedding in `weights` (biases, norms
// and learned positions stay fp32; so do activations and accumulation).
struct ModelOptions {
  Precision weights = Precision::kF32;
  // A LoRA adapter folded into the weights at load (--lora-merge): each matrix gets
  // W += s A^T B^T in fp32 before it is converted and packed. Null: the base model.
  const LoraAdapter* merge = nullptr;
};

// One module's LoRA update as this rank holds it on the device (see LoraSlice).
struct LoraModuleWeights {
  int rank = 0;                 // 0: no update for this module
  int64_t in = 0, out = 0;
  DeviceBuffer a;               // [rank, in_local]
  DeviceBuffer b;               // B^T [rank, out_local] as a weight (upload_weight), times the
                                // adapter's scale
};
// A resident adapter: per local layer, per module (LoraModule order).
struct LoraWeights {
  std::vector<std::array<LoraModuleWeights, kLoraModules>> layer;
  uint64_t bytes = 0;
};

class Model {
 public:
  // Loads this rank's slices from `source` onto `backend`. `tp_comm` is the TP group (size tp)
  // on device memory (Comms::tp_device).
  // Refuses (InvalidArgument) shapes this shard cannot split and weight types the backend
  // cannot hold.
  static absl::StatusOr<std::unique_ptr<Model>> load(const WeightSource& source, Backend& backend,
                                                     const ShardSpec& shard,
                                                     parallel::Communicator& tp_comm,
                                                     const ModelOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ShardSpec& shard() const { return shard_; }
  parallel::Range layers() const { return layers_; }
  int64_t n_head_local() const { return n_head_local_; }
  // KV heads this rank holds (and its cache stores): n_head_local for GPT-2; grouped-query
  // attention's share, or one replicated head when tp exceeds the model's KV heads.
  int64_t n_kv_head_local() const { return n_kv_local_; }
  parallel::Range vocab_rows() const { return vocab_; }  // padded-vocab rows held (first/last stage)
  int64_t vocab_local() const { return vocab_.size(); }
  // Bytes of weights this rank holds (device memory).
  uint64_t weight_bytes() const { return weight_bytes_; }
  Precision weight_precision() const { return weight_precision_; }
  // What the activations between ops are held in (Backend::activation_precision of the weights'
  // type): fp32 on the CPU, bf16/fp16 on CUDA with 16-bit weights. `hidden` is fp32 regardless.
  Precision activation_precision() const { return act_; }
  // Seconds this rank has spent in tensor-parallel all-reduces since load (0 with tp = 1).
  double allreduce_seconds() const { return allreduce_seconds_; }

  // Runs the stage on `step`. First stage: embeds step.token_ids into `hidden` first; other
  // stages: `hidden` holds the previous stage's output. On return `hidden` ([n_tokens, d],
  // device) is this stage's output. Writes this step's K/V into `cache`.
  void run_stage(const StepInput& step, float* hidden, KvCache& cache);

  // Unmerged LoRA adapters, resident side by side; a step names one per sequence
  // (StepInput::adapter_ids). add_adapter reads this rank's slices of `adapter` (its layers, its
  // heads' and FFN columns' share, cut like the base weights) under `id` (> 0, unused);
  // remove_adapter frees them. A step naming an id this rank does not hold is a bug (aborts).
  absl::Status add_adapter(int32_t id, const LoraAdapter& adapter);
  void remove_adapter(int32_t id);
  bool has_adapter(int32_t id) const { return adapters_.count(id) != 0; }
  uint64_t adapter_bytes() const;
  // Seconds spent so far in run_stage, and in it on the LoRA products (host clock around the
  // calls: exact on the CPU backend, enqueue time on an asynchronous one), for benchmarks.
  double stage_seconds() const { return stage_seconds_; }
  double lora_seconds() const { return lora_seconds_; }

  // Last stage: logits [logit_rows.size(), vocab_local] (device) of this rank's vocab rows for
  // the batch rows in step.logit_rows (padding rows come out as 0 and must be ignored).
  void compute_logits(const StepInput& step, const float* hidden, float* logits);

  // --- the same forward pass on a step already on the device (decode graphs) ---
  // Activation scratch of one forward pass, for up to `tokens` rows: elements of
  // activation_precision() except proj_out (fp32: TP partial sums, all-reduced, and the final
  // LayerNorm's rows).
  struct Workspace {
    int64_t tokens = 0;
    DeviceBuffer ln_out;    // [tokens, d]
    DeviceBuffer qkv;       // [tokens, q + 2 kv]
    DeviceBuffer attn_out;  // [tokens, q]
    DeviceBuffer proj_out;  // [tokens, d] fp32
    DeviceBuffer ff;        // [tokens, d_ff_local]
    DeviceBuffer gate_up;   // [tokens, 2 d_ff_local] (Llama)
  };
  // A step's arrays on the device with its attention hints (AttentionArgs, n_head, head_dim,
  // block_size, kv and act filled in), as run_stage stages them.
  struct StagedStep {
    AttentionArgs attn;
    const int32_t* token_ids = nullptr;  // [n_tokens] device
    const int32_t* positions = nullptr;  // [n_tokens] device
    bool lora = false;                   // apply this step's adapter runs (run_stage only)
  };
  // Grows `ws` to `n_tokens` rows (allocates: not while capturing).
  void ensure_workspace(Workspace& ws, int64_t n_tokens);
  // run_stage's ops on `step`, scratch in `ws` (sized already): no allocation, no host array,
  // no host wait, so it can be captured (Backend::capture).
  void forward(const StagedStep& step, float* hidden, KvCache& cache, Workspace& ws);
  // compute_logits' ops for the m rows listed (device) in `rows`, scratch in `ws`.
  void logits_from(const int32_t* rows, int64_t m, const float* hidden, float* logits,
                   Workspace& ws);

 private:
  Model(const ModelConfig& config, const ShardSpec& shard, Backend& backend,
        parallel::Communicator& tp_comm);
  // How a loaded tensor is handed to the backend: as is (fp32), as a matmul weight
  // (alloc_weight / write_weight_rows), or as the tied embedding (alloc_embedding / ...).
  enum class TensorUse { kPlain, kMatrix, kEmbedding };
  absl::Status load_weights(const WeightSource& source);
  // model_llama.cpp: the Llama family's tensors into the same layout.
  absl::Status load_llama_weights(const WeightSource& source);
  // nn.Linear weights ([out, in]) side by side, as the matmul weight W [in_range.size(), sum of
  // out ranges]: the transpose of their rows [out_begin, out_end) x columns in_range, loaded by
  // ranges of W's rows like load_tensor (never a whole fp32 copy).
  struct LinearPart {
    std::string name;
    int64_t out_begin, out_end;  // rows of the stored tensor
  };
  DeviceBuffer load_linear(const WeightSource& source, const std::vector<LinearPart>& parts,
                           parallel::Range in_range, const LoraSlice* merge = nullptr);
  // --lora-merge: this rank's slice of each module's update in layer `layer`, folded in as the
  // matrices load; fold(m) is null for a module without one (or without --lora-merge).
  struct LayerMerge {
    std::array<LoraSlice, kLoraModules> slices;
    const LoraSlice* operator()(LoraModule m) const {
      const LoraSlice& s = slices[static_cast<int>(m)];
      return s.empty() ? nullptr : &s;
    }
  };
  LayerMerge merge_slices(int64_t layer) const;
  // The families' norm before a block, and a block's end (bias, residual) with the next norm.
  void norm_act(const float* x, const DeviceBuffer& g, const DeviceBuffer& b, Act y, int64_t n);
  void end_block_norm(float* x, float* residual, const DeviceBuffer& bias, const DeviceBuffer& g,
                      const DeviceBuffer& b, Act y, int64_t n);
  DeviceBuffer load_tensor(const WeightSource& source, const std::string& name,
                           const std::vector<SliceSpec>& parts, int64_t rows, int64_t cols,
                           bool whole, TensorUse use = TensorUse::kPlain,
                           const LoraSlice* merge = nullptr);
  // out[rows of each adapter run] += x A^T B^T for module m of local layer l (x [n, in_local],
  // out [n, out_local]): two GEMMs per run of consecutive sequences with the same adapter.
  // x and out are activations (16-bit ones are widened, and the update rounded once into out).
  void apply_lora(size_t l, LoraModule m, Act x, Act out);
  void plan_lora_runs(const StepInput& step);
  void upload_step(const StepInput& step);
  void all_reduce(float* data, int64_t count);

  ModelConfig config_;
  ShardSpec shard_;
  Backend& backend_;
  parallel::Communicator& tp_comm_;
  parallel::Range layers_, heads_, kv_heads_, ffn_, vocab_;
  // d_local_: Q columns (n_head_local * d_k); kv_local_: K (or V) columns; qkv_cols_: both.
  int64_t d_ = 0, head_dim_ = 0, n_head_local_ = 0, n_kv_local_ = 0, d_local_ = 0,
          kv_local_ = 0, qkv_cols_ = 0, d_ff_local_ = 0;
  uint64_t weight_bytes_ = 0;
  const LoraAdapter* merge_ = nullptr;  // during load only
  absl::Status merge_status_;           // the first merge that overflowed (load_tensor)
  Precision weight_precision_ = Precision::kF32;
  Precision act_ = Precision::kF32;  // activations between ops (see activation_precision())
  double allreduce_seconds_ = 0;

  DeviceBuffer wte_;          // [vocab_local, d] (alloc_embedding)  first and last stage
  DeviceBuffer lm_head_;      // [vocab_local, d] (alloc_embedding)  last stage, untied head only
  DeviceBuffer inv_freq_;     // [d_k / 2] RoPE's frequencies (Llama)
  DeviceBuffer wpe_;          // [n_positions, d]  first stage, learned positions only
  DeviceBuffer ln_f_g_, ln_f_b_;  // [d]          last stage
  std::vector<LayerWeights> layer_;  // this stage's layers, in order
  LoraShardRanges lora_ranges_;      // where this rank's LoRA slices lie in the full tensors
  std::map<int32_t, LoraWeights> adapters_;  // by id (> 0)
  struct LoraRun {
    int64_t row0, row1;       // batch rows [row0, row1)
    const LoraWeights* w;
  };
  std::vector<LoraRun> lora_runs_;  // this step's runs of rows with an adapter
  DeviceBuffer lora_t_;             // [n_tokens, max rank] x A^T
  int64_t lora_t_elems_ = 0;
  // 16-bit activations only: x widened [n_tokens, max in_local] and the update [n_tokens, max
  // out_local], fp32 (the LoRA GEMMs are fp32).
  DeviceBuffer lora_x32_, lora_y32_;
  int64_t lora_x32_elems_ = 0, lora_y32_elems_ = 0;
  double stage_seconds_ = 0, lora_seconds_ = 0;

  // Per-step metadata on the device, and its AttentionArgs: the step's int32 arrays packed into
  // step_host_ and staged as one copy into d_step_ (upload_step); views of it below.
  static constexpr size_t kStepArrays = 8;
  std::vector<int32_t> step_host_;
  std::vector<int32_t> step_exact_;  // [n_seqs]: AttentionArgs::exact_rows (verify rows)
  DeviceBuffer d_step_, d_logit_rows_;
  const int32_t* staged_token_ids_ = nullptr;
  const int32_t* staged_positions_ = nullptr;
  const int32_t* staged_logit_rows_ = nullptr;  // device
  const int32_t* staged_logit_host_ = nullptr;  // the same rows in step_host_
  size_t staged_logit_count_ = 0;
  AttentionArgs attn_args_;

  // Workspace of run_stage and compute_logits, grown to the largest step seen.
  Workspace ws_;
};

}  // namespace ltm
