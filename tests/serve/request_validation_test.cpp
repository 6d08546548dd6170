// make_generation_request: defaults, and one INVALID_ARGUMENT naming the field per kind of bad
// input. Uses a toy byte-level BPE vocab (256 byte tokens + a few merges), no files.
#include "runtime/serve/request_validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/serve/toy_vocab.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// GPT-2's byte -> printable code point map (bytes_to_unicode), as vocab.json spells tokens.
using testing_vocab::byte_spelling;

// Ids 0..255: the bytes; 256 "he", 257 "ll", 258 "hell", 259 "<|endoftext|>".
Tokenizer toy_tokenizer() {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(byte_spelling(b), b);
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

class RequestValidationTest : public ::testing::Test {
 protected:
  static constexpr int64_t kContext = 32;
  static constexpr int64_t kVocab = 260;

  absl::StatusOr<GenerationRequest> make(const v1::GenerateRequest& p) {
    return make_generation_request(p, tokenizer_, {kContext, kVocab});
  }
  // Expects INVALID_ARGUMENT whose message starts with `field`.
  void expect_invalid(const v1::GenerateRequest& p, const std::string& field) {
    absl::StatusOr<GenerationRequest> r = make(p);
    ASSERT_FALSE(r.ok()) << "expected an error naming " << field;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), StartsWith(field)) << r.status();
  }
  static v1::GenerateRequest good() {
    v1::GenerateRequest p;
    p.set_prompt("hello");
    return p;
  }

  Tokenizer tokenizer_ = toy_tokenizer();
};

TEST_F(RequestValidationTest, DefaultsAndTokenization) {
  absl::StatusOr<GenerationRequest> r = make(good());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_ids, (std::vector<int32_t>{258, 'o'}));  // "hell" + "o"
  EXPECT_EQ(r->max_new_tokens, kDefaultMaxNewTokens);
  EXPECT_EQ(r->sampling.temperature, 1.0f);
  EXPECT_EQ(r->sampling.top_k, 0);
  EXPECT_EQ(r->sampling.top_p, 1.0f);
  EXPECT_EQ(r->sampling.repetition_penalty, 1.0f);
  EXPECT_TRUE(r->stop.empty());
  EXPECT_FALSE(r->return_logprobs);
  EXPECT_FALSE(r->ignore_eos);
  EXPECT_EQ(r->deadline, std::chrono::steady_clock::time_point::max());
  ASSERT_NE(r->cancel, nullptr);
  EXPECT_FALSE(r->cancel->cancelled.load());
}

TEST_F(RequestValidationTest, CopiesEveryField) {
  v1::GenerateRequest p;
  p.add_prompt_token_ids(1);
  p.add_prompt_token_ids(259);
  p.set_max_new_tokens(30);
  p.set_temperature(0.0f);
  p.set_top_k(5);
  p.set_top_p(0.5f);
  p.set_repetition_penalty(1.3f);
  p.set_seed(1234567890123ull);
  p.add_stop("\n\n");
  p.add_stop("é");
  p.set_return_logprobs(true);
  p.set_request_id("abc");
  p.set_ignore_eos(true);
  absl::StatusOr<GenerationRequest> r = make(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_ids, (std::vector<int32_t>{1, 259}));
  EXPECT_EQ(r->max_new_tokens, 30);
  EXPECT_EQ(r->sampling.temperature, 0.0f);
  EXPECT_EQ(r->sampling.top_k, 5);
  EXPECT_EQ(r->sampling.top_p, 0.5f);
  EXPECT_EQ(r->sampling.repetition_penalty, 1.3f);
  EXPECT_EQ(r->sampling.seed, 1234567890123ull);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"\n\n", "é"}));
  EXPECT_TRUE(r->return_logprobs);
  EXPECT_EQ(r->request_id, "abc");
  EXPECT_TRUE(r->ignore_eos);
}

TEST_F(RequestValidationTest, PromptPresence) {
  expect_invalid(v1::GenerateRequest(), "prompt is missing");
  v1::GenerateRequest both = good();
  both.add_prompt_token_ids(1);
  expect_invalid(both, "prompt and prompt_token_ids are both set");
  v1::GenerateRequest empty;
  empty.set_prompt("");
  expect_invalid(empty, "prompt is empty");
}

TEST_F(RequestValidationTest, PromptLength) {
  v1::GenerateRequest p;
  p.set_max_new_tokens(1);
  for (int i = 0; i < kContext - 1; ++i) p.add_prompt_token_ids(7);
  EXPECT_TRUE(make(p).ok()) << "context - 1 prompt tokens + 1 new token fit";
  p.add_prompt_token_ids(7);
  expect_invalid(p, "prompt_token_ids is 32 tokens long");
  v1::GenerateRequest text;
  text.set_prompt(std::string(kContext, 'x'));
  expect_invalid(text, "prompt is 32 tokens long");
}

