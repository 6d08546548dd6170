// FLOPs of a forward pass, for the compute limits ltm-bench and scripts/bench_serve report.
//
// Counted: 2 FLOPs per multiply-add of the matrix products, which are the layers' weight
// matrices (Q, K, V, O and the MLP's two or three), the LM head (|V| x d, tied or not), and
// attention's two products (QK^T and PV: 2 x q_width multiply-adds per position a token attends
// to, the token itself included). Not counted: norms, biases, activations, softmax, embedding
// lookups (a few per cent of a GPT-2-124M token). A token at position p (0-based) attends to p+1
// positions. Prefill computes logits for the last prompt token only; every decode step does.
#pragma once

#include <cstdint>

#include "runtime/model/model_config.h"

namespace ltm {

// Multiply-adds of one layer's weight matrices for one token (12 d^2 for GPT-2).
double layer_matrix_macs(const ModelConfig& c);
// 2 x (all layers' matrices): one token, without the LM head and attention.
double matrix_flops_per_token(const ModelConfig& c);
// 2 x |V| x d: the LM head for one token.
double lm_head_flops(const ModelConfig& c);
// 4 x n_layer x q_width x positions: attention of one token over `positions` positions.
double attention_flops(const ModelConfig& c, int64_t positions);
// One sequence's prefill of `prompt_tokens` tokens, logits of the last one included.
double prefill_flops(const ModelConfig& c, int64_t prompt_tokens);
// One decode step of one sequence that attends to `positions` positions (its new token included).
double decode_step_flops(const ModelConfig& c, int64_t positions);
// The decode steps after a prefill of `prompt_tokens`, which gave the first of `new_tokens`: the
// other new_tokens - 1 steps, attending to prompt_tokens + 1 .. prompt_tokens + new_tokens - 1
// positions.
double decode_flops(const ModelConfig& c, int64_t prompt_tokens, int64_t new_tokens);
// A whole request: prefill_flops + decode_flops.
double request_flops(const ModelConfig& c, int64_t prompt_tokens, int64_t new_tokens);

}  // namespace ltm
