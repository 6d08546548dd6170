// The OpenAI completions layer (runtime/serve/openai_api.h): JSON body -> engine request with
// defaults, one 400 naming the field per kind of bad input, error objects, logits reduction and
// the response bodies. Toy byte-level vocabulary, no files, no server.
#include "runtime/serve/openai_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/serve/toy_vocab.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// Ids 0..255: the bytes; 256 "he", 257 "ll", 258 "hell", 259 "<|endoftext|>".
Tokenizer toy_tokenizer() {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(testing_vocab::byte_spelling(b), b);
  vocab.emplace_back("he", 256);
  vocab.emplace_back("ll", 257);
  vocab.emplace_back("hell", 258);
  vocab.emplace_back("<|endoftext|>", 259);
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}};
  absl::StatusOr<Tokenizer> t = Tokenizer::from_tables(vocab, merges, "toy");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

class OpenAiApiTest : public ::testing::Test {
 protected:
  OpenAiApiTest() {
    ctx_.tokenizer = &tokenizer_;
    ctx_.limits = {32, 260, 31 * 4};
    ctx_.model_name = "toy";
  }
  std::optional<ApiError> parse(const std::string& body) {
    out_ = ParsedCompletion{};
    return parse_completion(body, ctx_, &out_);
  }
  // Expects a 400 whose param is `param` and whose message contains `words`.
  void expect_400(const std::string& body, const std::string& param, const std::string& words) {
    std::optional<ApiError> e = parse(body);
    ASSERT_TRUE(e.has_value()) << body << " was accepted";
    EXPECT_EQ(e->http_status, 400) << body;
    EXPECT_EQ(e->type, "invalid_request_error") << body;
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
    EXPECT_THAT(e->message, HasSubstr(words)) << body;
  }

  Tokenizer tokenizer_ = toy_tokenizer();
  CompletionContext ctx_;
  ParsedCompletion out_;
};

TEST_F(OpenAiApiTest, MinimalRequestTakesDefaults) {
  ASSERT_FALSE(parse(R"({"prompt": "hello"})").has_value());
  const GenerationRequest& r = out_.request;
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{258, 'o'}));
  EXPECT_EQ(r.max_new_tokens, 16);
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.return_full_logits);
  EXPECT_FALSE(out_.params.stream);
  EXPECT_EQ(out_.params.logprobs, -1);
  EXPECT_EQ(out_.params.model, "toy");
}

// Another name than the base model's is a LoRA adapter's; whether one is loaded is the
// scheduler's answer (an unknown one is a 400 naming "model", in http_server_test / e2e).
TEST_F(OpenAiApiTest, AnotherModelNameNamesAnAdapter) {
  ASSERT_FALSE(parse(R"({"model": "legal-v2", "prompt": "hi"})"));
  EXPECT_EQ(out_.request.adapter, "legal-v2");
  EXPECT_EQ(out_.params.model, "legal-v2");
  ASSERT_FALSE(parse(R"({"model": "toy", "prompt": "hi"})"));
  EXPECT_EQ(out_.request.adapter, "");
}

TEST_F(OpenAiApiTest, EveryFieldIsMapped) {
  ASSERT_FALSE(parse(R"({"model": "toy", "prompt": [104, 105], "max_tokens": 5,
                        "temperature": 0.5, "top_p": 0.9, "top_k": 7, "n": 1, "seed": 42,
                        "stop": ["\n", "ab"], "stream": true,
                        "stream_options": {"include_usage": true}, "logprobs": 3,
                        "echo": true, "presence_penalty": 0, "frequency_penalty": 0.0,
                        "user": "u1", "repetition_penalty": 1.2, "ignore_eos": true,
                        "logit_bias": {}, "future_field": [1]})")
                   .has_value());
  const GenerationRequest& r = out_.request;
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{104, 105}));
  EXPECT_EQ(r.max_new_tokens, 5);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "ab"}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.logprob_alternatives, 3);  // logprobs: reduced from each token's row
  EXPECT_TRUE(r.score_prompt);            // echo + logprobs: the prompt's too
  EXPECT_FALSE(r.return_full_logits);     // no vocabulary-sized rows travel
  EXPECT_FALSE(r.return_prompt_logits);
  EXPECT_TRUE(out_.params.stream);
  EXPECT_TRUE(out_.params.include_usage);
  EXPECT_TRUE(out_.params.echo);
  EXPECT_EQ(out_.params.logprobs, 3);
  EXPECT_EQ(out_.params.user, "u1");
  EXPECT_EQ(out_.params.prompt_text, "hi");  // decoded from the ids for echo
}

