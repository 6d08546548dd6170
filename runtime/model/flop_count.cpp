#include "runtime/model/flop_count.h"

namespace ltm {

double layer_matrix_macs(const ModelConfig& c) {
  const double d = static_cast<double>(c.n_embd);
  // Q (d x q), K and V (d x kv each), O (q x d); the MLP: d x d_ff twice (GELU) or three times
  // (SwiGLU's gate, up and down).
  return d * (2.0 * c.q_width() + 2.0 * c.kv_width()) + (c.is_llama() ? 3.0 : 2.0) * d * c.n_inner;
}

double matrix_flops_per_token(const ModelConfig& c) {
  return 2.0 * layer_matrix_macs(c) * static_cast<double>(c.n_layer);
}

double lm_head_flops(const ModelConfig& c) {
  return 2.0 * static_cast<double>(c.vocab_size) * static_cast<double>(c.n_embd);
}

double attention_flops(const ModelConfig& c, int64_t positions) {
  return 4.0 * static_cast<double>(c.n_layer) * static_cast<double>(c.q_width()) *
         static_cast<double>(positions);
}

double prefill_flops(const ModelConfig& c, int64_t prompt_tokens) {
  const double p = static_cast<double>(prompt_tokens);
  // Token i (0-based) attends to i + 1 positions: 1 + 2 + ... + p in all.
  return p * matrix_flops_per_token(c) + attention_flops(c, 1) * (p * (p + 1) / 2) +
         (prompt_tokens > 0 ? lm_head_flops(c) : 0.0);
}

double decode_step_flops(const ModelConfig& c, int64_t positions) {
  return matrix_flops_per_token(c) + lm_head_flops(c) + attention_flops(c, positions);
}

double decode_flops(const ModelConfig& c, int64_t prompt_tokens, int64_t new_tokens) {
  if (new_tokens <= 1) return 0.0;
  const double steps = static_cast<double>(new_tokens - 1);
  // Positions attended: prompt_tokens + 1 .. prompt_tokens + steps, whose sum is
  // steps * prompt_tokens + steps (steps + 1) / 2.
  const double positions = steps * static_cast<double>(prompt_tokens) + steps * (steps + 1) / 2;
  return steps * (matrix_flops_per_token(c) + lm_head_flops(c)) + attention_flops(c, 1) * positions;
}

double request_flops(const ModelConfig& c, int64_t prompt_tokens, int64_t new_tokens) {
  return prefill_flops(c, prompt_tokens) + decode_flops(c, prompt_tokens, new_tokens);
}

}  // namespace ltm
