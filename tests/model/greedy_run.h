// Test helpers shared by the whole-model comparisons across backends and activation types
// (activation16_test.cpp on the CPU, model_cuda_gpu_test.cpp on a GPU): a random checkpoint with
// non-zero biases and a large top-2 margin, and a greedy run of two sequences whose steps mix a
// prefill with decodes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/step_input.h"
#include "runtime/model/weight_source.h"

namespace ltm::greedy {

// make_random_source's weights (std `std`), but with biases of +-`bias` (a fixed pattern per
// tensor, so the bias epilogues have something to add) and the token embedding scaled by
// `wte_scale` (the tied LM head then gives each step's top token a margin far above 16-bit
// rounding, so greedy tokens must agree across activation types). The embedding is GPT-2's
// `wte.weight` or the Llama family's `model.embed_tokens.weight`; the Llama family's Q and K
// projections (`q_proj`, `k_proj`) are scaled by `qk_scale`.
class MarginSource final : public WeightSource {
 public:
  MarginSource(const ModelConfig& config, uint64_t seed, float std, float bias, float wte_scale,
               float qk_scale)
      : inner_(make_random_source(config, seed, std)),
        bias_(bias),
        wte_scale_(wte_scale),
        qk_scale_(qk_scale) {}
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
    } else if (name == "wte.weight" || name == "model.embed_tokens.weight") {
      for (int64_t i = 0; i < n; ++i) out[i] *= wte_scale_;
    } else if (name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight")) {
      for (int64_t i = 0; i < n; ++i) out[i] *= qk_scale_;
    }
  }
  uint64_t bytes_read() const override { return inner_->bytes_read(); }
  std::string describe() const override { return "margin source"; }

 private:
  std::unique_ptr<WeightSource> inner_;
  float bias_, wte_scale_, qk_scale_;
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
// Its weights: std 0.02, biases +-0.02, the token embedding scaled by 5; a Llama-family model's
// separate Q and K projections also by 4, so that its attention is peaked and RoPE and the KV
// heads' mapping matter: with std 0.02 alone the scores were nearly uniform, which any rotation
// leaves as they are (the 16-bit emulation's logits moved by 0.012-0.019 of the row's maximum
// with no RoPE at all, under model_cuda_gpu_test's tolerance of 0.03; with the scale, 0.24-0.31,
// while 16-bit rounding moves them by 0.0005 (fp16) to 0.012 (int8); activation16_test).
inline std::unique_ptr<WeightSource> margin_source(const ModelConfig& c) {
  return std::make_unique<MarginSource>(c, 20, 0.02f, 0.02f, 5.0f, 4.0f);
}

// The Llama-family checkpoint of the same comparisons: 4 layers, hidden 256, vocab 512, SwiGLU
// of 512, `n_head` query heads of `head_dim` over `n_kv_head` KV heads (grouped-query attention;
// the query width n_head x head_dim need not be the hidden size), RoPE, RMSNorm, a tied head (so
// that the embedding's scale gives the margin, as GPT-2's). `type` "qwen2" adds q/k/v biases.
inline ModelConfig margin_llama_config(const std::string& type, int n_head, int n_kv_head,
                                       int head_dim) {
  const std::string json = R"({"model_type": ")" + type + R"(", "vocab_size": 512,
      "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
      "num_attention_heads": )" + std::to_string(n_head) + R"(, "num_key_value_heads": )" +
                           std::to_string(n_kv_head) + R"(, "head_dim": )" +
                           std::to_string(head_dim) + R"(, "max_position_embeddings": 128,
      "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": true})";
  absl::StatusOr<ModelConfig> c = parse_model_config(json, "margin_llama_config");
  LTM_ASSERT(c.ok(), c.status().ToString());
  return *c;
}
// The shapes the comparisons run: 8 query heads of 64 over 2 KV heads (Llama); 4 of 128 over 1
// with q/k/v biases (Qwen2).
struct LlamaShape {
  const char* type;
  int n_head, n_kv_head, head_dim;
};
inline constexpr LlamaShape kLlamaShapes[] = {{"llama", 8, 2, 64}, {"qwen2", 4, 1, 128}};
inline ModelConfig margin_llama_config(const LlamaShape& s) {
  return margin_llama_config(s.type, s.n_head, s.n_kv_head, s.head_dim);
}