TEST_F(OpenAiApiTest, PromptForms) {
  ASSERT_FALSE(parse(R"({"prompt": ["hello"]})").has_value());
  EXPECT_EQ(out_.request.prompt_ids, (std::vector<int32_t>{258, 'o'}));
  ASSERT_FALSE(parse(R"({"prompt": [[1, 2, 3]]})").has_value());
  EXPECT_EQ(out_.request.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(parse(R"({"prompt": "hi", "top_k": -1, "seed": -1})").has_value());
  EXPECT_EQ(out_.request.sampling.top_k, 0);  // -1: off
  EXPECT_EQ(out_.request.sampling.seed, ~uint64_t{0});
}

TEST_F(OpenAiApiTest, BadBodies) {
  expect_400("{\"prompt\": ", "prompt", "not valid JSON");  // cut off where prompt's value begins
  expect_400("{\"prompt\": \"x\" ", "", "not valid JSON");
  expect_400("[1, 2]", "", "must be a JSON object");
  expect_400(std::string(100, '[') + std::string(100, ']'), "", "nests deeper than 64 levels");
  expect_400("{\"prompt\": \"\xff\"}", "prompt", "not valid JSON");  // invalid UTF-8 in a string
}

// What the body parser (common/json_parse.h) refuses, each a 400 naming the field.
TEST_F(OpenAiApiTest, BodyFaultsNameTheField) {
  expect_400(R"({"prompt": "hi", "temperature": 0.5, "temperature": 2})", "temperature",
             "temperature: duplicate key");
  expect_400(R"({"prompt": "hi", "prompt": [1, 2]})", "prompt", "prompt: duplicate key");
  expect_400(R"({"prompt": "hi", "stream": true, "stream_options": {"include_usage": true,
             "include_usage": false}})",
             "stream_options", "stream_options.include_usage: duplicate key");
  expect_400(R"({"prompt": "hi", "temperature": 1e400})", "temperature",
             "temperature: number 1e400 is out of range");
  expect_400(R"({"prompt": "hi", "top_p": -1e400})", "top_p", "number -1e400 is out of range");
  expect_400(R"({"prompt": [1, 1e400]})", "prompt", "prompt[1]: number 1e400 is out of range");
  expect_400(R"({"prompt": "a\ud800"})", "prompt", "surrogate");
  expect_400(R"({"prompt": "hi", "stop": ["x", "\udc00"]})", "stop", "stop[1]: ");
  expect_400(R"({"prompt": "hi", "user": "\ud83d"})", "user", "surrogate");
  // Finite as a double but not as the engine's float: 400, not inf.
  expect_400(R"({"prompt": "hi", "temperature": 1e39})", "temperature",
             "temperature must be a finite 32-bit float");
  expect_400(R"({"prompt": "hi", "repetition_penalty": 3.5e38})", "repetition_penalty",
             "repetition_penalty must be a finite 32-bit float");
  expect_400(R"({"prompt": "hi", "top_p": -1e300})", "top_p", "must be a finite 32-bit float");
  expect_400(R"({"prompt": "hi", "presence_penalty": 1e39})", "presence_penalty",
             "must be a finite 32-bit float");
  EXPECT_FALSE(parse(R"({"prompt": "hi", "temperature": 3.4e38})").has_value());
  // Wrong types, at every level.
  expect_400(R"({"prompt": "hi", "stream": true, "stream_options": {"include_usage": 1}})",
             "stream_options", "include_usage must be a boolean");
  expect_400(R"({"prompt": "hi", "stream_options": [true]})", "stream_options",
             "stream_options must be an object");
  expect_400(R"({"prompt": "hi", "top_k": 1.0})", "top_k", "top_k must be an integer");
  expect_400(R"({"prompt": "hi", "max_tokens": 1e30})", "max_tokens", "must be an integer");
  expect_400(R"({"prompt": "hi", "logit_bias": []})", "logit_bias", "must be an object");
  expect_400(R"({"prompt": "hi", "suffix": 1})", "suffix", "must be a string");
  expect_400(R"({"prompt": [[1], [2]]})", "prompt", "only one prompt");
  // Depth: 64 levels of an unknown field are read (and ignored); 65 are refused.
  const std::string deep64 = std::string(63, '[') + std::string(63, ']');
  EXPECT_FALSE(parse("{\"prompt\": \"hi\", \"x\": " + deep64 + "}").has_value());
  expect_400("{\"prompt\": \"hi\", \"x\": [" + deep64 + "]}", "x", "nests deeper than 64 levels");
  expect_400("{\"prompt\": \"hi\", \"x\": " + std::string(1000000, '['), "x",
             "nests deeper than 64 levels");
}

// The cause of the 31.8 s body (issue 19): ordered_json finds a key by scanning every key before
// it. The body is now parsed into std::map objects (a lookup costs O(log n) comparisons; counted
// in tests/common/json_parse_test.cpp), and a body of 75,000 distinct keys is read like any other.
static_assert(std::is_same_v<BodyJson::object_t, std::map<std::string, BodyJson, std::less<>>>,
              "request bodies must not be parsed into a linearly searched object");
