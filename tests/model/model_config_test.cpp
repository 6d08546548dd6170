// parse_model_config / load_model_config: HF GPT-2 config.json keys, defaults and every error.
#include "runtime/model/model_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ltm {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

// config.json of the real "gpt2" checkpoint on the HF hub (124M).
constexpr char kGpt2Config[] = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

json minimal() {
  return json{{"vocab_size", 100}, {"n_positions", 32}, {"n_embd", 16}, {"n_layer", 2},
              {"n_head", 4}};
}

absl::Status parse_status(const json& j) {
  return parse_model_config(j.dump(), "dir/config.json").status();
}

// Asserts an InvalidArgument naming the file and containing every fragment.
void expect_error(const json& j, std::initializer_list<std::string> fragments) {
  const absl::Status s = parse_status(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << j.dump() << " -> " << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("dir/config.json")) << s;
  for (const std::string& f : fragments) EXPECT_THAT(std::string(s.message()), HasSubstr(f)) << j.dump();
}

TEST(ModelConfigTest, ParsesRealGpt2Config) {
  auto c = parse_model_config(kGpt2Config, "gpt2/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 50257);
  EXPECT_EQ(c->n_positions, 1024);
  EXPECT_EQ(c->n_embd, 768);
  EXPECT_EQ(c->n_layer, 12);
  EXPECT_EQ(c->n_head, 12);
  EXPECT_EQ(c->n_inner, 3072);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 1e-5f);
  EXPECT_EQ(c->position_embedding, PositionEmbedding::kLearned);
  EXPECT_EQ(c->eos_token_id, 50256);
  EXPECT_EQ(c->bos_token_id, 50256);
  // HF: GPT2LMHeadModel.from_pretrained("gpt2").num_parameters() == 124439808.
  EXPECT_EQ(c->parameter_count(), 124439808);
}

TEST(ModelConfigTest, ParameterCountMatchesDesignFormula) {
  json j = minimal();
  auto c = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(c.ok());
  const int64_t d = 16, L = 2;
  EXPECT_EQ(c->parameter_count(), L * (12 * d * d + 13 * d) + 100 * d + 32 * d + 2 * d);

  j["n_inner"] = 24;
  j["position_embedding_type"] = "sinusoidal";
  c = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(c.ok());
  const int64_t ff = 24;
  EXPECT_EQ(c->parameter_count(),
            L * (4 * d * d + 2 * d * ff + 9 * d + ff) + 100 * d + 2 * d);  // no wpe
}

TEST(ModelConfigTest, Defaults) {
  auto c = parse_model_config(minimal().dump(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_inner, 64);
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 1e-5f);
  EXPECT_EQ(c->position_embedding, PositionEmbedding::kLearned);
  // 50256 is outside this 100-token vocabulary: no eos/bos.
  EXPECT_EQ(c->eos_token_id, -1);
  EXPECT_EQ(c->bos_token_id, -1);
}

TEST(ModelConfigTest, OptionalKeys) {
  json j = minimal();
  j.erase("n_positions");
  j["n_ctx"] = 48;
  j["n_inner"] = nullptr;
  j["layer_norm_epsilon"] = 1e-6;
  j["eos_token_id"] = 99;
  j["bos_token_id"] = nullptr;
  j["position_embedding_type"] = "absolute";
  j["tie_word_embeddings"] = true;
  j["scale_attn_weights"] = true;
  j["reorder_and_upcast_attn"] = true;  // numerics only: accepted
  auto c = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_positions, 48);
  EXPECT_EQ(c->n_inner, 64);
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 1e-6f);
  EXPECT_EQ(c->eos_token_id, 99);
  EXPECT_EQ(c->bos_token_id, -1);

  j["n_inner"] = 40;
  j["n_positions"] = 20;  // wins over n_ctx
  j["position_embedding_type"] = "sinusoidal";
  c = parse_model_config(j.dump(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_inner, 40);
  EXPECT_EQ(c->n_positions, 20);
  EXPECT_EQ(c->position_embedding, PositionEmbedding::kSinusoidal);
}

TEST(ModelConfigTest, AcceptsEveryTanhGeluName) {
  for (const char* act : {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}) {
    json j = minimal();
    j["activation_function"] = act;
    EXPECT_TRUE(parse_status(j).ok()) << act;
  }
}

TEST(ModelConfigTest, RejectsOtherActivations) {
  for (const char* act : {"gelu", "relu", "silu", "quick_gelu"}) {
    json j = minimal();
    j["activation_function"] = act;
    expect_error(j, {"activation_function", std::string("\"") + act + "\"", "only the tanh GELU"});
  }
  json j = minimal();
  j["activation_function"] = 3;
  expect_error(j, {"activation_function", "must be a string"});
}

TEST(ModelConfigTest, MissingKeys) {
  for (const char* key : {"vocab_size", "n_embd", "n_layer", "n_head"}) {
    json j = minimal();
    j.erase(key);
    expect_error(j, {std::string("\"") + key + "\"", "is missing"});
  }
  json j = minimal();
  j.erase("n_positions");
  expect_error(j, {"\"n_positions\"", "n_ctx"});
}