// A model on `backend` with weights of `p` from margin_source(c), and its KV cache (of p's type;
// fp16 for int8 weights: a cache is never int8), 64 blocks of 16.
struct ModelRun {
  std::unique_ptr<Backend> backend;
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  ModelRun(std::unique_ptr<Backend> b, const ModelConfig& c, Precision p) : backend(std::move(b)) {
    std::unique_ptr<WeightSource> source = margin_source(c);
    ModelOptions options;
    options.weights = p;
    auto m = Model::load(*source, *backend, ShardSpec{}, tp, options);
    LTM_ASSERT(m.ok(), "loading the margin checkpoint: ", m.status().ToString());
    model = std::move(*m);
    cache = std::make_unique<KvCache>(*backend, c.n_layer, c.kv_heads(), c.head_dim(), 16, 64,
                                      p == Precision::kInt8 ? Precision::kF16 : p);
  }
  ModelRun(const ModelRun&) = delete;  // the model holds a reference to tp
  ModelRun& operator=(const ModelRun&) = delete;
};

struct GreedySeq {
  std::vector<int32_t> tokens;  // prompt, then the generated tokens
  std::vector<int32_t> blocks;  // KV blocks, in order
  int32_t computed = 0;         // tokens already in the cache
  std::vector<int32_t> generated;
  std::vector<std::vector<float>> logits;  // of each generated token's step
  int32_t adapter = 0;                     // LoRA adapter id (0: none)
};

// One step over `seqs`, each feeding its next `n[i]` tokens (all the rest when 0), run on the
// model; the logits of the step's last row of each sequence, or with `every_row` of every row
// fed (speculative decoding's verify rows), in order, vocab_local() floats each. Advances each
// sequence's `computed`.
inline std::vector<std::vector<float>> run_step(Model& model, Backend& backend, KvCache& cache,
                                                const std::vector<GreedySeq*>& seqs,
                                                std::vector<int32_t> n, bool every_row = false) {
  const int32_t bs = cache.block_size();
  StepInput in;
  int32_t max_blocks = 0;
  for (GreedySeq* s : seqs) max_blocks = std::max<int32_t>(max_blocks, s->blocks.size());
  in.max_blocks_per_seq = max_blocks;
  in.token_offsets.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    GreedySeq* s = seqs[i];
    if (n[i] == 0) n[i] = static_cast<int32_t>(s->tokens.size()) - s->computed;
    for (int32_t j = 0; j < n[i]; ++j) {
      const int32_t pos = s->computed + j;
      in.token_ids.push_back(s->tokens[pos]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(s->blocks[pos / bs] * bs + pos % bs);
      if (every_row) in.logit_rows.push_back(in.n_tokens() - 1);
    }
    in.token_offsets.push_back(in.n_tokens());
    in.context_lens.push_back(s->computed + n[i]);
    for (int32_t b = 0; b < max_blocks; ++b)
      in.block_tables.push_back(b < static_cast<int32_t>(s->blocks.size()) ? s->blocks[b] : 0);
    if (!every_row) in.logit_rows.push_back(in.n_tokens() - 1);
  }
  for (GreedySeq* s : seqs)
    if (s->adapter != 0) {
      for (GreedySeq* t : seqs) in.adapter_ids.push_back(t->adapter);
      break;
    }
  const int64_t d = model.config().n_embd, vocab = model.vocab_local();
  const int64_t rows = static_cast<int64_t>(in.logit_rows.size());
  DeviceBuffer hidden = backend.alloc(static_cast<size_t>(in.n_tokens() * d) * sizeof(float));
  DeviceBuffer logits = backend.alloc(static_cast<size_t>(rows * vocab) * sizeof(float));
  model.run_stage(in, hidden.f32(), cache);
  model.compute_logits(in, hidden.f32(), logits.f32());
  std::vector<float> host(static_cast<size_t>(rows * vocab));
  backend.copy_to_host(host.data(), logits.data(), host.size() * sizeof(float));
  backend.synchronize();
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->computed += n[i];
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < rows; ++r)
    out.emplace_back(host.begin() + r * vocab, host.begin() + (r + 1) * vocab);
  return out;
}