TEST_F(OpenAiApiTest, ManyKeysAreReadAndIgnored) {
  std::string body = R"({"prompt": "hi", "max_tokens": 3)";
  for (int i = 0; i < 75000; ++i) absl::StrAppend(&body, ",\"k", i, "\":", i);
  body += "}";
  std::optional<ApiError> e = parse(body);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(out_.request.max_new_tokens, 3);
  // A duplicate among them is found, however far apart.
  body.back() = ',';
  body += "\"k0\": 1}";
  expect_400(body, "k0", "k0: duplicate key");
}

TEST_F(OpenAiApiTest, EachBadFieldIsNamed) {
  expect_400(R"({})", "prompt", "prompt is missing");
  expect_400(R"({"prompt": 5})", "prompt", "must be a string or a list of token ids");
  expect_400(R"({"prompt": ""})", "prompt", "prompt is empty");
  expect_400(R"({"prompt": []})", "prompt", "prompt is empty");
  expect_400(R"({"prompt": ["a", "b"]})", "prompt", "only one prompt");
  expect_400(R"({"prompt": [1, "x"]})", "prompt", "prompt[1] must be a token id");
  expect_400(R"({"prompt": [1, 999]})", "prompt", "prompt[1] = 999 is not in the vocabulary");
  expect_400(R"({"prompt": [-3]})", "prompt", "not in the vocabulary");
  expect_400(R"({"prompt": "hi", "model": 3})", "model", "model must be a string");
  expect_400(R"({"prompt": "hi", "max_tokens": "5"})", "max_tokens",
             "max_tokens must be an integer, got a string");
  expect_400(R"({"prompt": "hi", "max_tokens": 0})", "max_tokens", "max_tokens must be in [1");
  expect_400(R"({"prompt": "hi", "max_tokens": 2.5})", "max_tokens", "must be an integer");
  expect_400(R"({"prompt": "hi", "max_tokens": 40})", "max_tokens", "exceeds the context of 32");
  expect_400(R"({"prompt": "hi", "temperature": -1})", "temperature", "temperature must be >= 0");
  expect_400(R"({"prompt": "hi", "temperature": "hot"})", "temperature", "must be a number");
  expect_400(R"({"prompt": "hi", "top_p": 0})", "top_p", "top_p must be in (0, 1]");
  expect_400(R"({"prompt": "hi", "top_p": 1.5})", "top_p", "top_p must be in (0, 1]");
  expect_400(R"({"prompt": "hi", "top_k": -2})", "top_k", "top_k must be in [-1");
  expect_400(R"({"prompt": "hi", "n": 2})", "n", "only n = 1");
  expect_400(R"({"prompt": "hi", "best_of": 3})", "best_of", "only best_of = 1");
  expect_400(R"({"prompt": "hi", "stop": 3})", "stop", "stop must be a string or a list");
  expect_400(R"({"prompt": "hi", "stop": ["a", 1]})", "stop", "stop[1] must be a string");
  expect_400(R"({"prompt": "hi", "stop": [""]})", "stop", "stop[0] is empty");
  expect_400(R"({"prompt": "hi", "seed": 1.5})", "seed", "seed must be an integer");
  expect_400(R"({"prompt": "hi", "stream": "yes"})", "stream", "stream must be a boolean");
  expect_400(R"({"prompt": "hi", "echo": 1})", "echo", "echo must be a boolean");
  expect_400(R"({"prompt": "hi", "logprobs": 21})", "logprobs", "logprobs must be in [0, 20]");
  expect_400(R"({"prompt": "hi", "logprobs": true})", "logprobs", "must be an integer");
  expect_400(R"({"prompt": "hi", "stream_options": {"include_usage": true}})", "stream_options",
             "only allowed with stream: true");
  expect_400(R"({"prompt": "hi", "presence_penalty": 0.5})", "presence_penalty",
             "not supported");
  expect_400(R"({"prompt": "hi", "frequency_penalty": 3})", "frequency_penalty",
             "must be in [-2, 2]");
  expect_400(R"({"prompt": "hi", "repetition_penalty": 0})", "repetition_penalty",
             "repetition_penalty must be > 0");
  expect_400(R"({"prompt": "hi", "logit_bias": {"5": 1}})", "logit_bias", "not supported");
  expect_400(R"({"prompt": "hi", "suffix": "x"})", "suffix", "not supported");
  expect_400(R"({"prompt": "hi", "user": 7})", "user", "user must be a string");
  // The prompt's byte limit (31 tokens x 4 bytes here) is checked before tokenizing.
  expect_400("{\"prompt\": \"" + std::string(200, 'a') + "\"}", "prompt", "can fit the context");
}

