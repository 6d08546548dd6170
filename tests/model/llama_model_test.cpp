// The Llama-family forward pass on one rank against a plain reference written here in double
// from HF's modeling equations (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, an
// untied head), on small random models: 12 query heads over 4 KV heads with rope_theta 500000,
// a Qwen2-style one with q/k/v biases, one with llama3 RoPE scaling and a tied head. Also: decode
// through the paged cache equals recomputing the whole prefix, and 16-bit weights and caches stay
// close; a PEFT LoRA adapter on q/k/v/o/gate/up/down, merged and unmerged, equals the reference
// on the weights with the update folded in. (The PyTorch oracle and the multi-rank layouts are
// tests/python.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/model/safetensors.h"

#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/cpu_backend.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"

namespace ltm {
namespace {

ModelConfig llama_config(const std::string& extra, const std::string& type = "llama") {
  absl::StatusOr<ModelConfig> c = parse_model_config(
      R"({"model_type": ")" + type + R"(", "vocab_size": 97, "hidden_size": 48,
      "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 12,
      "num_key_value_heads": 4, "head_dim": 8, "max_position_embeddings": 64,
      "rms_norm_eps": 1e-5)" + extra + "}",
      "test");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Random weights with norm gains and biases that are not trivial (the random source gives gains
// of 1 and biases of 0), so that a missing weight or bias shows.
class Perturbed final : public WeightSource {
 public:
  explicit Perturbed(const ModelConfig& c) : inner_(make_random_source(c, 5, 0.15f)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  const float* f32_in_place(std::string_view) const override { return nullptr; }
  void read_f32(std::string_view name, const SliceSpec& s, float* out) const override {
    inner_->read_f32(name, s, out);
    const int64_t n = (s.row_end - s.row_begin) * (s.col_end - s.col_begin);
    const bool norm = name.find("norm") != std::string_view::npos;
    if (norm || name.ends_with(".bias"))
      for (int64_t i = 0; i < n; ++i)
        out[i] += (norm ? 0.3f : 0.2f) * std::sin(0.9f * (s.row_begin + i) + name.size());
  }
  uint64_t bytes_read() const override { return 0; }
  std::string describe() const override { return "perturbed"; }

 private:
  std::unique_ptr<WeightSource> inner_;
};

// The whole tensor, [rows, cols] (cols 1 for vectors).
std::vector<double> tensor(const WeightSource& w, const std::string& name, int64_t rows,
                           int64_t cols) {
  std::vector<float> f(rows * cols);
  w.read_f32(name, {0, rows, 0, cols}, f.data());
  return std::vector<double>(f.begin(), f.end());
}

// HF's LlamaForCausalLM forward on `ids` (positions 0..n-1), in double: the logits of every row.
std::vector<std::vector<double>> reference(const WeightSource& w, const std::vector<int32_t>& ids) {
  const ModelConfig& c = w.config();
  const int64_t d = c.n_embd, hd = c.head_dim(), nq = c.n_head, nkv = c.kv_heads(),
                ff = c.n_inner, n = ids.size(), V = c.vocab_size;
  const double eps = c.layer_norm_epsilon;
  auto rms = [&](const std::vector<double>& x, const std::vector<double>& g) {
    double sq = 0;
    for (double v : x) sq += v * v;
    const double r = 1.0 / std::sqrt(sq / x.size() + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * g[i];
    return y;
  };
  // y = W x (+ b) for an nn.Linear weight [out, in].
  auto linear = [](const std::vector<double>& W, const std::vector<double>* b,
                   const std::vector<double>& x, int64_t out) {
    const int64_t in = x.size();
    std::vector<double> y(out);
    for (int64_t o = 0; o < out; ++o) {
      double acc = b ? (*b)[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += W[o * in + i] * x[i];
      y[o] = acc;
    }
    return y;
  };
  const std::vector<float> inv = rope_inv_freq(c);
  auto rope = [&](double* x, int64_t pos) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double angle = static_cast<float>(pos) * inv[i];
      const double co = std::cos(angle), si = std::sin(angle);
      const double a = x[i], b = x[i + hd / 2];
      x[i] = a * co - b * si;
      x[i + hd / 2] = b * co + a * si;
    }
  };
  const std::vector<double> E = tensor(w, "model.embed_tokens.weight", V, d);
  std::vector<std::vector<double>> h(n, std::vector<double>(d));
  for (int64_t t = 0; t < n; ++t) std::copy_n(E.begin() + ids[t] * d, d, h[t].begin());
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const auto g1 = tensor(w, p + "input_layernorm.weight", d, 1);
    const auto g2 = tensor(w, p + "post_attention_layernorm.weight", d, 1);
    const auto Wq = tensor(w, p + "self_attn.q_proj.weight", nq * hd, d);
    const auto Wk = tensor(w, p + "self_attn.k_proj.weight", nkv * hd, d);
    const auto Wv = tensor(w, p + "self_attn.v_proj.weight", nkv * hd, d);
    const auto Wo = tensor(w, p + "self_attn.o_proj.weight", d, nq * hd);
    std::vector<double> bq, bk, bv, bo;
    if (c.qkv_bias) {
      bq = tensor(w, p + "self_attn.q_proj.bias", nq * hd, 1);
      bk = tensor(w, p + "self_attn.k_proj.bias", nkv * hd, 1);
      bv = tensor(w, p + "self_attn.v_proj.bias", nkv * hd, 1);
    }
    if (c.o_bias) bo = tensor(w, p + "self_attn.o_proj.bias", d, 1);
    const auto Wg = tensor(w, p + "mlp.gate_proj.weight", ff, d);
    const auto Wu = tensor(w, p + "mlp.up_proj.weight", ff, d);
    const auto Wd = tensor(w, p + "mlp.down_proj.weight", d, ff);
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const auto x = rms(h[t], g1);
      q[t] = linear(Wq, c.qkv_bias ? &bq : nullptr, x, nq * hd);
      k[t] = linear(Wk, c.qkv_bias ? &bk : nullptr, x, nkv * hd);
      v[t] = linear(Wv, c.qkv_bias ? &bv : nullptr, x, nkv * hd);
      for (int64_t hh = 0; hh < nq; ++hh) rope(q[t].data() + hh * hd, t);
      for (int64_t hh = 0; hh < nkv; ++hh) rope(k[t].data() + hh * hd, t);
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> attn(nq * hd, 0.0);
      for (int64_t hh = 0; hh < nq; ++hh) {
        const int64_t kvh = hh / (nq / nkv);  // repeat_kv
        std::vector<double> s(t + 1);
        for (int64_t p2 = 0; p2 <= t; ++p2) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[t][hh * hd + i] * k[p2][kvh * hd + i];
          s[p2] = dot / std::sqrt(static_cast<double>(hd));
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t p2 = 0; p2 <= t; ++p2)
          for (int64_t i = 0; i < hd; ++i) attn[hh * hd + i] += s[p2] / sum * v[p2][kvh * hd + i];
      }
      const auto o = linear(Wo, c.o_bias ? &bo : nullptr, attn, d);
      for (int64_t i = 0; i < d; ++i) h[t][i] += o[i];
      const auto x = rms(h[t], g2);
      const auto g = linear(Wg, nullptr, x, ff), u = linear(Wu, nullptr, x, ff);
      std::vector<double> a(ff);
      for (int64_t i = 0; i < ff; ++i) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const auto down = linear(Wd, nullptr, a, d);
      for (int64_t i = 0; i < d; ++i) h[t][i] += down[i];
    }
  }
  const auto gf = tensor(w, "model.norm.weight", d, 1);
  const auto head = c.tied_lm_head ? E : tensor(w, "lm_head.weight", V, d);
  std::vector<std::vector<double>> logits(n);
  for (int64_t t = 0; t < n; ++t) logits[t] = linear(head, nullptr, rms(h[t], gf), V);
  return logits;
}

