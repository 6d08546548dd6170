// Test helpers shared by the whole-model comparisons across backends and activation types
// (activation16_test.cpp on the CPU, model_cuda_gpu_test.cpp on a GPU): a random checkpoint with
// non-zero biases and a large top-2 margin, and a greedy run of two sequences whose steps mix a
// prefill with decodes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/step_input.h"
#include "runtime/model/weight_source.h"

namespace ltm::greedy {

// make_random_source's weights (std `std`), but with biases of +-`bias` (a fixed pattern per
// tensor, so the bias epilogues have something to add) and the token embedding scaled by
// `wte_scale` (the tied LM head then gives each step's top token a margin far above 16-bit
// rounding, so greedy tokens must agree across activation types).
class MarginSource final : public WeightSource {
 public:
  MarginSource(const ModelConfig& config, uint64_t seed, float std, float bias, float wte_scale)
      : inner_(make_random_source(config, seed, std)), bias_(bias), wte_scale_(wte_scale) {}
  const ModelConfig& config() const override { return inner_->config(); }
  const float* f32_in_place(std::string_view) const override { return nullptr; }
  void read_f32(std::string_view name, const SliceSpec& s, float* out) const override {
    inner_->read_f32(name, s, out);
    const int64_t n = (s.row_end - s.row_begin) * (s.col_end - s.col_begin);
    if (name.ends_with(".bias")) {
      const float phase = static_cast<float>(name.size());
      for (int64_t i = 0; i < n; ++i) {  // rows of a bias vector are its elements
        const float idx = static_cast<float>(s.row_begin + i);
        out[i] = bias_ * std::sin(0.7f * idx + phase);
      }
    } else if (name == "wte.weight") {
      for (int64_t i = 0; i < n; ++i) out[i] *= wte_scale_;
    }
  }
  uint64_t bytes_read() const override { return inner_->bytes_read(); }
  std::string describe() const override { return "margin source"; }