// One step over `seqs`, each taking its next `chunk[i]` tokens (all the rest when 0); appends
// each sequence's greedy next token and its logits.
inline void greedy_step(Model& model, Backend& backend, KvCache& cache,
                        const std::vector<GreedySeq*>& seqs, std::vector<int32_t> chunk) {
  std::vector<std::vector<float>> rows = run_step(model, backend, cache, seqs, std::move(chunk));
  const int64_t real_vocab = model.config().vocab_size;  // padding rows are not tokens
  for (size_t i = 0; i < seqs.size(); ++i) {
    GreedySeq* s = seqs[i];
    std::vector<float> row(rows[i].begin(), rows[i].begin() + real_vocab);
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

// A LoRA adapter of rank `r` (alpha 2r) on every module of a GPT-2 margin checkpoint, written as
// a PEFT folder under the test's temporary folder; "" if it could not be written.
inline std::string write_adapter(const ModelConfig& c, int64_t r = 4) {
  // (std::filesystem, not ::testing::TempDir: the GPU-only build's GoogleTest lacks it)
  std::string dir = std::filesystem::temp_directory_path().string() + "/ltm_margin_lora_XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) return "";
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": )" << r << R"(, "lora_alpha": )" << 2 * r
      << R"(, "fan_in_fan_out": true,)"
      << R"( "bias": "none", "target_modules": ["c_attn", "c_proj", "c_fc"]})";
  const int64_t d = c.n_embd, ff = c.n_inner;
  struct Module {
    std::string name;
    int64_t in, out;
  };
  std::vector<std::string> data;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (const Module& m : {Module{"attn.c_attn", d, 3 * d}, Module{"attn.c_proj", d, d},
                            Module{"mlp.c_fc", d, ff}, Module{"mlp.c_proj", ff, d}}) {
      for (char ab : {'A', 'B'}) {
        const std::vector<int64_t> shape = ab == 'A' ? std::vector<int64_t>{r, m.in}
                                                     : std::vector<int64_t>{m.out, r};
        std::vector<float> v(static_cast<size_t>(shape[0] * shape[1]));
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = 0.05f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(l + ab));
        data.emplace_back(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
        shapes.push_back({"base_model.model.transformer.h." + std::to_string(l) + "." + m.name +
                              ".lora_" + std::string(1, ab) + ".weight",
                          shape});
      }
    }
  }
  std::vector<SafetensorsWriteTensor> w;
  for (size_t i = 0; i < data.size(); ++i)
    w.push_back({shapes[i].first, "F32", shapes[i].second, data[i]});
  if (!write_safetensors(dir + "/adapter_model.safetensors", w).ok()) return "";
  return dir;
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

// greedy_pair on `got` (first: a workspace too small stops it with a message before the plain
// run could overflow it), then on `ref`: expects the same greedy tokens, each step's logits within
// `tol` of the reference step's largest |logit| (and, when `rounded`, not all equal: the 16-bit
// types really were used) and the reference's top-2 margins above twice `tol` (else the
// checkpoint could not tell a wrong token from rounding). Prints a line a sequence, after `label`.
inline void expect_greedy_agree(ModelRun& ref, ModelRun& got, int steps, double tol, bool rounded,
                                const std::string& label) {
  auto [ga, gb] = greedy_pair(*got.model, *got.backend, *got.cache, steps);
  auto [ra, rb] = greedy_pair(*ref.model, *ref.backend, *ref.cache, steps);
  EXPECT_EQ(ra.generated, ga.generated) << label;
  EXPECT_EQ(rb.generated, gb.generated) << label;
  for (const auto& [r, g] : {std::pair{&ra, &ga}, std::pair{&rb, &gb}}) {
    const LogitGap gap = logit_gap(r->logits, g->logits);
    std::printf("result: %s: %d greedy tokens %s; max |logit diff| %.4f of row max (tolerance "
                "%.2f); smallest top-2 margin %.3f of row max\n",
                label.c_str(), steps, r->generated == g->generated ? "identical" : "DIFFERENT",
                gap.worst_rel, tol, gap.min_margin_rel);
    EXPECT_LT(gap.worst_rel, tol) << label;
    if (rounded) {
      EXPECT_GT(gap.worst_rel, 0.0) << label;
    }
    EXPECT_GT(gap.min_margin_rel, 2 * tol) << label << ": the checkpoint's margins are too small";
  }
}

}  // namespace ltm::greedy
