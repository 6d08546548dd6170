// LoRA adapters in PEFT's layout: reading a folder, checking it against the base model, and
// cutting each rank's slices (docs/architecture.md, "LoRA adapters").
//
//   DIR/adapter_config.json        {"peft_type": "LORA", "r": 8, "lora_alpha": 16,
//                                   "target_modules": ["c_attn", ...], "fan_in_fan_out": true, ...}
//   DIR/adapter_model.safetensors  base_model.model.transformer.h.<i>.<module>.lora_A.weight [r, in]
//                                  base_model.model.transformer.h.<i>.<module>.lora_B.weight [out, r]
//
// Llama-family bases (Llama, Mistral, Qwen2): base_model.model.model.layers.<i>.<module>.lora_*
// with <module> one of self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj (see kLlamaLoraModules
// for how they map onto the fused modules the model computes).
//
// <module> is one of GPT-2's four linear layers: attn.c_attn (in d, out 3d), attn.c_proj (d, d),
// mlp.c_fc (d, d_ff), mlp.c_proj (d_ff, d). The update of a module is h = x W + s x A^T B^T with
// s = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). A and B have these shapes whatever
// fan_in_fan_out says: that flag only tells PEFT how the base weight (Conv1D, [in, out]) is
// stored, which is GPT-2's layout either way, so both values are accepted.
//
// LoraAdapter::open validates everything before any tensor is read: every file is there, the
// config's fields have the types and values ltm implements, every tensor names a module the base
// has (layer < n_layer, one of the four), A and B come in pairs with the shapes above and rank r,
// and 1 <= r <= max_rank (and kMaxLoraRank). lora_alpha is finite and > 0, and the scale s is at
// most kMaxLoraScale (1024). Every value of A and B is finite, and so is every value of s B (all
// of them, on every rank that opens the adapter, so that rank 0 refuses an adapter any rank would
// refuse). The files: adapter_config.json and adapter_model.safetensors must be regular files
// (not FIFOs, devices or directories) and, with links resolved, inside the folder that holds DIR
// (for an adapter loaded by name that is --lora-dir); they are opened without following links
// that appear after that check, and read into memory (at most kMaxLoraConfigBytes, and the size
// of every module of every layer at rank r in F32 plus kLoraHeaderSlackBytes). After a successful
// open no read can fail.
//
// Ownership: a LoraAdapter owns its file mapping; movable. Threading: const methods are safe to
// call concurrently. Failure: NotFound for a missing folder or file, InvalidArgument for every
// other defect, each with a message naming the file and tensor or field.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/partition.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace ltm {

// GPT-2's linear layers, in block order.
enum class LoraModule : int { kAttnQkv = 0, kAttnProj = 1, kMlpFc = 2, kMlpProj = 3 };
inline constexpr int kLoraModules = 4;
// The Llama family's seven (PEFT's names under model.layers.<i>.): self_attn.{q,k,v,o}_proj and
// mlp.{gate,up,down}_proj. Each belongs to the fused module the model computes it in: q, k, v to
// kAttnQkv (the fused Q | K | V GEMM), o to kAttnProj, gate and up to kMlpFc (gate | up), down to
// kMlpProj. A fused module's update is then one LoRA of rank (parts x r): A = the parts' A
// stacked, B = their B block-diagonal (zero blocks for parts the adapter leaves out), which is
// exactly the sum of the parts' updates, each in its own output columns.
inline constexpr int kLlamaLoraModules = 7;
const char* lora_module_name(LoraModule m);  // "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"

inline constexpr int kMaxLoraRank = 256;  // the largest --lora-max-rank
inline constexpr const char* kLoraConfigFile = "adapter_config.json";
inline constexpr const char* kLoraWeightsFile = "adapter_model.safetensors";
// The largest scale lora_alpha / r (lora_alpha / sqrt(r)) accepted. Trained adapters use 0.25 to
// 64 or so; a scale far above that only turns an update into overflow.
inline constexpr double kMaxLoraScale = 1024;
inline constexpr uint64_t kMaxLoraConfigBytes = 1 << 20;         // adapter_config.json
inline constexpr uint64_t kLoraHeaderSlackBytes = uint64_t{16} << 20;  // see LoraAdapter::open

class LoraAdapter {
 public:
  // Opens and validates DIR against the base model `config`; ranks above `max_rank` are refused.
  static absl::StatusOr<LoraAdapter> open(const std::string& dir, const ModelConfig& config,
                                          int max_rank);

  LoraAdapter(LoraAdapter&&) noexcept = default;
  LoraAdapter& operator=(LoraAdapter&&) noexcept = default;