struct Rig {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  static constexpr int kBlock = 4;
  Rig(const WeightSource& w, Precision weights = Precision::kF32,
      Precision kv = Precision::kF32) {
    ModelOptions o;
    o.weights = weights;
    auto m = Model::load(w, *backend, ShardSpec{}, tp, o);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(*m);
    EXPECT_EQ(model->n_kv_head_local(), w.config().kv_heads());
    cache = std::make_unique<KvCache>(*backend, w.config().n_layer, model->n_kv_head_local(),
                                      w.config().head_dim(), kBlock, 40, kv);
  }
  // Runs tokens [from, to) of `ids` (blocks 0.., one sequence) and returns every row's logits.
  std::vector<std::vector<float>> step(const std::vector<int32_t>& ids, int from, int to,
                                       int block0 = 0) {
    StepInput in;
    in.max_blocks_per_seq = 16;
    in.token_offsets = {0, to - from};
    in.context_lens = {to};
    for (int b = 0; b < 16; ++b) in.block_tables.push_back(block0 + b);
    for (int p = from; p < to; ++p) {
      in.token_ids.push_back(ids[p]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(block0 * kBlock + p);
      in.logit_rows.push_back(p - from);
    }
    const int64_t d = model->config().n_embd, V = model->vocab_local();
    std::vector<float> hidden(in.n_tokens() * d), logits(in.n_tokens() * V);
    model->run_stage(in, hidden.data(), *cache);
    model->compute_logits(in, hidden.data(), logits.data());
    std::vector<std::vector<float>> out;
    for (int r = 0; r < in.n_tokens(); ++r)
      out.emplace_back(logits.begin() + r * V, logits.begin() + r * V + model->config().vocab_size);
    return out;
  }
};

const std::vector<int32_t> kIds = {3, 96, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32,
                                   79, 50, 28, 84, 19, 71, 69, 39, 9};

double compare(const std::vector<std::vector<float>>& got,
               const std::vector<std::vector<double>>& want, size_t row0 = 0) {
  double worst = 0;
  for (size_t r = 0; r < got.size(); ++r)
    for (size_t i = 0; i < got[r].size(); ++i)
      worst = std::max(worst, std::fabs(got[r][i] - want[row0 + r][i]));
  return worst;
}

void check_against_reference(const ModelConfig& c) {
  Perturbed w(c);
  const auto want = reference(w, kIds);
  Rig run(w);
  const int n = static_cast<int>(kIds.size());
  // Prefill of 20 rows (the attention's matrix form), then decode rows one by one (tiled).
  auto got = run.step(kIds, 0, 20);
  EXPECT_LT(compare(got, want), 2e-4) << c.architecture;
  for (int p = 20; p < n; ++p) EXPECT_LT(compare(run.step(kIds, p, p + 1), want, p), 2e-4) << p;
  // Chunked prefill in another sequence's blocks: 7 + 5 + 13 rows.
  auto a = run.step(kIds, 0, 7, 20);
  auto b = run.step(kIds, 7, 12, 20);
  auto d = run.step(kIds, 12, n, 20);
  EXPECT_LT(compare(b, want, 7), 2e-4);
  EXPECT_LT(compare(d, want, 12), 2e-4);
  // A wrong model must fail the comparison: the reference of other weights differs.
  EXPECT_GT(compare(got, reference(Perturbed(llama_config(R"(, "rope_theta": 999)")), kIds)), 1e-3);
}

TEST(LlamaModel, GroupedQueryRopeTheta500kUntiedHead) {
  check_against_reference(llama_config(R"(, "rope_theta": 500000)"));
}

TEST(LlamaModel, Qwen2WithQkvBiasesAndTiedHead) {
  const ModelConfig c = llama_config(R"(, "rope_theta": 1000000, "tie_word_embeddings": true)", "qwen2");
  ASSERT_TRUE(c.qkv_bias && c.tied_lm_head && !c.o_bias);
  check_against_reference(c);
}

TEST(LlamaModel, Llama3RopeScalingAndAttentionBias) {
  check_against_reference(llama_config(
      R"(, "attention_bias": true, "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16})"));
}

TEST(LlamaModel, SixteenBitWeightsAndCache) {
  const ModelConfig c = llama_config(R"(, "rope_theta": 500000)");
  Perturbed w(c);
  const auto want = reference(w, kIds);
  for (Precision p : {Precision::kBF16, Precision::kF16}) {
    Rig run(w, p, p);
    const auto got = run.step(kIds, 0, static_cast<int>(kIds.size()));
    EXPECT_LT(compare(got, want), 0.05) << precision_name(p);
  }
}

// A backend without the Llama ops (CUDA until its kernels exist) refuses the model at load, by
// name, instead of aborting at the first step.
TEST(LlamaModel, BackendWithoutLlamaOpsRefusesTheModel) {
  class NoLlama final : public CpuBackend {
   public:
    NoLlama() : CpuBackend(1) {}
    bool supports_llama() const override { return false; }
  };
  NoLlama backend;
  parallel::SoloCommunicator tp{"tp"};
  const ModelConfig c = llama_config("");
  Perturbed w(c);
  auto m = Model::load(w, backend, ShardSpec{}, tp);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("LlamaForCausalLM"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("RMSNorm/RoPE/SwiGLU"), std::string::npos) << m.status();
}

// A PEFT adapter for llama_config's shapes: rank 2, alpha 6, on every module but k_proj of
// layer 1 (a fused Q | K | V update with a zero block); `merged` is the source with each update
// s B A folded into its nn.Linear weight, which the reference then runs.
class LoraOnLlama : public ::testing::Test {
 protected:
  static constexpr int kRank = 2;
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/ltm_llama_lora_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    const ModelConfig& c = config_;
    const std::map<std::string, std::pair<int64_t, int64_t>> shapes = {
        {"self_attn.q_proj", {c.n_embd, c.q_width()}},  {"self_attn.k_proj", {c.n_embd, c.kv_width()}},
        {"self_attn.v_proj", {c.n_embd, c.kv_width()}}, {"self_attn.o_proj", {c.q_width(), c.n_embd}},
        {"mlp.gate_proj", {c.n_embd, c.n_inner}},       {"mlp.up_proj", {c.n_embd, c.n_inner}},
        {"mlp.down_proj", {c.n_inner, c.n_embd}}};
    std::vector<std::string> data;
    std::vector<SafetensorsWriteTensor> w;
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
    for (int l = 0; l < 2; ++l)
      for (const auto& [module, io] : shapes) {
        if (l == 1 && module == "self_attn.k_proj") continue;
        const std::string base = "base_model.model.model.layers." + std::to_string(l) + "." + module;
        std::vector<float> a(kRank * io.first), b(io.second * kRank);
        for (size_t i = 0; i < a.size(); ++i) a[i] = 0.2f * std::sin(1.3f * i + module.size() + l);
        for (size_t i = 0; i < b.size(); ++i) b[i] = 0.2f * std::cos(0.7f * i + module.size() - l);
        // W [out, in] += s B A  (s = alpha / r = 3)
        Update& u = updates_["model.layers." + std::to_string(l) + "." + module + ".weight"];
        u.in = io.first;
        u.delta.assign(io.second * io.first, 0.0f);
        for (int64_t o = 0; o < io.second; ++o)
          for (int64_t i = 0; i < io.first; ++i)
            for (int k = 0; k < kRank; ++k)
              u.delta[o * io.first + i] += 3.0f * b[o * kRank + k] * a[k * io.first + i];
        data.emplace_back(reinterpret_cast<const char*>(a.data()), a.size() * 4);
        tensors.push_back({base + ".lora_A.weight", {kRank, io.first}});
        data.emplace_back(reinterpret_cast<const char*>(b.data()), b.size() * 4);
        tensors.push_back({base + ".lora_B.weight", {io.second, kRank}});
      }
    for (size_t i = 0; i < tensors.size(); ++i)
      w.push_back({tensors[i].first, "F32", tensors[i].second, data[i]});
    ASSERT_TRUE(write_safetensors(dir_ + "/adapter_model.safetensors", w).ok());
    nlohmann::json cfg = {{"peft_type", "LORA"}, {"r", kRank}, {"lora_alpha", 6},
                          {"target_modules", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                              "up_proj", "down_proj"}}};
    std::ofstream(dir_ + "/adapter_config.json") << cfg.dump();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  struct Update {
    int64_t in = 0;
    std::vector<float> delta;  // [out, in]
  };
  class Merged final : public WeightSource {
   public:
    Merged(const WeightSource& base, const std::map<std::string, Update>& u) : base_(base), u_(u) {}
    const ModelConfig& config() const override { return base_.config(); }
    const float* f32_in_place(std::string_view) const override { return nullptr; }
    void read_f32(std::string_view name, const SliceSpec& s, float* out) const override {
      base_.read_f32(name, s, out);
      auto it = u_.find(std::string(name));
      if (it == u_.end()) return;
      const int64_t cols = s.col_end - s.col_begin;
      for (int64_t r = s.row_begin; r < s.row_end; ++r)
        for (int64_t c = s.col_begin; c < s.col_end; ++c)
          out[(r - s.row_begin) * cols + c - s.col_begin] += it->second.delta[r * it->second.in + c];
    }
    uint64_t bytes_read() const override { return 0; }
    std::string describe() const override { return "merged"; }