TEST_F(RequestValidationTest, MaxNewTokens) {
  v1::GenerateRequest p = good();  // 2 prompt tokens
  p.set_max_new_tokens(0);
  expect_invalid(p, "max_new_tokens must be >= 1");
  p.set_max_new_tokens(-3);
  expect_invalid(p, "max_new_tokens must be >= 1");
  p.set_max_new_tokens(kContext - 2);
  EXPECT_TRUE(make(p).ok());
  p.set_max_new_tokens(kContext - 1);
  expect_invalid(p, "max_new_tokens = 31");
  // The default (16) counts too.
  v1::GenerateRequest long_prompt;
  for (int i = 0; i < kContext - 10; ++i) long_prompt.add_prompt_token_ids(7);
  expect_invalid(long_prompt, "max_new_tokens = 16");
}

TEST_F(RequestValidationTest, Sampling) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float t : {-0.1f, nan, inf}) {
    v1::GenerateRequest p = good();
    p.set_temperature(t);
    expect_invalid(p, "temperature");
  }
  for (float v : {0.0f, -1.0f, 1.01f, nan}) {
    v1::GenerateRequest p = good();
    p.set_top_p(v);
    expect_invalid(p, "top_p");
  }
  {
    v1::GenerateRequest p = good();
    p.set_top_p(1.0f);
    EXPECT_TRUE(make(p).ok());
    p.set_top_k(-1);
    expect_invalid(p, "top_k");
  }
  for (float r : {0.0f, -1.0f, nan, inf}) {
    v1::GenerateRequest p = good();
    p.set_repetition_penalty(r);
    expect_invalid(p, "repetition_penalty");
  }
}

TEST_F(RequestValidationTest, TokenIds) {
  for (int32_t id : {-1, 260, 1 << 30}) {
    v1::GenerateRequest p;
    p.add_prompt_token_ids(5);
    p.add_prompt_token_ids(id);
    expect_invalid(p, absl::StrCat("prompt_token_ids[1] = ", id));
  }
  // A model vocab smaller than the tokenizer's: ids past the model's are refused.
  v1::GenerateRequest p;
  p.add_prompt_token_ids(259);
  absl::StatusOr<GenerationRequest> r = make_generation_request(p, tokenizer_, {kContext, 259});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), StartsWith("prompt_token_ids[0]"));
}

TEST_F(RequestValidationTest, Utf8) {
  v1::GenerateRequest p;
  p.set_prompt("ab\xC3");  // truncated 2-byte sequence
  expect_invalid(p, "prompt is not valid UTF-8");
  p.set_prompt("\xED\xA0\x80");  // a surrogate
  expect_invalid(p, "prompt is not valid UTF-8");
  v1::GenerateRequest s = good();
  s.add_stop("ok");
  s.add_stop("\xFF");
  expect_invalid(s, "stop[1] is not valid UTF-8");
}

TEST_F(RequestValidationTest, StopStrings) {
  v1::GenerateRequest p = good();
  p.add_stop("a");
  p.add_stop("");
  expect_invalid(p, "stop[1] is empty");
  v1::GenerateRequest many = good();
  for (int i = 0; i < kMaxStopStrings; ++i) many.add_stop(absl::StrCat("s", i));
  EXPECT_TRUE(make(many).ok());
  many.add_stop("one more");
  expect_invalid(many, "stop has 17 strings");
  v1::GenerateRequest big = good();
  big.add_stop(std::string(kMaxStopBytes + 1, 'x'));
  expect_invalid(big, "stop[0] is 1025 bytes long");
}

TEST_F(RequestValidationTest, RequestId) {
  v1::GenerateRequest p = good();
  p.set_request_id(std::string(kMaxRequestIdBytes + 1, 'r'));
  expect_invalid(p, "request_id");
}

TEST_F(RequestValidationTest, UnsetSeedIsDrawnSetSeedIsKept) {
  // Two draws of 64 random bits colliding is a 2^-64 event.
  absl::StatusOr<GenerationRequest> a = make(good());
  absl::StatusOr<GenerationRequest> b = make(good());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->sampling.seed, b->sampling.seed);
  v1::GenerateRequest p = good();
  p.set_seed(0);
  EXPECT_EQ(make(p)->sampling.seed, 0u);
}

}  // namespace
}  // namespace ltm