  const std::string& dir() const { return dir_; }
  int rank() const { return rank_; }
  float alpha() const { return alpha_; }
  float scale() const { return scale_; }  // alpha / r (or alpha / sqrt(r) with use_rslora)
  // The modules that carry an update in at least one layer ("attn.c_attn", ...), block order.
  std::vector<std::string> modules() const;
  // Whether any module that makes up `m` has an update in `layer`.
  bool has(int64_t layer, LoraModule m) const {
    for (int sub : parts(m))
      if (has_part(layer, sub)) return true;
    return false;
  }
  bool has_part(int64_t layer, int sub) const { return tensors_[sub_index(layer, sub)].a != nullptr; }
  // The modules (GPT-2: m itself; Llama: kLlamaLoraModules indices) that make up fused module m.
  std::vector<int> parts(LoraModule m) const;

  // Slices of one module's update for a rank, in fp32: A's columns `in` ([r, in.size()]), and
  // B's rows `out` ([out.size(), r], already multiplied by scale()), read side by side from the
  // given ranges (the fused QKV output is three ranges, one per part).
  void read_a(int64_t layer, LoraModule m, const std::vector<parallel::Range>& in, float* out) const;
  void read_b_scaled(int64_t layer, LoraModule m, const std::vector<parallel::Range>& out_rows,
                     float* out) const;
  // The same for one part (an index of parts(m)'s list: a GPT-2 or Llama module).
  void read_a_part(int64_t layer, int sub, const std::vector<parallel::Range>& in, float* out) const;
  void read_b_scaled_part(int64_t layer, int sub, const std::vector<parallel::Range>& out_rows,
                          float* out) const;

 private:
  struct Pair {
    const SafetensorsTensor* a = nullptr;  // [r, in]
    const SafetensorsTensor* b = nullptr;  // [out, r]
  };
  LoraAdapter() = default;
  int n_parts() const { return llama_ ? kLlamaLoraModules : kLoraModules; }
  size_t sub_index(int64_t layer, int sub) const {
    return static_cast<size_t>(layer) * n_parts() + static_cast<size_t>(sub);
  }

  std::string dir_;
  int rank_ = 0;
  float alpha_ = 0, scale_ = 0;
  int64_t n_layer_ = 0;
  std::unique_ptr<SafetensorsFile> file_;  // stable address: tensors_ points into it
  std::vector<Pair> tensors_;              // [n_layer * n_parts()]
  bool llama_ = false;                     // the base is a Llama-family model
};

// What a caller reports of a loaded adapter.
struct LoraSummary {
  int rank = 0;
  float alpha = 0;
  std::vector<std::string> modules;
};

// One module's update as a rank holds it: A_local [r, in_local] and B_local [out_local, r]
// (scaled), host fp32. For a column-parallel base weight (c_attn, c_fc) A is whole and B has the
// rows of this rank's output columns; for a row-parallel one (c_proj's) A has the columns of
// this rank's input rows and B is whole, so the ranks' partial updates sum in the block's
// existing all-reduce.
struct LoraSlice {
  int rank = 0;
  int64_t in = 0, out = 0;
  std::vector<float> a;  // [rank, in]
  std::vector<float> b;  // [out, rank], times the adapter's scale
  bool empty() const { return rank == 0; }
};

// Where a rank's slices of each module lie in the base model's full tensors (the same cut as the
// base weights: heads for attention, FFN columns for the MLP).
struct LoraShardRanges {
  std::array<std::vector<parallel::Range>, kLoraModules> in;   // ranges of the module's input
  std::array<std::vector<parallel::Range>, kLoraModules> out;  // ranges of its output
};
// Llama: `kv_heads` are the rank's KV heads, and out[m] holds one range per part of m, in that
// part's own output rows.
LoraShardRanges lora_shard_ranges(const ModelConfig& config, parallel::Range heads,
                                  parallel::Range ffn, parallel::Range kv_heads = {});

// This rank's slice of one module (empty when the adapter has no update there).
LoraSlice read_lora_slice(const LoraAdapter& adapter, const LoraShardRanges& ranges,
                          int64_t layer, LoraModule m);

// W_local[rows r0..r1) += A_local^T B_local^T for the local base weight [in_local, out_local]
// (fp32, row-major, as the checkpoint stores Conv1D weights): folding the update in at load.
// InvalidArgument naming the element when the update takes a finite weight out of float's range
// (the rows are merged all the same; the caller fails the load).
absl::Status merge_lora_rows(const LoraSlice& s, float* w_rows, int64_t row_begin, int64_t row_end);

}  // namespace ltm