   private:
    const WeightSource& base_;
    const std::map<std::string, Update>& u_;
  };

  ModelConfig config_ = llama_config(R"(, "rope_theta": 500000)");
  std::string dir_;
  std::map<std::string, Update> updates_;
};

TEST_F(LoraOnLlama, UnmergedAndMergedEqualTheReferenceOfMergedWeights) {
  Perturbed base(config_);
  const auto want = reference(Merged(base, updates_), kIds);
  const auto plain = reference(base, kIds);
  absl::StatusOr<LoraAdapter> adapter = LoraAdapter::open(dir_, config_, 16);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->modules().size(), 7u);
  EXPECT_TRUE(adapter->has(1, LoraModule::kAttnQkv));
  const int n = static_cast<int>(kIds.size());
  {  // unmerged: the fused modules' updates applied beside the base GEMMs
    Rig run(base);
    ASSERT_TRUE(run.model->add_adapter(1, *adapter).ok());
    auto step = [&](int from, int to) {
      // Rig::step with the adapter named for the one sequence.
      StepInput in;
      in.max_blocks_per_seq = 16;
      in.token_offsets = {0, to - from};
      in.context_lens = {to};
      in.adapter_ids = {1};
      for (int b = 0; b < 16; ++b) in.block_tables.push_back(b);
      for (int p = from; p < to; ++p) {
        in.token_ids.push_back(kIds[p]);
        in.positions.push_back(p);
        in.slot_mapping.push_back(p);
        in.logit_rows.push_back(p - from);
      }
      const int64_t d = config_.n_embd, V = config_.vocab_size;
      std::vector<float> hidden(in.n_tokens() * d), logits(in.n_tokens() * V);
      run.model->run_stage(in, hidden.data(), *run.cache);
      run.model->compute_logits(in, hidden.data(), logits.data());
      std::vector<std::vector<float>> out;
      for (int r = 0; r < in.n_tokens(); ++r)
        out.emplace_back(logits.begin() + r * V, logits.begin() + (r + 1) * V);
      return out;
    };
    const auto got = step(0, 20);
    EXPECT_LT(compare(got, want), 2e-4);
    EXPECT_GT(compare(got, plain), 1e-2);  // the update matters
    for (int p = 20; p < n; ++p) EXPECT_LT(compare(step(p, p + 1), want, p), 2e-4) << p;
  }
  {  // merged at load (--lora-merge)
    auto backend = make_cpu_backend(1);
    parallel::SoloCommunicator tp{"tp"};
    ModelOptions o;
    o.merge = &*adapter;
    auto m = Model::load(base, *backend, ShardSpec{}, tp, o);
    ASSERT_TRUE(m.ok()) << m.status();
    Rig run(base);
    run.model = std::move(*m);
    EXPECT_LT(compare(run.step(kIds, 0, n), want), 2e-4);
  }
}

}  // namespace
}  // namespace ltm
