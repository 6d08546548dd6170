// Model hyper-parameters, read from an HF `config.json` (GPT-2, or the Llama family: Llama,
// Mistral, Qwen2) or from configs/*.json (GPT-3 and Llama shapes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ltm {

// The two families ltm runs (docs/architecture.md, "The model"):
//   kGpt2:  LayerNorm, learned or sinusoidal positions, GELU MLP, biases, tied LM head.
//   kLlama: RMSNorm, rotate-half RoPE, SwiGLU MLP (down(silu(gate(x)) * up(x))), grouped-query
//           attention, no biases but q/k/v (Qwen2, attention_bias) and o (attention_bias),
//           tied or untied LM head. HF's LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM.
enum class Family { kGpt2, kLlama };
enum class PositionEmbedding { kLearned, kSinusoidal, kRope };
// rope_scaling's rope_type: none, "linear" (angles / factor), "llama3" (Llama 3.1's per-frequency
// scaling).
enum class RopeScaling { kNone, kLinear, kLlama3 };

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

  // --- the Llama family (family == kLlama); GPT-2 leaves the defaults ---
  Family family = Family::kGpt2;
  std::string architecture;   // "LlamaForCausalLM", ...; "GPT2LMHeadModel" for GPT-2
  int64_t n_kv_head = 0;      // num_key_value_heads; 0: n_head (multi-head attention)
  int64_t head_size = 0;      // head_dim when config.json gives one; 0: n_embd / n_head
  bool tied_lm_head = true;   // tie_word_embeddings
  bool qkv_bias = true;       // q/k/v projections have biases (GPT-2, Qwen2, attention_bias)
  bool o_bias = true;         // the attention output projection has one (GPT-2, attention_bias)
  bool mlp_bias = true;       // the MLP's projections have them (GPT-2 only)
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_factor = 1.0f;   // linear and llama3
  float rope_low_freq_factor = 1.0f, rope_high_freq_factor = 4.0f;  // llama3
  int64_t rope_original_max_positions = 8192;                        // llama3

  bool is_llama() const { return family == Family::kLlama; }
  int64_t head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }  // d_k
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t q_width() const { return n_head * head_dim(); }      // columns of Q (= n_embd for GPT-2)
  int64_t kv_width() const { return kv_heads() * head_dim(); }  // columns of K, and of V
  // Exact parameter count: embeddings (wte, and wpe when learned) + per-layer weights and biases
  // + final norm, + the LM head when it is not tied to the embedding.
  int64_t parameter_count() const;
};

// RoPE's inverse frequencies, head_dim / 2 of them: 1 / rope_theta^(2i / head_dim), scaled as
// rope_scaling says (HF's _compute_default/linear/llama3_rope_parameters), rounded to fp32.
std::vector<float> rope_inv_freq(const ModelConfig& config);

// Parses a Llama-family config.json (model_type llama / mistral / qwen2, or architectures naming
// LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM): hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, max_position_embeddings, vocab_size (required);
// num_key_value_heads (default num_attention_heads; must divide it), head_dim, rms_norm_eps
// (1e-6), rope_theta (10000), rope_scaling (null, linear, llama3), tie_word_embeddings (false),
// attention_bias (false; Qwen2 has q/k/v biases always), hidden_act (silu only), mlp_bias
// (false only), sliding_window (Mistral: must be null; Qwen2: only with use_sliding_window
// false), bos/eos_token_id (an id, a list: its first, or null). Errors name the key.
absl::StatusOr<ModelConfig> parse_llama_config(const std::string& json_text,
                                               const std::string& source);
// Whether config.json text names a Llama-family model (see parse_llama_config).
bool is_llama_config_text(const std::string& json_text);

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
