#include "runtime/spec/draft_model.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "runtime/model/capacity_plan.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/weight_source.h"
#include "runtime/spec/sampled_drafts.h"

namespace ltm {

namespace {

absl::Status flag_error(const std::string& dir, const absl::Status& st) {
  return absl::InvalidArgumentError(absl::StrCat("--draft-model ", dir, ": ", st.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DraftModelProposer>> DraftModelProposer::load(
    const DraftModelOptions& o) {
  namespace fs = std::filesystem;
  if (o.dir.empty())
    return absl::InvalidArgumentError("--speculative draft needs --draft-model DIR");
  std::error_code ec;
  const bool folder = fs::is_directory(o.dir, ec);
  if (!folder && !fs::is_regular_file(o.dir, ec))
    return absl::InvalidArgumentError(
        absl::StrCat("--draft-model ", o.dir, ": no such folder or config file"));
  absl::StatusOr<ModelConfig> config =
      load_model_config(folder ? (fs::path(o.dir) / "config.json").string() : o.dir);
  if (!config.ok()) return flag_error(o.dir, config.status());
  if (config->vocab_size != o.target_vocab)
    return absl::InvalidArgumentError(absl::StrCat(
        "--draft-model ", o.dir, " has a vocabulary of ", config->vocab_size,
        " tokens and the target (--model) one of ", o.target_vocab,
        ": a draft model must use the target's tokenizer"));

  std::unique_ptr<DraftModelProposer> p(new DraftModelProposer());
  p->dir_ = o.dir;
  p->block_size_ = std::max(1, o.block_size);
  if (o.make_backend) {
    std::string error;
    p->backend_ = o.make_backend(&error);
    if (p->backend_ == nullptr)
      return absl::FailedPreconditionError(
          absl::StrCat("--draft-model ", o.dir, ": its backend (--draft-device): ", error));
  } else {
    p->backend_ = make_cpu_backend(o.threads);
  }
  p->comm_ = std::make_unique<parallel::SoloCommunicator>("draft");
  std::unique_ptr<WeightSource> source;
  ModelOptions mopts;
  if (folder) {
    absl::StatusOr<Checkpoint> ckpt = Checkpoint::open(o.dir);
    if (!ckpt.ok()) return flag_error(o.dir, ckpt.status());
    mopts.weights = draft_weight_precision(*ckpt, *config);
    source = make_checkpoint_source(std::make_shared<const Checkpoint>(std::move(*ckpt)), o.dir);
  } else {
    source = make_random_source(*config, o.init_seed, o.init_std);
  }
  // Sized as ltm-plan counts it (capacity_plan.h, draft_memory): a full context for each of
  // max_sequences sequences; the cache's type is the target's default for this backend
  // (default_kv_precision: bf16 with bf16 weights on CUDA, of the same size as draft_memory's).
  const DraftMemory sizing = draft_memory(*config, mopts.weights, p->block_size_, o.max_sequences);
  p->kv_precision_ = default_kv_precision(mopts.weights,
                                          p->backend_->activation_precision(mopts.weights));
  if (!p->backend_->supports(mopts.weights, p->kv_precision_))
    return absl::InvalidArgumentError(absl::StrCat(
        "--draft-model ", o.dir, ": ", p->backend_->describe(), " does not hold ",
        precision_name(mopts.weights), " weights"));
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::load(*source, *p->backend_, ShardSpec{}, *p->comm_, mopts);
  if (!model.ok()) return flag_error(o.dir, model.status());
  p->model_ = std::move(*model);
  const int32_t n_blocks = sizing.kv_blocks;
  p->cache_ = std::make_unique<KvCache>(*p->backend_, config->n_layer, p->model_->n_kv_head_local(),
                                        config->head_dim(), p->block_size_, n_blocks,
                                        p->kv_precision_);
  p->free_blocks_.reserve(static_cast<size_t>(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; --b) p->free_blocks_.push_back(b);
  return p;
}

DraftModelProposer::~DraftModelProposer() {
  cache_.reset();
  model_.reset();  // before the communicator and backend it uses
}

int64_t DraftModelProposer::weight_bytes() const {
  return static_cast<int64_t>(model_->weight_bytes());
}

int64_t DraftModelProposer::kv_bytes() const {
  const ModelConfig& c = config();
  return static_cast<int64_t>(cache_->n_blocks()) *
         KvCache::block_bytes(c.n_layer, model_->n_kv_head_local(), c.head_dim(), block_size_,
                              kv_precision_);
}

std::string DraftModelProposer::describe() const {
  const ModelConfig& c = config();
  const int64_t kv = kv_bytes();
  return absl::StrFormat("%s (%d layers, n_embd %d, %s weights, KV cache %.1f MiB %s) on %s", dir_,
                         c.n_layer, c.n_embd, precision_name(model_->weight_precision()),
                         kv / 1048576.0, precision_name(kv_precision_), backend_->describe());
}

void DraftModelProposer::drop(std::map<uint64_t, Seq>::iterator it) {
  free_blocks_.insert(free_blocks_.end(), it->second.blocks.begin(), it->second.blocks.end());
  seqs_.erase(it);
}

void DraftModelProposer::release(uint64_t seq_id) {
  if (auto it = seqs_.find(seq_id); it != seqs_.end()) drop(it);
}

bool DraftModelProposer::reserve(Seq& seq, int32_t n_tokens,
                                 const std::map<uint64_t, bool>& keep) {
  const size_t need = static_cast<size_t>(blocks_for(n_tokens, block_size_));
  while (seq.blocks.size() > need) {  // positions dropped with rejected drafts
    free_blocks_.push_back(seq.blocks.back());
    seq.blocks.pop_back();
  }
  while (seq.blocks.size() < need) {
    if (free_blocks_.empty()) {
      auto victim = seqs_.end();  // the least recently used sequence not in this call
      for (auto it = seqs_.begin(); it != seqs_.end(); ++it)
        if (!keep.count(it->first) && !it->second.blocks.empty() &&
            (victim == seqs_.end() || it->second.last_used < victim->second.last_used))
          victim = it;
      if (victim == seqs_.end()) return false;
      drop(victim);
      ++evictions_;
      continue;
    }
    seq.blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return true;
}

std::vector<int32_t> DraftModelProposer::forward(const std::vector<Rows>& batch) {
  StepInput in;
  int32_t max_blocks = 0;
  for (const Rows& r : batch)
    max_blocks = std::max(max_blocks, static_cast<int32_t>(r.seq->blocks.size()));
  in.max_blocks_per_seq = max_blocks;
  in.token_offsets.push_back(0);
  for (const Rows& r : batch) {
    Seq& s = *r.seq;
    const int32_t n0 = static_cast<int32_t>(s.tokens.size());
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const int32_t pos = n0 + static_cast<int32_t>(i);
      in.token_ids.push_back(r.tokens[i]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(s.blocks[static_cast<size_t>(pos / block_size_)] * block_size_ +
                                pos % block_size_);
    }
    in.token_offsets.push_back(in.n_tokens());
    in.context_lens.push_back(n0 + static_cast<int32_t>(r.tokens.size()));
    for (int32_t b = 0; b < max_blocks; ++b)
      in.block_tables.push_back(b < static_cast<int32_t>(s.blocks.size()) ? s.blocks[b] : 0);
    in.logit_rows.push_back(in.n_tokens() - 1);
    s.tokens.insert(s.tokens.end(), r.tokens.begin(), r.tokens.end());
  }
  const int64_t d = config().n_embd, vl = model_->vocab_local(), V = config().vocab_size;
  const size_t hidden_bytes = static_cast<size_t>(in.n_tokens() * d) * sizeof(float);
  if (hidden_.bytes() < hidden_bytes) hidden_ = backend_->alloc(hidden_bytes);
  const int64_t m = static_cast<int64_t>(in.logit_rows.size());
  const size_t logit_bytes = static_cast<size_t>(m * vl) * sizeof(float);
  if (logits_.bytes() < logit_bytes) logits_ = backend_->alloc(logit_bytes);
  const auto t0 = std::chrono::steady_clock::now();
  model_->run_stage(in, hidden_.f32(), *cache_);
  model_->compute_logits(in, hidden_.f32(), logits_.f32());
  std::vector<unsigned char> staging;
  const float* rows =
      static_cast<const float*>(backend_->read_on_host(logits_.data(), logit_bytes, staging));
  forward_steps_++;
  forward_tokens_ += in.n_tokens();
  if (in.n_tokens() <= 2 * m) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                     static_cast<double>(m);
    seconds_per_draft_ = seconds_per_draft_ == 0 ? s : 0.8 * seconds_per_draft_ + 0.2 * s;
  }
  std::vector<int32_t> next(static_cast<size_t>(m), 0);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = rows + i * vl;
    if (const DraftRequest* r = batch[static_cast<size_t>(i)].request) {
      // Sampled: q is the request's processing of the draft's logits; the history for a
      // repetition penalty is the sequence's tokens and the guesses so far (Seq::tokens now).
      std::vector<float> q;
      const std::span<const int32_t> history =
          r->sampling->repetition_penalty != 1.0f
              ? std::span<const int32_t>(batch[static_cast<size_t>(i)].seq->tokens)
              : std::span<const int32_t>();
      processed_probabilities(std::span<const float>(row, static_cast<size_t>(V)), *r->sampling,
                              history, &q);
      Rng rng = draft_rng(r->sampling->seed, r->token_index + batch[static_cast<size_t>(i)].draft);
      const int32_t x = draw_from_weights(q, rng.uniform());
      next[static_cast<size_t>(i)] = x;
      if (x >= 0) r->probs->insert(r->probs->end(), q.begin(), q.end());
      continue;
    }
    // Greedy: the first largest logit (NaN never wins).
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best] || (row[best] != row[best] && row[v] == row[v])) best = v;
    next[static_cast<size_t>(i)] = static_cast<int32_t>(best);
  }
  return next;
}

void DraftModelProposer::propose_all(std::span<const DraftRequest> requests) {
  ++clock_;
  const int64_t n_positions = config().n_positions;
  std::map<uint64_t, bool> keep;
  for (const DraftRequest& r : requests) keep[r.seq_id] = true;
  struct Active {
    const DraftRequest* r;
    Seq* seq;
    int32_t k;
  };
  std::vector<Active> active;
  for (const DraftRequest& r : requests) {
    const int32_t n = static_cast<int32_t>(r.tokens.size());
    // Drafts take positions n .. n + k - 1; the draft computes those before the last: < n_positions.
    const int32_t k = static_cast<int32_t>(
        std::min<int64_t>(r.max_tokens, n_positions + 1 - static_cast<int64_t>(n)));
    if (k <= 0 || n == 0) continue;
    Seq& s = seqs_[r.seq_id];
    s.last_used = clock_;
    // Keep the K/V of the longest prefix the cache shares with the tokens (accepted drafts
    // included), but for the last token, whose row gives the first draft.
    const size_t limit = std::min(s.tokens.size(), static_cast<size_t>(n - 1));
    size_t common = 0;
    while (common < limit && s.tokens[common] == r.tokens[common]) ++common;
    s.tokens.resize(common);
    if (!reserve(s, n + k - 1, keep)) continue;  // the cache is full of this call's sequences
    active.push_back({&r, &s, k});
  }
  if (active.empty()) return;
  // The first pass computes each sequence's new tokens (the step's correction, or its prompt
  // the first time); each later pass one row per sequence that wants more drafts: the last one.
  // A request with a temperature > 0 and somewhere to put q gets sampled guesses.
  const auto sampled = [](const DraftRequest* r) {
    return r->sampling && r->sampling->temperature > 0 && r->probs ? r : nullptr;
  };
  std::vector<Rows> batch;
  for (const Active& a : active)
    batch.push_back({a.seq,
                     std::vector<int32_t>(a.r->tokens.begin() +
                                              static_cast<std::ptrdiff_t>(a.seq->tokens.size()),
                                          a.r->tokens.end()),
                     sampled(a.r), 0});
  std::vector<int32_t> next = forward(batch);
  for (size_t i = 0; i < active.size(); ++i) {
    if (next[i] < 0) {  // no distribution to sample (a bad row): no guesses
      active[i].k = 0;
      continue;
    }
    active[i].r->out->push_back(next[i]);
  }
  for (int32_t t = 1;; ++t) {
    batch.clear();
    std::vector<size_t> which;
    for (size_t i = 0; i < active.size(); ++i) {
      if (active[i].k <= t) continue;
      batch.push_back({active[i].seq, {active[i].r->out->back()}, sampled(active[i].r), t});
      which.push_back(i);
    }
    if (batch.empty()) break;
    next = forward(batch);
    for (size_t j = 0; j < which.size(); ++j) {
      if (next[j] < 0) {
        active[which[j]].k = 0;
        continue;
      }
      active[which[j]].r->out->push_back(next[j]);
    }
  }
}

void DraftModelProposer::propose(std::span<const int32_t> tokens, int32_t n_prompt,
                                 int32_t max_tokens, std::vector<int32_t>* out) {
  const DraftRequest r{kAnonymous, tokens, n_prompt, max_tokens, out};
  propose_all(std::span<const DraftRequest>(&r, 1));
  release(kAnonymous);
}

}  // namespace ltm
