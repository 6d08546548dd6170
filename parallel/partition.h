// Partition arithmetic: which layers, heads, vocab rows and FFN columns a rank owns.
//
// Pure functions of integers (no MPI, no model types), so every split can be tested exhaustively
// without starting ranks. The layout they implement is docs/architecture.md "Ranks and slices":
//   world = tp * pp;  rank = pp_rank * tp + tp_rank
//   layers: contiguous per pipeline stage, uneven splits allowed (the first n_layer % pp stages
//           get one extra layer);
//   heads, FFN columns: contiguous per TP rank, divisibility required;
//   vocab rows: the vocab is padded up to a multiple of tp and split evenly, so the last TP rank's
//           range may run past the real vocab (valid_rows says how many rows are real).
//
// Failure: the Range functions assert (LTM_ASSERT) on arguments that validate_layout refuses; call
// validate_layout first with user-supplied numbers and report its Status.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace ltm::parallel {

// Half-open [begin, end) range of indices.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return begin <= i && i < end; }
  friend bool operator==(const Range&, const Range&) = default;
};

// Layers of pipeline stage `pp_rank` out of `pp` stages. Requires 1 <= pp <= n_layer.
Range layer_range(int64_t n_layer, int pp, int pp_rank);

// Layers of stage `pp_rank` when the last stage also runs the LM head, whose work equals
// `head_layers` layers (for GPT-2 shapes V d / (12 d^2) = V / (12 d) in GEMM work: 5.5 for
// GPT-2-124M, 0.34 for GPT-3-175B; stage_layers below discounts it for a layer's other work).
// The last stage gets fewer layers so that the stages take about the same time (a pipeline runs
// at the pace of its slowest stage); every stage keeps at least one layer, the other stages split
// the rest as layer_range does. head_layers = 0 gives layer_range.
// Requires 1 <= pp <= n_layer, head_layers >= 0.
Range balanced_layer_range(int64_t n_layer, int pp, int pp_rank, double head_layers);

// The model's pipeline stages: the layers of stage `pp_rank` for a GPT model of `n_layer` layers,
// width `n_embd` and vocabulary `vocab_size`, whose last stage also runs the LM head.
// The head's GEMM is V d multiply-adds per token, a layer's 12 d^2; but a layer also runs
// attention over the context, two layer norms, GELU and residuals, which the head does not.
// Measured on the CPU backend (perf, GPT-2-124M, pp 2, decode batches of 32, contexts of 32-96):
// a layer takes 1.3x its GEMM time, the head (with sampling) 1.07x, so the head counts as
// V / (12 d) / (1.3 / 1.07) layers (4.49 for GPT-2-124M: 8 + 4 layers with pp 2). Counting GEMMs
// alone gave the last stage 3 of 12 layers and left stage 0 the slowest by ~20%.
inline constexpr double kLayerOverHeadCost = 1.3 / 1.07;
double lm_head_layers(int64_t vocab_size, int64_t n_embd);
Range stage_layers(int64_t n_layer, int64_t vocab_size, int64_t n_embd, int pp, int pp_rank);
// The most layers any stage holds (what a rank's KV cache is sized for).
int64_t max_stage_layers(int64_t n_layer, int64_t vocab_size, int64_t n_embd, int pp);

// Attention heads of TP rank `tp_rank`. Requires n_head % tp == 0.
Range head_range(int64_t n_head, int tp, int tp_rank);

// `vocab` rounded up to a multiple of tp: the row count of the (padded) embedding matrix.
int64_t padded_vocab(int64_t vocab, int tp);

// Rows of the padded vocab owned by TP rank `tp_rank`: padded_vocab / tp rows each.
Range vocab_range(int64_t vocab, int tp, int tp_rank);

// How many rows of `rows` (a vocab_range) are real tokens (< vocab); the rest are padding.
int64_t valid_rows(Range rows, int64_t vocab);

// FFN hidden columns (of d_ff) owned by TP rank `tp_rank`. Requires d_ff % tp == 0.
Range ffn_range(int64_t d_ff, int tp, int tp_rank);

// Checks that tp >= 1, pp >= 1 and world_size == tp * pp. InvalidArgument naming the numbers,
// e.g. "mpirun started 3 ranks but --tp 2 x --pp 2 needs 4".
absl::Status validate_world(int world_size, int tp, int pp);

// validate_world, then the model's shapes: n_head % tp, d_ff % tp, pp <= n_layer. InvalidArgument
// with a message naming the numbers, e.g. "--tp 3 does not divide the model's 16 attention heads".
absl::Status validate_layout(int world_size, int tp, int pp, int64_t n_head, int64_t n_layer,
                             int64_t d_ff);
// The same for grouped-query attention with n_kv_head KV heads (n_kv_head divides n_head): also
// tp divides n_kv_head, or is a multiple of it (then each KV head is replicated on
// tp / n_kv_head ranks).
absl::Status validate_layout(int world_size, int tp, int pp, int64_t n_head, int64_t n_kv_head,
                             int64_t n_layer, int64_t d_ff);

// KV heads of TP rank `tp_rank` (grouped-query attention): a contiguous share when tp divides
// n_kv_head; when tp is a multiple of n_kv_head, the one KV head whose group holds the rank's
// query heads (head_range). Either way query head h of the rank reads its local KV head
// (h - heads.begin) / (heads.size() / kv_heads.size()).
Range kv_head_range(int64_t n_kv_head, int tp, int tp_rank);

}  // namespace ltm::parallel
