// Chat completions (runtime/serve/openai_api.h parse_chat_completion, CompletionBuilder's chat
// shapes) and the chat format (runtime/serve/chat_format.h): messages -> prompt ids through a
// stand-in renderer (the Jinja interpreter has tests of its own), special tokens matched whole,
// end ids from the folder's files, one 400 naming the field per kind of bad input. Toy byte-level
// vocabulary; files only in a temporary folder; no server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/serve/chat_format.h"
#include "runtime/serve/openai_api.h"
#include "tests/serve/toy_vocab.h"

namespace ltm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int32_t kEot = 259;     // "<|endoftext|>"
constexpr int32_t kImEnd = 260;   // "<|im_end|>"
constexpr int32_t kImStart = 261; // "<|im_start|>"

// Ids 0..255: the bytes; 256 "he", 257 "ll", 258 "hell", then three special tokens.
Tokenizer toy_tokenizer() {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(testing_vocab::byte_spelling(b), b);
  vocab.emplace_back("he", 256);
  vocab.emplace_back("ll", 257);
  vocab.emplace_back("hell", 258);
  vocab.emplace_back("<|endoftext|>", kEot);
  vocab.emplace_back("<|im_end|>", kImEnd);
  vocab.emplace_back("<|im_start|>", kImStart);
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}};
  absl::StatusOr<Tokenizer> t = Tokenizer::from_tables(vocab, merges, "toy");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

// A stand-in for a ChatML template: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then
// "<|im_start|>assistant\n"; a message whose content is "raise" makes it fail as
// raise_exception would. Checks the context transformers gives.
ChatFormat::Renderer chatml_renderer() {
  return [](const json& ctx) -> absl::StatusOr<std::string> {
    EXPECT_EQ(ctx.at("add_generation_prompt"), true);
    EXPECT_EQ(ctx.at("eos_token"), "<|im_end|>");
    std::string out;
    for (const json& m : ctx.at("messages")) {
      if (m.at("content") == "raise") return absl::InvalidArgumentError("roles must alternate");
      out += absl::StrCat("<|im_start|>", m.at("role").get<std::string>(), "\n",
                          m.at("content").get<std::string>(), "<|im_end|>\n");
    }
    return out + "<|im_start|>assistant\n";
  };
}

ChatFormatSpec chatml_spec() {
  ChatFormatSpec spec;
  spec.template_source = "{# names <|im_end|> #}";
  spec.template_origin = "test";
  spec.eos_token = "<|im_end|>";
  spec.special_tokens = {{"<|im_start|>", kImStart}, {"<|im_end|>", kImEnd}};
  spec.generation_eos_ids = {kEot, 7};
  return spec;
}

class ChatApiTest : public ::testing::Test {
 protected:
  ChatApiTest() {
    absl::StatusOr<std::shared_ptr<const ChatFormat>> f =
        ChatFormat::create(chatml_spec(), chatml_renderer(), tokenizer_, 262);
    EXPECT_TRUE(f.ok()) << f.status();
    format_ = *f;
    ctx_.tokenizer = &tokenizer_;
    ctx_.limits = {64, 262, 63 * 12};
    ctx_.model_name = "toy";
    ctx_.chat = format_.get();
  }
  std::optional<ApiError> parse(const std::string& body) {
    out_ = ParsedCompletion{};
    return parse_chat_completion(body, ctx_, &out_);
  }
  void expect_400(const std::string& body, const std::string& param, const std::string& words) {
    std::optional<ApiError> e = parse(body);
    ASSERT_TRUE(e.has_value()) << body << " was accepted";
    EXPECT_EQ(e->http_status, 400) << body;
    EXPECT_EQ(e->type, "invalid_request_error") << body;
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
    EXPECT_THAT(e->message, HasSubstr(words)) << body;
  }
  std::vector<int32_t> ids(const std::string& text) { return tokenizer_.encode(text); }

  Tokenizer tokenizer_ = toy_tokenizer();
  std::shared_ptr<const ChatFormat> format_;
  CompletionContext ctx_;
  ParsedCompletion out_;
};

