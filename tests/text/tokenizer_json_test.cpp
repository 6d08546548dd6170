// Tests of tokenizer.json reading (runtime/text/tokenizer_json.cpp, tokenizer_pipeline.cpp) on
// small files written here: what each supported step does, the folder rules (tokenizer.json
// wins; tokenizer_config.json's add_bos_token/add_eos_token), and that every unsupported or
// broken field is refused with an error naming it. Agreement with Hugging Face's own library on
// larger files is tests/python/test_tokenizer_json.py's.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/text/tokenizer.h"

namespace ltm {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// GPT-2's byte-level spelling of one byte, written out independently of the tokenizer.
std::string spell_byte(int b) {
  int next = 0x100, cp = b;
  for (int c = 0; c <= b; ++c) {
    const bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
    cp = printable ? c : next++;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level file: the 256 byte tokens (id = byte), then "ab" (256) and "abc" (257).
json byte_level_file() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[spell_byte(b)] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                           {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", "ab c"})}}}};
}

// A SentencePiece-style file as Llama 2's: <unk> <s> </s>, byte tokens 3..258, then letters.
json sentencepiece_file() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const std::vector<std::string> pieces = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a",
                                           "\xE2\x96\x81" "ab"};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = static_cast<int>(259 + i);
  const std::string sp = "\xE2\x96\x81";  // U+2581
  return {
      {"added_tokens",
       {{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", sp}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", json::array({json::array({sp, "a"}), json::array({sp + "a", "b"})})}}}};
}

Tokenizer load(const json& file) {
  absl::StatusOr<Tokenizer> t = Tokenizer::from_tokenizer_json(file.dump(), "tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) std::abort();
  return *std::move(t);
}

// The error of loading `file`, which must fail.
std::string load_error(const json& file) {
  absl::StatusOr<Tokenizer> t = Tokenizer::from_tokenizer_json(file.dump(), "tokenizer.json");
  EXPECT_FALSE(t.ok()) << "loaded: " << file.dump().substr(0, 200);
  return t.ok() ? std::string() : std::string(t.status().message());
}

TEST(TokenizerJsonTest, ByteLevelMergesAndDecode) {
  const Tokenizer t = load(byte_level_file());
  EXPECT_EQ(t.encode("abc"), (Ids{257}));
  EXPECT_EQ(t.encode("ab ab"), (Ids{256, ' ', 256}));  // GPT-2's pre-tokens: "ab", " ab"
  EXPECT_EQ(t.decode(t.encode("x abc\n\xC3\xA9")), "x abc\n\xC3\xA9");
  EXPECT_EQ(t.encode_prompt("abc"), (Ids{257}));  // no post-processor tokens
  // The same merges as ["a", "b"] pairs.
  json pairs = byte_level_file();
  pairs["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({"ab", "c"})});
  EXPECT_EQ(load(pairs).encode("abc"), (Ids{257}));
}

TEST(TokenizerJsonTest, IgnoreMergesTakesWholeWords) {
  json f = byte_level_file();
  f["model"]["vocab"]["bc"] = 258;
  f["model"]["merges"] = json::array({"b c"});
  EXPECT_EQ(load(f).encode("abc"), (Ids{'a', 258}));
  f["model"]["vocab"]["abc"] = 257;
  f["model"]["ignore_merges"] = true;  // "abc" is a token: no merging at all
  EXPECT_EQ(load(f).encode("abc"), (Ids{257}));
}

TEST(TokenizerJsonTest, UnicodeNormalForms) {
  json f = byte_level_file();
  f["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  const Tokenizer nfc = load(f);
  EXPECT_EQ(nfc.encode("e\xCC\x81"), (Ids{0xC3, 0xA9}));  // e + U+0301 -> U+00E9
  EXPECT_EQ(nfc.encode("\xFF"), (Ids{0xFF}));              // not UTF-8: left as it is
  f["normalizer"] = {{"type", "NFKD"}};
  EXPECT_EQ(load(f).encode("\xEF\xAC\x81"), (Ids{'f', 'i'}));  // U+FB01 (fi ligature)
}

TEST(TokenizerJsonTest, SplitRegexAndBehaviors) {
  json f = byte_level_file();
  f["model"]["vocab"]["a-"] = 258;
  f["model"]["vocab"]["-b"] = 259;
  f["model"]["merges"] = json::array({"a -", "- b"});
  const auto with = [&](const std::string& behavior, bool invert) {
    json g = f;
    g["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{Pd}"}}}, {"behavior", behavior},
           {"invert", invert}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    return load(g).encode("a-b");
  };
  EXPECT_EQ(with("Isolated", false), (Ids{'a', '-', 'b'}));
  EXPECT_EQ(with("Removed", false), (Ids{'a', 'b'}));
  EXPECT_EQ(with("Removed", true), (Ids{'-'}));
  EXPECT_EQ(with("MergedWithPrevious", false), (Ids{258, 'b'}));
  EXPECT_EQ(with("MergedWithNext", false), (Ids{'a', 259}));
  EXPECT_EQ(with("Contiguous", false), (Ids{'a', '-', 'b'}));
}

TEST(TokenizerJsonTest, AddedTokensMatchFirstWithStrip) {
  json f = byte_level_file();
  f["added_tokens"] = {
      {{"id", 300}, {"content", "<|x|>"}, {"special", true}, {"normalized", false}},
      {{"id", 301}, {"content", "<|x|>y"}, {"special", false}, {"normalized", false}},
      {{"id", 302}, {"content", "[M]"}, {"lstrip", true}, {"rstrip", true}}};
  f["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<|x|>"}, {"type_id", 0}}}},
                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                  {{"SpecialToken", {{"id", "[M]"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<|x|>", {{"id", "<|x|>"}, {"ids", {300}}}},
                          {"[M]", {{"id", "[M]"}, {"ids", {302}}}}}}};
  const Tokenizer t = load(f);
  EXPECT_EQ(t.vocab_size(), 303);
  EXPECT_EQ(t.encode("ab<|x|>ab"), (Ids{256, 300, 256}));
  EXPECT_EQ(t.encode("<|x|>yab"), (Ids{301, 256}));                  // longest match
  EXPECT_EQ(t.encode("ab \t[M]  ab"), (Ids{256, 302, 256}));           // whitespace taken
  EXPECT_EQ(t.encode_prompt("ab"), (Ids{300, 256, 302}));
  EXPECT_EQ(t.token_id("<|x|>"), 300);
  EXPECT_EQ(t.decode(Ids{300, 256}), "<|x|>ab");
}

