// Llama-family config.json parsing (model_config.h): the keys read, their defaults, and every
// refusal naming its key; RoPE's frequencies (none, linear, llama3) against HF's formulas in
// double; the KV-head split over tp; the configs/ shapes and their parameter counts.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "parallel/partition.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/model_config.h"

namespace ltm {
namespace {

std::string base(const std::string& extra = "", const std::string& type = "llama") {
  return R"({"model_type": ")" + type + R"(", "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 8,
    "max_position_embeddings": 256)" + extra + "}";
}

absl::StatusOr<ModelConfig> parse(const std::string& text) {
  return parse_model_config(text, "config.json");
}

void expect_refused(const std::string& text, const std::string& key) {
  absl::StatusOr<ModelConfig> c = parse(text);
  ASSERT_FALSE(c.ok()) << text;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("\"" + key + "\""), std::string::npos) << c.status();
}

TEST(LlamaConfig, DefaultsAndKeys) {
  absl::StatusOr<ModelConfig> c = parse(base());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->is_llama());
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->n_embd, 64);
  EXPECT_EQ(c->n_inner, 176);
  EXPECT_EQ(c->n_positions, 256);
  EXPECT_EQ(c->kv_heads(), 8);
  EXPECT_EQ(c->head_dim(), 8);
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 1e-6f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kNone);
  EXPECT_FALSE(c->tied_lm_head);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_EQ(c->eos_token_id, -1);

  c = parse(base(R"(, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
      "rope_theta": 500000, "tie_word_embeddings": true, "attention_bias": true,
      "eos_token_id": [7, 9], "bos_token_id": 3, "hidden_act": "silu")"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_heads(), 2);
  EXPECT_EQ(c->head_dim(), 16);
  EXPECT_EQ(c->q_width(), 128);
  EXPECT_EQ(c->kv_width(), 32);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_TRUE(c->tied_lm_head && c->qkv_bias && c->o_bias);
  EXPECT_EQ(c->eos_token_id, 7);
  EXPECT_EQ(c->bos_token_id, 3);

  // Qwen2: q/k/v biases always, no o bias; a sliding_window that is not used is fine.
  c = parse(base(R"(, "sliding_window": 4096, "use_sliding_window": false)", "qwen2"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  // By architectures alone.
  c = parse(R"({"architectures": ["MistralForCausalLM"], "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
    "max_position_embeddings": 8, "sliding_window": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
}

TEST(LlamaConfig, EveryRefusalNamesItsKey) {
  expect_refused(base(R"(, "num_key_value_heads": 3)"), "num_key_value_heads");
  expect_refused(base(R"(, "num_key_value_heads": 0)"), "num_key_value_heads");
  expect_refused(base(R"(, "head_dim": 7)"), "head_dim");
  expect_refused(base(R"(, "rms_norm_eps": 0)"), "rms_norm_eps");
  expect_refused(base(R"(, "rms_norm_eps": "x")"), "rms_norm_eps");
  expect_refused(base(R"(, "rope_theta": 0.5)"), "rope_theta");
  expect_refused(base(R"(, "hidden_act": "gelu")"), "hidden_act");
  expect_refused(base(R"(, "mlp_bias": true)"), "mlp_bias");
  expect_refused(base(R"(, "attention_bias": 1)"), "attention_bias");
  expect_refused(base(R"(, "tie_word_embeddings": "no")"), "tie_word_embeddings");
  expect_refused(base(R"(, "sliding_window": 4096)", "mistral"), "sliding_window");
  expect_refused(base(R"(, "sliding_window": 4096, "use_sliding_window": true)", "qwen2"),
                 "sliding_window");
  expect_refused(base(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4})"), "rope_scaling");
  expect_refused(base(R"(, "rope_scaling": {"type": "dynamic", "factor": 2})"), "rope_scaling");
  expect_refused(base(R"(, "rope_scaling": {"rope_type": "linear"})"), "rope_scaling");
  expect_refused(base(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8})"),
                 "rope_scaling");
  expect_refused(base(R"(, "rope_scaling": 3)"), "rope_scaling");
  expect_refused(base(R"(, "eos_token_id": 1000)"), "eos_token_id");
  expect_refused(R"({"model_type": "llama", "vocab_size": 10})", "max_position_embeddings");
  expect_refused(R"({"model_type": "llama", "vocab_size": 10, "max_position_embeddings": 8,
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
    "num_attention_heads": 3})", "hidden_size");
}

TEST(LlamaConfig, RopeFrequencies) {
  // Default: 1 / theta^(2i / d).
  ModelConfig c = *parse(base(R"(, "rope_theta": 500000)"));
  std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(f[i], 1.0 / std::pow(500000.0, 2.0 * i / 8));
  // Linear: divided by the factor.
  c = *parse(base(R"(, "rope_scaling": {"type": "linear", "factor": 4.0})"));
  f = rope_inv_freq(c);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(f[i], 1.0 / std::pow(10000.0, 2.0 * i / 8) / 4);
  // llama3 (Llama 3.1's numbers) on head_dim 128: HF's _compute_llama3_parameters in double.
  c = *parse(base(R"(, "head_dim": 128, "rope_theta": 500000, "rope_scaling": {"rope_type":
      "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192})"));
  f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 64u);
  int low = 0, mid = 0, high = 0;
  for (int i = 0; i < 64; ++i) {
    const double inv = 1.0 / std::pow(500000.0, 2.0 * i / 128);
    const double wavelen = 2 * M_PI / inv;
    double want = inv;
    if (wavelen > 8192.0 / 1.0) {
      want = inv / 8;
      ++low;
    } else if (wavelen < 8192.0 / 4.0) {
      ++high;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * inv / 8 + smooth * inv;
      ++mid;
    }
    EXPECT_NEAR(f[i], want, 2e-6 * want) << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
}

TEST(LlamaConfig, KvHeadsOverTensorParallelRanks) {
  // 12 query heads over 4 KV heads: tp 2 splits them, tp 4 gives one each, tp 12 replicates.
  EXPECT_TRUE(parallel::validate_layout(2, 2, 1, 12, 4, 4, 96).ok());
  EXPECT_TRUE(parallel::validate_layout(12, 12, 1, 12, 4, 4, 96).ok());
  absl::Status bad = parallel::validate_layout(6, 6, 1, 12, 4, 4, 66);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("KV heads"), std::string::npos) << bad;
  EXPECT_NE(bad.message().find("1, 2, 4, 12"), std::string::npos) << bad;
  EXPECT_FALSE(parallel::validate_layout(5, 5, 1, 12, 4, 4, 64).ok());  // query heads
  EXPECT_EQ(parallel::kv_head_range(4, 2, 1), (parallel::Range{2, 4}));
  for (int r = 0; r < 12; ++r) {
    // Rank r's query heads [r, r + 1) are in group r / 3, which is its KV head.
    EXPECT_EQ(parallel::kv_head_range(4, 12, r), (parallel::Range{r / 3, r / 3 + 1}));
  }
  // tp 8 over 2 KV heads (Qwen2-0.5B-like with 16 heads): 4 ranks share each.
  EXPECT_EQ(parallel::kv_head_range(2, 8, 5), (parallel::Range{1, 2}));
}

TEST(LlamaConfig, PublishedShapes) {
  const std::string dir = std::string(std::getenv("LTM_SOURCE_DIR") ? std::getenv("LTM_SOURCE_DIR")
                                                                    : ".") + "/configs/";
  struct Want {
    const char* file;
    int64_t params;  // the published exact counts
    int64_t kv_heads;
  };
  for (const Want& w : {Want{"llama-2-7b.json", 6738415616, 32},
                        Want{"llama-3-8b.json", 8030261248, 8},
                        Want{"llama-3-70b.json", 70553706496, 8},
                        Want{"qwen2-0.5b.json", 494032768, 2}}) {
    absl::StatusOr<ModelConfig> c = load_model_config(dir + w.file);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->is_llama());
    EXPECT_EQ(c->parameter_count(), w.params) << w.file;
    EXPECT_EQ(c->kv_heads(), w.kv_heads) << w.file;
    int64_t from_specs = 0;
    for (const TensorSpec& s : llama_tensor_specs(*c)) {
      int64_t n = 1;
      for (int64_t x : s.shape) n *= x;
      from_specs += n;
    }
    EXPECT_EQ(from_specs, w.params) << w.file;
  }
}

}  // namespace
}  // namespace ltm