TEST_F(ChatApiTest, SpecialTokensAreMatchedWholeAndTheRestIsBpe) {
  // Special text between ordinary text, at both ends, back to back, and a near miss.
  EXPECT_THAT(format_->encode("hello<|im_end|>he"), ElementsAre(258, 'o', kImEnd, 256));
  EXPECT_THAT(format_->encode("<|im_start|><|im_end|>"), ElementsAre(kImStart, kImEnd));
  std::vector<int32_t> near = ids("<|im_en|>");
  EXPECT_EQ(format_->encode("<|im_en|>"), near);
  EXPECT_EQ(format_->encode(""), std::vector<int32_t>{});
  // Not listed as special: GPT-2's <|endoftext|> is BPE-encoded byte by byte, as text.
  EXPECT_EQ(format_->encode("<|endoftext|>"), ids("<|endoftext|>"));
}

TEST_F(ChatApiTest, EosTextThatIsOneTokenIsSpecialToo) {
  ChatFormatSpec spec;
  spec.eos_token = "<|endoftext|>";
  auto f = ChatFormat::create(spec, nullptr, tokenizer_, 262);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE((*f)->has_template());
  EXPECT_THAT((*f)->encode("a<|endoftext|>"), ElementsAre('a', kEot));
  EXPECT_THAT((*f)->chat_end_ids(), ElementsAre(kEot));
}

TEST_F(ChatApiTest, EndIdsAreGenerationConfigEosAndTheTemplatesEndOfTurn) {
  EXPECT_THAT(format_->generation_eos_ids(), ElementsAre(kEot, 7));
  EXPECT_THAT(format_->chat_end_ids(), ElementsAre(kEot, 7, kImEnd));
}

TEST_F(ChatApiTest, MessagesBecomeTheRenderedPromptWithDefaults) {
  ASSERT_FALSE(parse(R"({"messages": [{"role": "system", "content": "hi"},
                                       {"role": "user", "content": "hello"}]})"));
  std::vector<int32_t> want = {kImStart};
  for (int32_t id : ids("system\nhi")) want.push_back(id);
  want.push_back(kImEnd);
  for (int32_t id : ids("\n")) want.push_back(id);
  want.push_back(kImStart);
  for (int32_t id : ids("user\nhello")) want.push_back(id);
  want.push_back(kImEnd);
  for (int32_t id : ids("\n")) want.push_back(id);
  want.push_back(kImStart);
  for (int32_t id : ids("assistant\n")) want.push_back(id);
  const GenerationRequest& r = out_.request;
  EXPECT_EQ(r.prompt_ids, want);
  // OpenAI's default: what the context leaves.
  EXPECT_EQ(r.max_new_tokens, 64 - static_cast<int32_t>(want.size()));
  EXPECT_THAT(r.end_ids, ElementsAre(kEot, 7, kImEnd));
  EXPECT_TRUE(out_.params.chat);
  EXPECT_EQ(out_.params.logprobs, -1);
  EXPECT_EQ(r.logprob_alternatives, -1);
  EXPECT_EQ(out_.params.model, "toy");
}

TEST_F(ChatApiTest, SamplingFieldsAndTextPartsAreTaken) {
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content":
                             [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                         "max_tokens": 3, "max_completion_tokens": 5, "temperature": 0,
                         "top_p": 0.5, "stop": ["x"], "seed": 9, "logprobs": true,
                         "top_logprobs": 2, "stream": true,
                         "stream_options": {"include_usage": true}, "model": "adapter-a"})"));
  const GenerationRequest& r = out_.request;
  EXPECT_EQ(r.max_new_tokens, 5);  // max_completion_tokens wins
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.seed, 9u);
  EXPECT_THAT(r.stop, ElementsAre("x"));
  EXPECT_EQ(r.logprob_alternatives, 2);
  EXPECT_EQ(r.adapter, "adapter-a");
  EXPECT_EQ(out_.params.model, "adapter-a");
  EXPECT_TRUE(out_.params.stream && out_.params.include_usage);
  EXPECT_EQ(out_.params.logprobs, 2);
  // The parts are joined with a newline.
  std::vector<int32_t> content = ids("user\na\nb");
  EXPECT_TRUE(std::search(r.prompt_ids.begin(), r.prompt_ids.end(), content.begin(),
                          content.end()) != r.prompt_ids.end());
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true})"));
  EXPECT_EQ(out_.request.logprob_alternatives, 0);
  ASSERT_FALSE(parse(R"({"messages": [{"role": "developer", "content": "a"}]})"));
}

