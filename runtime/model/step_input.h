// StepInput: one forward step's batch as host arrays, the part of a step plan the model reads
// (runtime/engine/step_plan.h carries it to every rank; runtime/model/model.h runs it).
#pragma once

#include <cstdint>
#include <vector>

namespace ltm {

// The most drafts one sequence verifies in a step (ltm-worker --spec-tokens): its verify rows are
// those and its last token.
inline constexpr int32_t kMaxSpecTokens = 64;

// One forward step for a batch of sequences, as host arrays (the plan every rank receives).
// Sequence s owns batch rows [token_offsets[s], token_offsets[s+1]); after this step its context
// holds context_lens[s] tokens.
struct StepInput {
  std::vector<int32_t> token_ids;      // [n_tokens]  (read by the first stage)
  std::vector<int32_t> positions;      // [n_tokens]
  std::vector<int32_t> slot_mapping;   // [n_tokens]  KV cache slot of each new token
  std::vector<int32_t> token_offsets;  // [n_seqs + 1]
  std::vector<int32_t> context_lens;   // [n_seqs]
  std::vector<int32_t> block_tables;   // [n_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;     // batch rows whose logits the last stage computes
  // [n_seqs] the LoRA adapter each sequence runs with (Model::add_adapter's id; 0 = the base
  // model). Empty: every sequence runs on the base model.
  std::vector<int32_t> adapter_ids;

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t n_seqs() const { return static_cast<int32_t>(context_lens.size()); }
};

}  // namespace ltm