TEST(TokenizerJsonTest, SentencePieceByteFallbackAndDecoder) {
  const Tokenizer t = load(sentencepiece_file());
  const int sp = 259, sp_a = 262, sp_ab = 263, a = 260;
  EXPECT_EQ(t.encode("ab"), (Ids{sp_ab}));
  EXPECT_EQ(t.encode("ab a"), (Ids{sp_ab, sp_a}));
  // "é" has no token: its two bytes' <0xC3> <0xA9>.
  EXPECT_EQ(t.encode("\xC3\xA9"), (Ids{sp, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t.decode(t.encode(" a\xC3\xA9 ab")), " a\xC3\xA9 ab");
  EXPECT_EQ(t.decode(Ids{sp_a, a}), "aa");  // the decoder strips the space the encoder added
  EXPECT_EQ(t.token_bytes(sp_ab), " ab");   // a generated token keeps it
  EXPECT_EQ(t.encode_prompt("a"), (Ids{1, sp_a}));
  // After <s> the normalizer prepends U+2581 again (as HF does: <s> is not normalized).
  EXPECT_EQ(t.encode("<s>a"), (Ids{1, sp_a}));
  // Without byte fallback: the unknown code points are one fused <unk>.
  json f = sentencepiece_file();
  f["model"]["byte_fallback"] = false;
  EXPECT_EQ(load(f).encode("a\xC3\xA9\xC3\xA9"), (Ids{sp_a, 0}));
}

TEST(TokenizerJsonTest, MetaspacePrependFirst) {
  json f = sentencepiece_file();
  const std::string sp = "\xE2\x96\x81";
  f["normalizer"] = nullptr;
  f["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", "first"},
                        {"split", true}};
  f["decoder"] = {{"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", "first"}};
  const Tokenizer t = load(f);
  EXPECT_EQ(t.encode("ab a"), (Ids{263, 262}));
  EXPECT_EQ(t.encode("<s>ab"), (Ids{1, 260, 261}));  // not at the start: no U+2581
  EXPECT_EQ(t.encode("ab", /*at_text_start=*/false), (Ids{260, 261}));
  EXPECT_EQ(t.decode(t.encode("ab a")), "ab a");
}

TEST(TokenizerJsonTest, UnsupportedFieldsAreNamed) {
  const auto expect = [](json f, const std::string& want) {
    const std::string e = load_error(f);
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.rfind("tokenizer.json: ", 0), 0u) << e;
  };
  json f = byte_level_file();
  f["model"]["type"] = "Unigram";
  expect(f, "model.type: \"Unigram\" is not supported");
  f = byte_level_file();
  f["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}};
  expect(f, "pre_tokenizer.pretokenizers[1].type: \"Digits\" is not supported");
  f = byte_level_file();
  f["normalizer"] = {{"type", "Lowercase"}};
  expect(f, "normalizer.type: \"Lowercase\" is not supported");
  f = byte_level_file();
  f["post_processor"] = {{"type", "RobertaProcessing"}};
  expect(f, "post_processor.type: \"RobertaProcessing\" is not supported");
  f = sentencepiece_file();
  f["decoder"] = {{"type", "WordPiece"}};
  expect(f, "decoder.type: \"WordPiece\" is not supported");
  f = byte_level_file();
  f["decoder"] = sentencepiece_file()["decoder"];
  expect(f, "decoder: a ByteLevel pre-tokenizer needs the ByteLevel decoder");
  f = byte_level_file();
  f["model"]["dropout"] = 0.1;
  expect(f, "model.dropout");
  f = byte_level_file();
  f["model"]["continuing_subword_prefix"] = "##";
  expect(f, "model.continuing_subword_prefix");
  f = byte_level_file();
  f["added_tokens"] = {{{"id", 5}, {"content", "x"}, {"single_word", true}}};
  expect(f, "added_tokens[0].single_word");
  f = byte_level_file();
  f["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}},
                        {"behavior", "Isolated"}};
  expect(f, "pre_tokenizer.pattern.Regex: the regex does not compile");
  f = byte_level_file();
  f["pre_tokenizer"]["type"] = "Sequence";
  f["pre_tokenizer"]["pretokenizers"] = {{{"type", "ByteLevel"}},
                                         {{"type", "Split"}, {"pattern", {{"String", " "}}},
                                          {"behavior", "Isolated"}}};
  expect(f, "ByteLevel must be the last");
}

TEST(TokenizerJsonTest, BrokenFilesAreNamed) {
  const auto expect = [](const std::string& text, const std::string& want) {
    absl::StatusOr<Tokenizer> t = Tokenizer::from_tokenizer_json(text, "tokenizer.json");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(want), std::string::npos) << t.status();
  };
  expect("{", "tokenizer.json: invalid JSON");
  expect("[]", "must be a JSON object");
  expect("{}", "model: is missing");
  json f = byte_level_file();
  f["model"]["merges"] = json::array({"a b c"});
  expect(f.dump(), "model.merges[0]: expected two tokens");
  f["model"]["merges"] = json::array({"a zz"});
  expect(f.dump(), "model.merges[0]: right part \"zz\" is not in the vocab");
  f = byte_level_file();
  f["model"]["vocab"]["x"] = -1;
  expect(f.dump(), "model.vocab: token \"x\" has id -1");
  f = byte_level_file();
  f["model"]["vocab"].erase(spell_byte(0));
  expect(f.dump(), "no token for byte 0x00");
  f = sentencepiece_file();
  f["model"]["unk_token"] = "<nope>";
  expect(f.dump(), "model.unk_token: \"<nope>\" is not in model.vocab");
  f = sentencepiece_file();
  f["post_processor"]["special_tokens"]["<s>"]["ids"] = {999};
  expect(f.dump(), "post_processor: id 999 is not a token");
  // A template naming a special token that special_tokens lacks (the fuzzer's find: it was
  // looked up with a const operator[], which reads past the map under ASan).
  f = sentencepiece_file();
  f["post_processor"]["special_tokens"].erase("<s>");
  expect(f.dump(), "special token \"<s>\" has no \"ids\" in special_tokens");
  f = byte_level_file();
  f["decoder"] = nullptr;
  expect(f.dump(), "decoder: is missing");
  f = byte_level_file();
  f["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}},
                        {"behavior", "Sideways"}};
  expect(f.dump(), "pre_tokenizer.behavior: \"Sideways\" is not a split behavior");
}