TEST_F(ChatApiTest, BadMessagesAreRefusedNamingTheField) {
  expect_400(R"({"model": "toy"})", "messages", "messages is missing");
  expect_400(R"({"messages": "hi"})", "messages", "must be a list");
  expect_400(R"({"messages": []})", "messages", "empty");
  expect_400(R"({"messages": [3]})", "messages[0]", "must be an object");
  expect_400(R"({"messages": [{"role": "user", "content": "a"}, {"content": "b"}]})",
             "messages[1].role", "messages[1].role is missing");
  expect_400(R"({"messages": [{"role": null, "content": "b"}]})", "messages[0].role",
             "is missing");
  expect_400(R"({"messages": [{"role": 1, "content": "b"}]})", "messages[0].role",
             "must be a string");
  expect_400(R"({"messages": [{"role": "wizard", "content": "b"}]})", "messages[0].role",
             "\"wizard\": it must be \"system\", \"user\" or \"assistant\"");
  expect_400(R"({"messages": [{"role": "user"}]})", "messages[0].content", "is missing");
  expect_400(R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
             "a string or a list of text parts");
  expect_400(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
             "messages[0].content[0].type", "only text");
  expect_400(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
             "messages[0].content[0].text", "must be a string");
  expect_400(R"({"messages": [{"role": "user", "content": "a", "name": 3}]})",
             "messages[0].name", "must be a string");
  expect_400(R"({"messages": [{"role": "assistant", "content": "a", "tool_calls": [{}]}]})",
             "messages[0].tool_calls", "not supported");
}

TEST_F(ChatApiTest, BadFieldsAreRefusedNamingTheField) {
  const std::string m = R"("messages": [{"role": "user", "content": "a"}])";
  expect_400("{" + m + R"(, "n": 2})", "n", "only n = 1");
  expect_400("{" + m + R"(, "max_tokens": 0})", "max_tokens", "max_tokens must be in [1,");
  expect_400("{" + m + R"(, "max_completion_tokens": "5"})", "max_completion_tokens",
             "must be an integer");
  expect_400("{" + m + R"(, "max_tokens": 60})", "max_tokens", "");  // past the context
  expect_400("{" + m + R"(, "top_logprobs": 2})", "top_logprobs", "needs logprobs: true");
  expect_400("{" + m + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs",
             "[0, 20]");
  expect_400("{" + m + R"(, "logprobs": 3})", "logprobs", "must be a boolean");
  expect_400("{" + m + R"(, "temperature": -1})", "temperature", ">= 0");
  expect_400("{" + m + R"(, "tools": [{"type": "function"}]})", "tools", "not supported");
  expect_400("{" + m + R"(, "tool_choice": "auto"})", "tool_choice", "not supported");
  expect_400("{" + m + R"(, "response_format": {"type": "json_object"}})", "response_format",
             "only");
  expect_400("{" + m + R"(, "stream_options": {"include_usage": true}})", "stream_options",
             "only allowed with stream");
  ASSERT_FALSE(parse("{" + m + R"(, "tools": [], "tool_choice": "none",
                                     "response_format": {"type": "text"}})"));
}

TEST_F(ChatApiTest, TheTemplatesOwnRefusalAndAnOverlongPromptNameMessages) {
  expect_400(R"({"messages": [{"role": "user", "content": "raise"}]})", "messages",
             "roles must alternate");
  const std::string longer(200, 'z');
  expect_400(R"({"messages": [{"role": "user", "content": ")" + longer + R"("}]})", "messages",
             "messages (the prompt the chat template makes of them)");
}

