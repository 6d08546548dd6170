// Model hyper-parameters, read from an HF GPT-2 `config.json` or from configs/*.json (GPT-3 shapes).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ltm {

enum class PositionEmbedding { kLearned, kSinusoidal };

struct ModelConfig {
  int64_t vocab_size = 0;     // |V|
  int64_t n_positions = 0;    // context window
  int64_t n_embd = 0;         // d
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_inner = 0;        // d_ff; 4 d when the config has none (or null)
  float layer_norm_epsilon = 1e-5f;
  PositionEmbedding position_embedding = PositionEmbedding::kLearned;
  int64_t eos_token_id = 50256;  // -1: the model has none
  int64_t bos_token_id = 50256;

  int64_t head_dim() const { return n_embd / n_head; }  // d_k
  // Exact parameter count: embeddings (wte, and wpe when learned) + per-layer weights and biases
  // + final LayerNorm; the LM head is tied to wte and not counted again.
  int64_t parameter_count() const;
};

// Parses config.json text (HF GPT2Config keys). `source` names the file in error messages.
// Keys: vocab_size, n_positions (or n_ctx), n_embd, n_layer, n_head (required, positive);
// layer_norm_epsilon (default 1e-5); activation_function (default gelu_new; gelu_new,
// gelu_pytorch_tanh and gelu_fast are all the tanh GELU, which is the only one ltm computes);
// n_inner (absent or null: 4 d); eos_token_id / bos_token_id (null: none; absent: 50256 when
// that is inside the vocabulary, else none); position_embedding_type ("learned" / "absolute",
// the default, or "sinusoidal"). Other keys are ignored, except those that would change the
// computation in a way ltm does not implement (tie_word_embeddings: false,
// scale_attn_weights: false, scale_attn_by_inverse_layer_idx: true, add_cross_attention: true),
// which are errors.
// Errors (InvalidArgument, message names the file and the key and says what was expected):
// invalid JSON, a missing, mistyped or non-positive required key, sizes beyond ltm's limits,
// n_embd not divisible by n_head, an unsupported activation_function, an unknown
// position_embedding_type, a token id outside the vocabulary.
absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text,
                                               const std::string& source);
// Reads and parses a file (NotFound when it cannot be read).
absl::StatusOr<ModelConfig> load_model_config(const std::string& path);

}  // namespace ltm
