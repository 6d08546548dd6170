// Checkpoint: the model-facing reader of an HF GPT-2 checkpoint folder.
//
//   DIR/config.json                        model hyper-parameters (see model_config.h)
//   DIR/model.safetensors                  all tensors, or
//   DIR/model.safetensors.index.json       {"weight_map": {tensor: shard file}} + the shards
//
// open() validates every tensor before anything is read: the expected GPT-2 names (stored with or
// without the "transformer." prefix), no unknown tensors, shapes and dtypes (F32, F16, BF16;
// tensors may mix them) against config.json, and each file's layout (safetensors.h). Ignored:
// the causal-mask buffers "h.<i>.attn.bias" / "h.<i>.attn.masked_bias", and "lm_head.weight",
// which must have wte's shape and is replaced by wte as HF does for tied embeddings.
// After a successful open() no read can fail (but see the SIGBUS note in safetensors.h).
//
// Tensor names here are without the prefix: "wte.weight", "h.3.attn.c_attn.weight", ...
// Conv1D weights are stored [in, out]; see gpt2_tensor_specs() for the full list.
//
// Ownership: a Checkpoint owns its file mappings (read-only, private) and releases them on
// destruction; pointers from f32_in_place() live as long as the Checkpoint. Movable, not
// copyable. Threading: const methods may be called concurrently (bytes_read is atomic).
// Failure: open() returns NotFound (missing folder, file, shard or tensor), DataLoss (corrupt
// file) or InvalidArgument (wrong shape/dtype, unknown tensor, bad config/index), with a message
// that names the file and the tensor and says what was expected. Asking for a tensor that is not
// in gpt2_tensor_specs(), or a slice outside the tensor, is a caller bug and aborts (LTM_ASSERT).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/dtype.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace ltm {

// A rectangular slice of a 1-D or 2-D tensor: rows [row_begin, row_end) x cols [col_begin,
// col_end). For 1-D tensors rows is the only dimension (cols = {0, 1}).
struct SliceSpec {
  int64_t row_begin, row_end, col_begin, col_end;
};

struct TensorSpec {
  std::string name;            // without prefix, e.g. "h.0.mlp.c_fc.weight"
  std::vector<int64_t> shape;  // e.g. [n_embd, n_inner]
  std::string symbolic_shape;  // the same in config terms, for messages: "[n_embd, n_inner]"
};

// The tensors of a GPT-2 model with this config, in model order (wte, wpe unless sinusoidal,
// h.0.* ... h.{n_layer-1}.*, ln_f.*).
std::vector<TensorSpec> gpt2_tensor_specs(const ModelConfig& config);
// The tensors of a Llama-family model (HF names, nn.Linear weights [out, in]): embed_tokens,
// model.layers.<i>.{input_layernorm, self_attn.{q,k,v}_proj (+ biases when qkv_bias),
// self_attn.o_proj (+ bias when o_bias), post_attention_layernorm, mlp.{gate,up,down}_proj},
// model.norm, and lm_head when not tied.
std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& config);
// The one of the two for the config's family.
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& config);

class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> open(const std::string& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }

  DType dtype(std::string_view name) const;
  std::vector<int64_t> shape(std::string_view name) const;
  // The file that holds the tensor (for messages).
  const std::string& file_of(std::string_view name) const;

  // The tensor's f32 data inside the mapping when the whole tensor is F32 and 4-byte aligned
  // (read in place, no copy), else nullptr. Counts the tensor's bytes in bytes_read() when it
  // returns a pointer.
  const float* f32_in_place(std::string_view name) const;

  // Copies a slice into `out` (row-major [rows x cols] of the slice) as f32, converting F16/BF16.
  // Reads only the slice's bytes; a column slice reads strided rows.
  void read_f32(std::string_view name, const SliceSpec& slice, float* out) const;

  // Bytes of tensor data read (or handed out in place) so far, in the checkpoint's dtypes.
  uint64_t bytes_read() const { return bytes_read_->load(std::memory_order_relaxed); }

  // Tensor names without prefix, in model order (as gpt2_tensor_specs).
  std::vector<std::string> tensor_names() const;

 private:
  struct TensorRef {
    size_t file = 0;                         // index into files_
    const SafetensorsTensor* tensor = nullptr;  // inside files_[file] (stable under moves)
    DType dtype = DType::kF32;
  };

  Checkpoint() = default;
  const TensorRef& ref(std::string_view name) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> names_;                         // model order
  std::map<std::string, TensorRef, std::less<>> tensors_;  // by name without prefix
  std::unique_ptr<std::atomic<uint64_t>> bytes_read_ =
      std::make_unique<std::atomic<uint64_t>>(0);
};

}  // namespace ltm