 private:
  std::unique_ptr<WeightSource> inner_;
  float bias_, wte_scale_;
};

// The checkpoint both whole-model comparisons use: 4 layers, d 256, vocab 512, d_ff 1024;
// `n_head` 4 or 2 gives head_dim 64 or 128.
inline ModelConfig margin_config(int n_head) {
  ModelConfig c;
  c.vocab_size = 512;
  c.n_positions = 128;
  c.n_embd = 256;
  c.n_layer = 4;
  c.n_head = n_head;
  c.n_inner = 1024;
  return c;
}
// Its weights: std 0.02, biases +-0.02, the token embedding scaled by 5.
inline std::unique_ptr<WeightSource> margin_source(const ModelConfig& c) {
  return std::make_unique<MarginSource>(c, 20, 0.02f, 0.02f, 5.0f);
}

struct GreedySeq {
  std::vector<int32_t> tokens;  // prompt, then the generated tokens
  std::vector<int32_t> blocks;  // KV blocks, in order
  int32_t computed = 0;         // tokens already in the cache
  std::vector<int32_t> generated;
  std::vector<std::vector<float>> logits;  // of each generated token's step
  int32_t adapter = 0;                     // LoRA adapter id (0: none)
};

// One step over `seqs`, each taking its next `chunk[i]` tokens (all the rest when 0); appends
// each sequence's greedy next token and its logits.
inline void greedy_step(Model& model, Backend& backend, KvCache& cache,
                        const std::vector<GreedySeq*>& seqs, std::vector<int32_t> chunk) {
  const int32_t bs = cache.block_size();
  StepInput in;
  int32_t max_blocks = 0;
  for (GreedySeq* s : seqs) max_blocks = std::max<int32_t>(max_blocks, s->blocks.size());
  in.max_blocks_per_seq = max_blocks;
  in.token_offsets.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    GreedySeq* s = seqs[i];
    if (chunk[i] == 0) chunk[i] = static_cast<int32_t>(s->tokens.size()) - s->computed;
    for (int32_t j = 0; j < chunk[i]; ++j) {
      const int32_t pos = s->computed + j;
      in.token_ids.push_back(s->tokens[pos]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(s->blocks[pos / bs] * bs + pos % bs);
    }
    in.token_offsets.push_back(in.n_tokens());
    in.context_lens.push_back(s->computed + chunk[i]);
    for (int32_t b = 0; b < max_blocks; ++b)
      in.block_tables.push_back(b < static_cast<int32_t>(s->blocks.size()) ? s->blocks[b] : 0);
    in.logit_rows.push_back(in.n_tokens() - 1);
  }
  for (GreedySeq* s : seqs)
    if (s->adapter != 0) {
      for (GreedySeq* t : seqs) in.adapter_ids.push_back(t->adapter);
      break;
    }
  const int64_t d = model.config().n_embd, vocab = model.vocab_local();
  DeviceBuffer hidden = backend.alloc(static_cast<size_t>(in.n_tokens() * d) * sizeof(float));
  DeviceBuffer logits = backend.alloc(seqs.size() * static_cast<size_t>(vocab) * sizeof(float));
  model.run_stage(in, hidden.f32(), cache);
  model.compute_logits(in, hidden.f32(), logits.f32());
  std::vector<float> host(seqs.size() * static_cast<size_t>(vocab));
  backend.copy_to_host(host.data(), logits.data(), host.size() * sizeof(float));
  backend.synchronize();
  const int64_t real_vocab = model.config().vocab_size;  // padding rows are not tokens
  for (size_t i = 0; i < seqs.size(); ++i) {
    GreedySeq* s = seqs[i];
    s->computed += chunk[i];
    std::vector<float> row(host.begin() + i * vocab, host.begin() + i * vocab + real_vocab);
    const auto top = std::max_element(row.begin(), row.end()) - row.begin();
    s->generated.push_back(static_cast<int32_t>(top));
    s->tokens.push_back(static_cast<int32_t>(top));
    s->logits.push_back(std::move(row));
  }
}

// Two sequences: `a` prefills alone, decodes 3 tokens, then `b`'s prompt prefills in the same
// step as `a`'s decode (a mixed batch), then both decode until each has `steps` tokens.
// Block size `bs`; each sequence gets its own scattered blocks.
// `b_adapter`: the LoRA adapter id b runs with (0: none), so that a step's rows with an adapter
// start after rows without.
inline std::pair<GreedySeq, GreedySeq> greedy_pair(Model& model, Backend& backend,
                                                   KvCache& cache, int steps,
                                                   int32_t b_adapter = 0) {
  const int32_t bs = cache.block_size();
  GreedySeq a, b;
  b.adapter = b_adapter;
  a.tokens = {17, 31, 45, 9, 50, 77, 3, 28, 64, 11, 90};  // 11 tokens: off the block size
  b.tokens = {5, 6, 7, 8, 60, 61, 62, 13, 14, 15, 16, 20, 21, 22, 23, 24, 25, 26, 27};  // 19
  const int32_t blocks_each = (static_cast<int32_t>(b.tokens.size()) + steps + bs) / bs + 1;
  for (int32_t i = 0; i < blocks_each; ++i) {
    a.blocks.push_back(2 * i + 1);  // interleaved: a's and b's blocks alternate in the pool
    b.blocks.push_back(2 * (blocks_each - 1 - i));
  }
  greedy_step(model, backend, cache, {&a}, {0});
  for (int i = 0; i < 3; ++i) greedy_step(model, backend, cache, {&a}, {1});
  greedy_step(model, backend, cache, {&a, &b}, {1, 0});
  while (static_cast<int>(std::min(a.generated.size(), b.generated.size())) < steps) {
    std::vector<GreedySeq*> live;
    std::vector<int32_t> ones;
    if (static_cast<int>(a.generated.size()) < steps) live.push_back(&a), ones.push_back(1);
    if (static_cast<int>(b.generated.size()) < steps) live.push_back(&b), ones.push_back(1);
    greedy_step(model, backend, cache, live, ones);
  }
  return {std::move(a), std::move(b)};
}

// Largest |x - y| over a step's logits, relative to that step's largest |x|; and the smallest
// top-2 margin of x relative to the same scale, over all steps.
struct LogitGap {
  double worst_rel = 0.0;
  double min_margin_rel = 1e30;
};
inline LogitGap logit_gap(const std::vector<std::vector<float>>& ref,
                          const std::vector<std::vector<float>>& got) {
  LogitGap g;
  for (size_t s = 0; s < ref.size() && s < got.size(); ++s) {
    double scale = 0.0, diff = 0.0;
    for (float v : ref[s]) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    for (size_t i = 0; i < ref[s].size(); ++i)
      diff = std::max(diff, static_cast<double>(std::fabs(ref[s][i] - got[s][i])));
    std::vector<float> top = ref[s];
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    g.worst_rel = std::max(g.worst_rel, diff / scale);
    g.min_margin_rel = std::min(g.min_margin_rel, (top[0] - top[1]) / scale);
  }
  return g;
}

}  // namespace ltm::greedy