TEST(ModelConfigTest, NonPositiveAndMistypedSizes) {
  for (const char* key : {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner"}) {
    for (int v : {0, -3}) {
      json j = minimal();
      j[key] = v;
      expect_error(j, {std::string("\"") + key + "\"", "must be positive", std::to_string(v)});
    }
    json j = minimal();
    j[key] = "12";
    expect_error(j, {key, "must be an integer", "string"});
    j[key] = 12.5;
    expect_error(j, {key, "must be an integer"});
  }
  json j = minimal();
  j["n_ctx"] = 0;
  j.erase("n_positions");
  expect_error(j, {"\"n_ctx\"", "must be positive"});
}

TEST(ModelConfigTest, SizesBeyondLimits) {
  json j = minimal();
  j["n_embd"] = int64_t{1} << 40;
  j["n_head"] = 1;
  expect_error(j, {"\"n_embd\"", "limit"});
  j = minimal();
  j["vocab_size"] = 18446744073709551615ull;
  expect_error(j, {"\"vocab_size\"", "too large"});
}

TEST(ModelConfigTest, EmbdNotDivisibleByHeads) {
  json j = minimal();
  j["n_head"] = 3;
  expect_error(j, {"n_embd", "16", "not divisible by n_head = 3"});
}

TEST(ModelConfigTest, BadEpsilon) {
  for (const json& eps : {json(0.0), json(-1e-5), json("1e-5"), json(2.0)}) {
    json j = minimal();
    j["layer_norm_epsilon"] = eps;
    expect_error(j, {"layer_norm_epsilon"});
  }
}

TEST(ModelConfigTest, BadPositionEmbeddingType) {
  json j = minimal();
  j["position_embedding_type"] = "rotary";
  expect_error(j, {"position_embedding_type", "\"rotary\"", "sinusoidal"});
}

TEST(ModelConfigTest, TokenIdsOutsideVocabulary) {
  json j = minimal();
  j["eos_token_id"] = 100;
  expect_error(j, {"\"eos_token_id\"", "100", "outside the vocabulary [0, 100)"});
  j = minimal();
  j["bos_token_id"] = -1;
  expect_error(j, {"\"bos_token_id\""});
  j = minimal();
  j["eos_token_id"] = json::array({1, 2});
  expect_error(j, {"\"eos_token_id\"", "must be an integer"});
}

TEST(ModelConfigTest, UnsupportedArchitectureFlags) {
  const std::pair<const char*, bool> flags[] = {{"tie_word_embeddings", false},
                                                {"scale_attn_weights", false},
                                                {"scale_attn_by_inverse_layer_idx", true},
                                                {"add_cross_attention", true}};
  for (const auto& [key, value] : flags) {
    json j = minimal();
    j[key] = value;
    expect_error(j, {std::string("\"") + key + "\"", "ltm supports only"});
    j[key] = "yes";
    expect_error(j, {std::string("\"") + key + "\"", "true or false"});
  }
}

TEST(ModelConfigTest, InvalidJson) {
  const absl::Status s = parse_model_config("{\"vocab_size\": 10,", "dir/config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dir/config.json"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("invalid JSON"));
  EXPECT_THAT(std::string(parse_model_config("", "c").status().message()), HasSubstr("invalid JSON"));
  EXPECT_THAT(std::string(parse_model_config("[1]", "c").status().message()), HasSubstr("JSON object"));
}

// common/json_parse.h's limits, on config.json: a duplicate key is ambiguous (which n_layer?),
// and the depth is bounded.
TEST(ModelConfigTest, DuplicateKeysAndDeepNestingAreRefused) {
  std::string text = minimal().dump();
  text.back() = ',';
  text += "\"n_layer\": 7}";
  absl::Status s = parse_model_config(text, "dir/config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dir/config.json: invalid JSON: n_layer: duplicate key"));
  text = minimal().dump();
  text.back() = ',';
  text += "\"extra\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  s = parse_model_config(text, "c").status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("extra[0]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nests deeper than 64 levels"));
  text = minimal().dump();
  text.back() = ',';
  text += "\"layer_norm_epsilon\": 1e999}";
  EXPECT_THAT(std::string(parse_model_config(text, "c").status().message()),
              HasSubstr("layer_norm_epsilon: number 1e999 is out of range"));
}

TEST(ModelConfigTest, LoadFromFile) {
  std::string tmpl = ::testing::TempDir() + "/ltm_config_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string path = tmpl + "/config.json";
  std::ofstream(path) << kGpt2Config;
  auto c = load_model_config(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 12);

  const absl::Status missing = load_model_config(tmpl + "/other.json").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("other.json"));

  std::ofstream(path) << "{";
  EXPECT_THAT(std::string(load_model_config(path).status().message()), HasSubstr(path));
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace ltm
