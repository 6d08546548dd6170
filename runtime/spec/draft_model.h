// The draft-model proposer (--speculative draft --draft-model DIR): a small model that shares the
// target's tokenizer guesses the next tokens, greedily at temperature 0 (verified as prompt
// lookup's) and sampled from its own distribution q at temperature > 0 (verified by the rule for
// a sampled q, runtime/spec/sampled_drafts.h), and the target verifies them
// (runtime/sched/scheduler_spec.cpp). It runs on rank 0 alone, in the scheduler's
// process and thread, on a backend of its own with its own paged KV cache, whatever the
// target's layout (tp x pp, CPU or CUDA): rank 0's CPU by default, or (--draft-device device)
// rank 0's device, its GPU with --device cuda, where a draft pass costs a fraction of what it
// costs on the host cores beside it; the worker then reserves the draft's device memory before
// it sizes the target's KV cache (capacity_plan.h, draft_device_bytes).
//
// A greedy draft is a deterministic proposal (a function of the tokens so far), so accepting a
// draft iff the target's sampled row equals it keeps the target's distribution exactly
// (runtime/spec/proposer.h); a sampled draft (DraftRequest::probs) is drawn with the request's
// temperature, top-k, top-p and repetition penalty applied to the draft's logits, from
// draft_rng(seed, token index), and keeps the target's distribution by the general rule. Its numbers depend on the batch it ran in only as far
// as rounding does, as the target's do.
//
// State per sequence: the tokens whose K/V the draft's cache holds and their blocks. A call
// keeps the longest prefix those share with the sequence's tokens now (the accepted drafts'
// K/V were written when they were drafted) and drops the rest (rejected drafts), so a step costs
// the draft its new tokens only: the correction, then one row per draft. All sequences of a
// call run as one batch per draft token. When the cache is full, the state of the sequence used
// least recently (not in this call) is dropped; a sequence that still does not fit gets no
// drafts. release() frees a sequence's state.
// Threading: one thread (the scheduler's step thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/spec/proposer.h"

namespace ltm {

struct DraftModelOptions {
  std::string dir;            // --draft-model: an HF folder, or a config .json (random weights)
  int64_t target_vocab = 0;   // the target's vocab_size: the draft's must be the same
  int threads = 1;            // of the draft's CPU backend
  // The draft's backend: empty for a CPU backend of `threads` threads; else called once by load()
  // (null with *error set: it could not be made). The worker's --draft-device device gives rank
  // 0's device (its GPU, or the emulated device).
  std::function<std::unique_ptr<Backend>(std::string* error)> make_backend;
  int32_t block_size = 16;
  int32_t max_sequences = 8;  // sequences whose draft K/V is kept at once (a full context each)
  uint64_t init_seed = 1;     // a config .json: its random weights
  float init_std = 0.02f;
};

class DraftModelProposer final : public Proposer {
 public:
  // Loads the draft. InvalidArgument naming --draft-model for a missing folder or file, a config
  // or checkpoint that cannot be read, or a vocabulary that is not the target's.
  static absl::StatusOr<std::unique_ptr<DraftModelProposer>> load(const DraftModelOptions& options);
  ~DraftModelProposer() override;

  // One sequence with no state kept (tests, tools): as propose_all of one request, released after.
  void propose(std::span<const int32_t> tokens, int32_t n_prompt, int32_t max_tokens,
               std::vector<int32_t>* out) override;
  void propose_all(std::span<const DraftRequest> requests) override;
  void release(uint64_t seq_id) override;
  // A decayed mean of the draft passes' seconds per sequence (passes of one or two rows a
  // sequence: a prompt's first pass is not a draft's cost).
  double seconds_per_draft() const override { return seconds_per_draft_; }
  int64_t parameters() const override { return config().parameter_count(); }

  const ModelConfig& config() const { return model_->config(); }
  // What it holds (the worker's memory report): model_->weight_bytes() and the KV cache's bytes,
  // as ltm-plan's draft_memory counts them (runtime/model/capacity_plan.h).
  int64_t weight_bytes() const;
  int64_t kv_bytes() const;
  Precision weight_precision() const { return model_->weight_precision(); }
  Precision kv_precision() const { return kv_precision_; }
  std::string describe() const;  // "DIR (4 layers, ..., KV cache 16.0 MiB fp16) on BACKEND"
  std::string backend_describe() const { return backend_->describe(); }  // where it runs
  // Counters for tests and benchmarks.
  int32_t sequences() const { return static_cast<int32_t>(seqs_.size()); }
  int32_t blocks_free() const { return static_cast<int32_t>(free_blocks_.size()); }
  int32_t blocks_total() const { return cache_->n_blocks(); }
  int64_t forward_steps() const { return forward_steps_; }    // draft forward passes
  int64_t forward_tokens() const { return forward_tokens_; }  // rows they computed
  int64_t evictions() const { return evictions_; }

  // The id propose() uses for its throw-away state (the scheduler's ids start at 1).
  static constexpr uint64_t kAnonymous = 0;

 private:
  DraftModelProposer() = default;
  struct Seq {
    std::vector<int32_t> tokens;  // whose K/V are in the cache, positions 0 ..
    std::vector<int32_t> blocks;
    uint64_t last_used = 0;
  };
  // Makes seq hold blocks for n_tokens positions, evicting others' state (not `keep`) if need be.
  bool reserve(Seq& seq, int32_t n_tokens, const std::map<uint64_t, bool>& keep);
  void drop(std::map<uint64_t, Seq>::iterator it);
  // One forward pass: rows[i] are sequence i's new tokens (from its Seq::tokens' end); returns
  // the token after each sequence's last row: greedy, or with `request` (temperature > 0 and
  // probs) drawn from the draft's distribution q there (runtime/spec/sampled_drafts.h), q
  // appended to *request->probs; -1 where a sampled row has no distribution (a bad row).
  struct Rows {
    Seq* seq;
    std::vector<int32_t> tokens;
    const DraftRequest* request = nullptr;  // set: sample guess number `draft` of this request
    int32_t draft = 0;
  };
  std::vector<int32_t> forward(const std::vector<Rows>& batch);

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<parallel::SoloCommunicator> comm_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> cache_;
  Precision kv_precision_ = Precision::kF32;
  int32_t block_size_ = 16;
  std::vector<int32_t> free_blocks_;
  std::map<uint64_t, Seq> seqs_;
  uint64_t clock_ = 0;
  DeviceBuffer hidden_, logits_;
  int64_t forward_steps_ = 0, forward_tokens_ = 0, evictions_ = 0;
  double seconds_per_draft_ = 0;
};

}  // namespace ltm
