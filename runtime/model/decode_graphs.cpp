#include "runtime/model/decode_graphs.h"

#include <algorithm>

#include "common/check.h"
#include "runtime/backend/graph_buckets.h"

namespace ltm {
namespace {

// The int32 sections of the input buffer, each at a fixed offset for the largest bucket M (so a
// graph of any bucket keeps its pointers): ids [M], positions [M], token offsets [M + 1], context
// lengths [M], slots [M], logit rows [M], block tables [M, table width].
struct InputLayout {
  int64_t ids, positions, offsets, contexts, slots, rows, tables, total;
  InputLayout(int64_t m, int64_t width)
      : ids(0),
        positions(m),
        offsets(2 * m),
        contexts(3 * m + 1),
        slots(4 * m + 1),
        rows(5 * m + 1),
        tables(6 * m + 1),
        total(6 * m + 1 + m * width) {}
};

}  // namespace

DecodeGraphs::DecodeGraphs(Model& model, Backend& backend, KvCache& cache, int max_batch,
                           int max_context)
    : model_(model), backend_(backend), cache_(cache), buckets_(graph_bucket_sizes(max_batch)) {
  LTM_ASSERT(backend.supports_graphs(), "decode graphs on ", backend.describe());
  LTM_ASSERT(max_context >= 1 && cache.block_size() >= 1);
  table_width_ = (max_context + cache.block_size() - 1) / cache.block_size();
}

DecodeGraphs::~DecodeGraphs() {
  // A replay may still be queued: no graph goes while the stream may run it.
  if (!graphs_.empty()) backend_.synchronize();
}

int DecodeGraphs::bucket_for(const StepInput& step) const {
  const int n = step.n_seqs();
  if (n < 1 || step.n_tokens() != n) return 0;
  for (int i = 0; i < n; ++i)
    if (step.token_offsets[i + 1] - step.token_offsets[i] != 1) return 0;
  for (int32_t id : step.adapter_ids)
    if (id != 0) return 0;
  if (static_cast<int>(step.logit_rows.size()) != n) return 0;
  for (int i = 0; i < n; ++i)
    if (step.logit_rows[i] != i) return 0;
  if (step.max_blocks_per_seq > table_width_) return 0;
  const int64_t max_context = static_cast<int64_t>(table_width_) * cache_.block_size();
  for (int32_t c : step.context_lens)
    if (c < 1 || c > max_context) return 0;
  return graph_bucket_for(n, buckets_);
}

void DecodeGraphs::allocate() {
  const int64_t m = max_bucket();
  const int64_t d = model_.config().n_embd;
  hidden_ = backend_.alloc_zeroed(static_cast<size_t>(m * d) * sizeof(float));
  if (model_.shard().is_last_stage())
    logits_ = backend_.alloc(static_cast<size_t>(m * model_.vocab_local()) * sizeof(float));
  const InputLayout at(m, table_width_);
  inputs_ = backend_.alloc_zeroed(static_cast<size_t>(at.total) * sizeof(int32_t));
  model_.ensure_workspace(ws_, m);
  allocated_ = true;
}

float* DecodeGraphs::hidden() {
  if (!allocated_) allocate();
  return hidden_.f32();
}

void DecodeGraphs::run(const StepInput& step) {
  const int bucket = bucket_for(step);
  LTM_ASSERT(bucket > 0, "DecodeGraphs::run on a step with no bucket");
  if (!allocated_) allocate();
  const int n = step.n_seqs();
  const int m = max_bucket();
  const int width = table_width_;
  const int step_width = step.max_blocks_per_seq;
  const InputLayout at(m, width);

  // The step padded to the bucket, in one host array and one copy (the graph reads it there).
  const int64_t used = at.tables + static_cast<int64_t>(bucket) * width;
  host_inputs_.assign(static_cast<size_t>(used), 0);
  int32_t* h = host_inputs_.data();
  for (int i = 0; i < bucket; ++i) {
    const bool real = i < n;
    h[at.ids + i] = real ? step.token_ids[i] : 0;
    h[at.positions + i] = real ? step.positions[i] : 0;
    h[at.contexts + i] = real ? step.context_lens[i] : 1;
    h[at.slots + i] = real ? step.slot_mapping[i] : -1;
    h[at.rows + i] = i;
    if (real)
      std::copy_n(step.block_tables.begin() + static_cast<int64_t>(i) * step_width, step_width,
                  h + at.tables + static_cast<int64_t>(i) * width);
  }
  for (int i = 0; i <= bucket; ++i) h[at.offsets + i] = i;
  backend_.copy_to_device(inputs_.data(), h, static_cast<size_t>(used) * sizeof(int32_t));

  const int32_t* base = inputs_.i32();
  Model::StagedStep staged;
  AttentionArgs& a = staged.attn;
  a.n_seqs = bucket;
  a.n_tokens = bucket;
  a.token_offsets = base + at.offsets;
  a.context_lens = base + at.contexts;
  a.block_tables = base + at.tables;
  a.slot_mapping = base + at.slots;
  a.max_blocks_per_seq = width;
  a.max_context_len = width * cache_.block_size();  // the graph's split fits any context
  a.max_new_tokens = 1;
  a.n_head = static_cast<int>(model_.n_head_local());
  a.n_kv_head = static_cast<int>(model_.n_kv_head_local());
  a.head_dim = static_cast<int>(model_.config().head_dim());
  a.block_size = cache_.block_size();
  a.kv = cache_.precision();
  a.act = model_.activation_precision();
  staged.token_ids = base + at.ids;
  staged.positions = base + at.positions;
  staged.lora = false;
  const int32_t* rows = base + at.rows;
  float* hidden = hidden_.f32();
  float* logits = logits_.empty() ? nullptr : logits_.f32();
  auto ops = [&] {
    model_.forward(staged, hidden, cache_, ws_);
    if (logits != nullptr) model_.logits_from(rows, bucket, hidden, logits, ws_);
  };

  auto it = graphs_.find(bucket);
  if (it == graphs_.end()) {
    graphs_.emplace(bucket, backend_.capture(ops));  // runs this step, then records it
  } else {
    backend_.replay(*it->second);
    ++replays_;
  }
}

}  // namespace ltm