TEST_F(ChatApiTest, AModelWithoutATemplateSaysSo) {
  auto none = ChatFormat::create(ChatFormatSpec{}, nullptr, tokenizer_, 262);
  ASSERT_TRUE(none.ok());
  ctx_.chat = none->get();
  expect_400(R"({"messages": [{"role": "user", "content": "a"}]})", "messages",
             "has no chat template");
  ctx_.chat = nullptr;
  expect_400(R"({"messages": [{"role": "user", "content": "a"}]})", "messages",
             "has no chat template");
  // The messages are still checked first.
  expect_400(R"({"messages": [{"content": "a"}]})", "messages[0].role", "is missing");
}

TEST_F(ChatApiTest, CompletionsEndAtGenerationConfigEosToo) {
  ParsedCompletion out;
  ASSERT_FALSE(parse_completion(R"({"prompt": "a"})", ctx_, &out));
  EXPECT_THAT(out.request.end_ids, ElementsAre(kEot, 7));
}

TEST_F(ChatApiTest, ResponsesHaveOpenAisChatShapes) {
  CompletionParams params;
  params.chat = true;
  params.model = "toy";
  params.logprobs = 1;
  CompletionBuilder b(tokenizer_, params, "chatcmpl-1", 1700000000);
  TokenLogprob t{'h', true, -0.5f, {{'h', -0.5f}}};
  const json whole = json::parse(b.full_json("hi", {t}, FinishReason::kEos, 7, 2));
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["id"], "chatcmpl-1");
  EXPECT_EQ(whole["choices"][0]["message"], json({{"role", "assistant"}, {"content", "hi"}}));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(whole["usage"], json({{"prompt_tokens", 7}, {"completion_tokens", 2},
                                  {"total_tokens", 9}}));
  const json lp = whole["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 1u);
  EXPECT_EQ(lp[0]["token"], "h");
  EXPECT_EQ(lp[0]["logprob"], -0.5);
  EXPECT_EQ(lp[0]["bytes"], json::array({'h'}));
  EXPECT_EQ(lp[0]["top_logprobs"],
            json::array({{{"token", "h"}, {"logprob", -0.5}, {"bytes", json::array({'h'})}}}));

  const json role = json::parse(b.role_chunk_json());
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  const json piece = json::parse(b.chunk_json("he", {t}, FinishReason::kNone));
  EXPECT_EQ(piece["choices"][0]["delta"], json({{"content", "he"}}));
  EXPECT_EQ(piece["choices"][0]["logprobs"]["content"].size(), 1u);
  const json last = json::parse(b.chunk_json("", {}, FinishReason::kLength));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json usage = json::parse(b.usage_chunk_json(7, 2));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 9);

  params.logprobs = -1;
  CompletionBuilder plain(tokenizer_, params, "chatcmpl-2", 1700000000);
  EXPECT_TRUE(json::parse(plain.full_json("x", {}, FinishReason::kStop, 1, 1))["choices"][0]
                  ["logprobs"].is_null());
}

// ---- the folder's files ----------------------------------------------------------------------