// A folder: tokenizer.json wins over vocab.json; tokenizer_config.json's add_bos_token /
// add_eos_token replace the post-processor's tokens.
class TokenizerFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ltm_tokjson_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  std::string dir_;
};

TEST_F(TokenizerFolderTest, TokenizerJsonWinsAndConfigAddsBos) {
  EXPECT_FALSE(Tokenizer::folder_has_tokenizer(dir_));
  // A vocab.json + merges.txt where "abc" is not one token.
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[spell_byte(b)] = b;
  write("vocab.json", vocab.dump());
  write("merges.txt", "#version: 0.2\n");
  EXPECT_TRUE(Tokenizer::folder_has_tokenizer(dir_));
  EXPECT_EQ(Tokenizer::load(dir_)->encode("abc"), (Ids{'a', 'b', 'c'}));
  write("tokenizer.json", sentencepiece_file().dump());
  absl::StatusOr<Tokenizer> t = Tokenizer::load(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->encode_prompt("ab"), (Ids{1, 263}));
  write("tokenizer_config.json", R"({"add_bos_token": false, "add_eos_token": true,
                                     "eos_token": {"content": "</s>"}})");
  t = Tokenizer::load(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->encode_prompt("ab"), (Ids{263, 2}));
  write("tokenizer_config.json", R"({"add_bos_token": true, "bos_token": "<none>"})");
  t = Tokenizer::load(dir_);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer_config.json: bos_token: \"<none>\" is not a "
                                      "token"), std::string::npos) << t.status();
  write("tokenizer_config.json", "{");
  EXPECT_NE(Tokenizer::load(dir_).status().message().find("tokenizer_config.json: not valid"),
            std::string::npos);
  write("tokenizer.json", "{\"model\": 3}");
  EXPECT_NE(Tokenizer::load(dir_).status().message().find("/tokenizer.json: model: must be"),
            std::string::npos) << Tokenizer::load(dir_).status();
}

}  // namespace
}  // namespace ltm