TEST_F(OpenAiApiTest, ErrorObjects) {
  ApiError e;
  e.message = "max_tokens must be >= 1";
  e.param = "max_tokens";
  const json j = json::parse(error_json(e));
  EXPECT_EQ(j["error"]["message"], "max_tokens must be >= 1");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_TRUE(j["error"]["code"].is_null());
  ApiError none;
  none.message = "x";
  EXPECT_TRUE(json::parse(error_json(none))["error"]["param"].is_null());

  // Engine statuses: the proto's field names become the API's.
  ApiError kv = api_error(absl::InvalidArgumentError("max_new_tokens: prompt (3) + ..."));
  EXPECT_EQ(kv.http_status, 400);
  EXPECT_EQ(kv.param, "max_tokens");
  EXPECT_THAT(kv.message, HasSubstr("max_tokens: prompt"));
  ApiError ids = api_error(absl::InvalidArgumentError("prompt_token_ids[2] = 9 is not ..."));
  EXPECT_EQ(ids.param, "prompt");
  EXPECT_EQ(api_error(absl::ResourceExhaustedError("queue is full")).http_status, 429);
  EXPECT_EQ(api_error(absl::ResourceExhaustedError("queue is full")).type, "rate_limit_error");
  EXPECT_EQ(api_error(absl::UnavailableError("draining")).http_status, 503);
  ApiError auth = api_error(absl::UnauthenticatedError("no key"));
  EXPECT_EQ(auth.http_status, 401);
  EXPECT_EQ(auth.type, "authentication_error");
  EXPECT_EQ(api_error(absl::InternalError("boom")).http_status, 500);
}

TEST_F(OpenAiApiTest, TokenLogprobCarriesTheReducedRow) {
  RowLogprobs lp;
  lp.token = 2;
  lp.logprob = -1.5f;
  lp.n_top = 2;
  lp.top[0] = {1, -0.5f};
  lp.top[1] = {3, -0.75f};
  const TokenLogprob t = token_logprob(lp);
  EXPECT_EQ(t.token, 2);
  EXPECT_TRUE(t.has_logprob);
  EXPECT_FLOAT_EQ(t.logprob, -1.5f);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[1], (std::pair<int32_t, float>{3, -0.75f}));
}

TEST_F(OpenAiApiTest, ResponseBodies) {
  CompletionParams p;
  p.model = "toy";
  p.logprobs = 1;
  p.echo = true;
  p.prompt_text = "he";
  CompletionBuilder b(tokenizer_, p, "cmpl-1", 1700000000);
  std::vector<TokenLogprob> lps = {{256, false, 0, {}}, {'y', true, -0.5f, {{'y', -0.5f}}}};
  const json full = json::parse(b.full_json("y", lps, FinishReason::kEos, 1, 1));
  EXPECT_EQ(full["id"], "cmpl-1");
  EXPECT_EQ(full["object"], "text_completion");
  EXPECT_EQ(full["created"], 1700000000);
  EXPECT_EQ(full["model"], "toy");
  ASSERT_EQ(full["choices"].size(), 1u);
  const json& c = full["choices"][0];
  EXPECT_EQ(c["text"], "hey");  // echo
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["logprobs"]["tokens"], json::array({"he", "y"}));
  EXPECT_TRUE(c["logprobs"]["token_logprobs"][0].is_null());
  EXPECT_EQ(c["logprobs"]["token_logprobs"][1], -0.5);
  EXPECT_EQ(c["logprobs"]["top_logprobs"][1]["y"], -0.5);
  EXPECT_EQ(c["logprobs"]["text_offset"], json::array({0, 2}));
  EXPECT_EQ(full["usage"]["prompt_tokens"], 1);
  EXPECT_EQ(full["usage"]["completion_tokens"], 1);
  EXPECT_EQ(full["usage"]["total_tokens"], 2);

  CompletionParams plain;
  plain.model = "toy";
  CompletionBuilder s(tokenizer_, plain, "cmpl-2", 1);
  const json chunk = json::parse(s.chunk_json("ab", {}, FinishReason::kNone));
  EXPECT_EQ(chunk["choices"][0]["text"], "ab");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(chunk.contains("usage"));
  EXPECT_EQ(json::parse(s.chunk_json("", {}, FinishReason::kLength))["choices"][0]["finish_reason"],
            "length");
  const json usage = json::parse(s.usage_chunk_json(3, 4));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  // A token that is part of a UTF-8 character is written as its bytes.
  EXPECT_EQ(s.token_string(0xE2), "bytes:\\xe2");
  EXPECT_EQ(s.token_string(258), "hell");
}

}  // namespace
}  // namespace ltm