class ChatFolderTest : public ::testing::Test {
 protected:
  ChatFolderTest() {
    dir_ = fs::temp_directory_path() / absl::StrCat("chat_api_test_", getpid(), "_",
                                                     ::testing::UnitTest::GetInstance()
                                                         ->current_test_info()
                                                         ->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ChatFolderTest() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  absl::StatusOr<std::shared_ptr<const ChatFormat>> load(const std::string& template_file = "") {
    return ChatFormat::load(dir_.string(), dir_.string(), template_file, tokenizer_, 262);
  }
  Tokenizer tokenizer_ = toy_tokenizer();
  fs::path dir_;
};

TEST_F(ChatFolderTest, NoFilesNoTemplate) {
  auto f = load();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE((*f)->has_template());
  EXPECT_TRUE((*f)->chat_end_ids().empty());
}

TEST_F(ChatFolderTest, ConfigsGiveSpecialTokensAndEndIds) {
  write("tokenizer_config.json", R"({"eos_token": {"content": "<|im_end|>", "special": true},
      "bos_token": null,
      "added_tokens_decoder": {"261": {"content": "<|im_start|>", "special": true}}})");
  write("generation_config.json", R"({"eos_token_id": [7, 259]})");
  auto f = load();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT((*f)->encode("<|im_start|>a<|im_end|>"), ElementsAre(kImStart, 'a', kImEnd));
  EXPECT_THAT((*f)->generation_eos_ids(), ElementsAre(7, kEot));
  EXPECT_THAT((*f)->chat_end_ids(), ElementsAre(7, kEot, kImEnd));
  write("generation_config.json", R"({"eos_token_id": 5})");
  f = load();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT((*f)->generation_eos_ids(), ElementsAre(5));
}

// The folder's template, parsed by the Jinja interpreter (runtime/chat/) at load and rendered
// with transformers' context; --chat-template FILE replaces it.
TEST_F(ChatFolderTest, TheFoldersTemplateIsParsedOnceAndRendered) {
  const json config = {
      {"eos_token", "<|im_end|>"},
      {"added_tokens_decoder",
       {{"260", {{"content", "<|im_end|>"}}}, {"261", {{"content", "<|im_start|>"}}}}},
      {"chat_template",
       "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
       "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
       "{% endif %}"}};
  write("tokenizer_config.json", config.dump());
  auto f = load();
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->has_template());
  EXPECT_EQ((*f)->template_origin(), (dir_ / "tokenizer_config.json").string());
  absl::StatusOr<std::string> text =
      (*f)->render(json::array({{{"role", "user"}, {"content", " hello "}}}));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
  std::vector<int32_t> want = {kImStart};
  for (int32_t id : tokenizer_.encode("user\nhello")) want.push_back(id);
  want.push_back(kImEnd);
  for (int32_t id : tokenizer_.encode("\n")) want.push_back(id);
  want.push_back(kImStart);
  for (int32_t id : tokenizer_.encode("assistant\n")) want.push_back(id);
  EXPECT_EQ((*f)->encode(*text), want);
  EXPECT_THAT((*f)->chat_end_ids(), ElementsAre(kImEnd));

  write("other.jinja",
        "{{ bos_token }}[{{ messages | length }}]{{ messages[-1]['content'] | upper }}");
  f = load((dir_ / "other.jinja").string());
  ASSERT_TRUE(f.ok()) << f.status();
  text = (*f)->render(json::array({{{"role", "user"}, {"content", "a"}},
                                   {{"role", "assistant"}, {"content", "b"}}}));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "[2]B");
  // raise_exception: a 400 of the request, with the template's words.
  write("strict.jinja", "{{ raise_exception('roles must alternate') }}");
  f = load((dir_ / "strict.jinja").string());
  ASSERT_TRUE(f.ok()) << f.status();
  text = (*f)->render(json::array());
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("roles must alternate"));
}

TEST_F(ChatFolderTest, BadFilesAreLoadErrorsNamingTheFile) {
  auto expect_error = [&](const std::string& file, const std::string& words) {
    auto f = load();
    ASSERT_FALSE(f.ok()) << file;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr((dir_ / file).string()));
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(words));
  };
  write("generation_config.json", R"({"eos_token_id": 262})");
  expect_error("generation_config.json", "\"eos_token_id\" must be a token id in [0, 262)");
  write("generation_config.json", R"({"eos_token_id": ["a"]})");
  expect_error("generation_config.json", "eos_token_id");
  write("generation_config.json", "{");
  expect_error("generation_config.json", "not valid JSON");
  fs::remove(dir_ / "generation_config.json");
  write("tokenizer_config.json", R"({"chat_template": 3})");
  expect_error("tokenizer_config.json", "\"chat_template\" must be a string");
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"999": {"content": "x"}}})");
  expect_error("tokenizer_config.json", "added_tokens_decoder.999");
  write("tokenizer_config.json", R"({"eos_token": 5})");
  expect_error("tokenizer_config.json", "\"eos_token\" must be a string");
  // A template that does not parse: the file is named.
  write("tokenizer_config.json", R"({"chat_template": "{% for m in messages %}"})");
  expect_error("tokenizer_config.json", "the chat template does not parse");
  fs::remove(dir_ / "tokenizer_config.json");
  write("bad.jinja", "{{ messages[0].content ");
  auto f = load((dir_ / "bad.jinja").string());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr((dir_ / "bad.jinja").string()));
  f = load((dir_ / "missing.jinja").string());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("missing.jinja"));
}

}  // namespace
}  // namespace ltm
