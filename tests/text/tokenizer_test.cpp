// Tests of runtime/tokenizer: the GPT-2 byte-level BPE tokenizer and the streaming decoder.
//
// Most tests use the real GPT-2 vocab from $LTM_GPT2_DIR (scripts/fetch_gpt2_vocab); they fail,
// not skip, when it is missing. The expected ids were produced by the reference JS encoder
// (gpt-3-encoder's Encoder.js; tests/python/test_tokenizer_reference.py compares it on a larger
// random corpus). The Synthetic* tests build small vocabularies of their own and need nothing.
#include "runtime/text/tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "nlohmann/json.hpp"

namespace ltm {
namespace {

using Ids = std::vector<int32_t>;

// ---- helpers ------------------------------------------------------------------------------------

// GPT-2's byte-level alphabet, written out independently of the tokenizer: printable bytes stand
// for themselves, the other 68 bytes map to U+0100.. in byte order.
std::string spell_byte(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 0x100;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      const int cp = printable ? c : next++;
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      t[c] = s;
    }
    return t;
  }();
  return table[b];
}

std::string spell(std::string_view bytes) {
  std::string s;
  for (const unsigned char b : bytes) s += spell_byte(b);
  return s;
}

// A fresh directory under /tmp, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "ltm_tokenizer_XXXXXX").string();
    const char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream out(path_ + "/" + name, std::ios::binary);
    out << content;
  }

 private:
  std::string path_;
};

// A small vocab: the 256 byte tokens (ids 0..255 in byte order) plus `extra` tokens (raw bytes).
std::vector<std::pair<std::string, int32_t>> small_vocab(const std::vector<std::string>& extra) {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(spell_byte(b), b);
  for (const std::string& e : extra)
    vocab.emplace_back(spell(e), static_cast<int32_t>(vocab.size()));
  return vocab;
}

std::string vocab_json(const std::vector<std::pair<std::string, int32_t>>& vocab) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [text, id] : vocab) j[text] = id;
  return j.dump();
}

// Strings of many scripts and whitespace shapes (valid UTF-8).
const std::vector<std::string>& sample_texts() {
  static const std::vector<std::string> texts = {
      "",
      "Hello world",
      "I'm sure they'll say it's what we've done, you're right, I'd go.",
      "  leading and trailing  ",
      "a\n\n\nb\t\tc\r\n",
      "1234567 + 89 = 3.14e10",
      "Emoji: 😀👍🏽 👨‍👩‍👧 🇫🇷!",
      "你好，世界。日本語のテキスト",
      "مرحبا بالعالم",
      "नमस्ते दुनिया २०२४",
      "Ελληνικά и русский текст",
      "café naïve e\xCC\x81 a\xCC\x88",
      "\xC2\xA0nbsp\xE3\x80\x80ideographic space\xE2\x80\xA8line sep",
      "<|endoftext|>",
      "    def f(x):\n        return x  # comment\n",
  };
  return texts;
}

// ---- real GPT-2 vocab ---------------------------------------------------------------------------

class Gpt2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    static const absl::StatusOr<Tokenizer>* loaded = [] {
      const char* dir = std::getenv("LTM_GPT2_DIR");
      if (dir == nullptr || *dir == '\0') {
        return new absl::StatusOr<Tokenizer>(absl::FailedPreconditionError(
            "LTM_GPT2_DIR is not set: run scripts/fetch_gpt2_vocab and set LTM_GPT2_DIR to its "
            "folder (default ~/.cache/ltm/gpt2)"));
      }
      return new absl::StatusOr<Tokenizer>(Tokenizer::load(dir));
    }();
    ASSERT_TRUE(loaded->ok()) << loaded->status().message();
    tok_ = &**loaded;
  }
  const Tokenizer& tok() const { return *tok_; }

 private:
  const Tokenizer* tok_ = nullptr;
};

TEST_F(Gpt2Test, VocabBasics) {
  EXPECT_EQ(tok().vocab_size(), 50257);
  EXPECT_EQ(tok().token_id("<|endoftext|>"), 50256);
  EXPECT_EQ(tok().token_id("Ġthe"), 262);
  EXPECT_EQ(tok().token_id("no such token"), std::nullopt);
  EXPECT_EQ(tok().token_bytes(262), " the");
  EXPECT_EQ(tok().token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(tok().token_bytes(198), "\n");
  EXPECT_TRUE(tok().valid_id(0));
  EXPECT_TRUE(tok().valid_id(50256));
  EXPECT_FALSE(tok().valid_id(50257));
  EXPECT_FALSE(tok().valid_id(-1));
}

TEST_F(Gpt2Test, KnownIds) {
  // Expected ids from the reference JS encoder.
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Hello world", {15496, 995}},
      {"I'm sure they'll say it's what we've done, you're right, I'd go.",
       {40,   1101, 1654, 484, 1183, 910, 340, 338,  644, 356, 1053,
        1760, 11,   345,  821, 826,  11,  314, 1549, 467, 13}},
      {"Don'T SHOUT'S", {3987, 6, 51, 6006, 12425, 6, 50}},  // contractions are lower case only
      {"1234567 + 89 = 3.14e10", {10163, 2231, 3134, 1343, 9919, 796, 513, 13, 1415, 68, 940}},
      {"a  b   c", {64, 220, 275, 220, 220, 269}},  // a space run gives up its last space
      {"line one\n\nline two\n", {1370, 530, 198, 198, 1370, 734, 198}},
      {"  two leading spaces and two trailing  ",
       {220, 734, 3756, 9029, 290, 734, 25462, 220, 220}},
      {"\t\n \r\n", {197, 198, 220, 201, 198}},
      {"Emoji: 😀👍🏽!", {36, 5908, 7285, 25, 30325, 222, 41840, 235, 8582, 237, 121, 0}},
      {"你好，世界", {19526, 254, 25001, 121, 171, 120, 234, 10310, 244, 45911, 234}},
      {"مرحبا بالعالم",
       {25405, 26897, 148, 255, 39848, 12919, 17550, 101, 23525, 44690, 23525, 25405}},
      {"२०२४", {24231, 101, 24231, 99, 24231, 101, 24231, 103}},  // Devanagari digits: \p{N}
      {"cafe\xCC\x81 nai\xCC\x88ve",
       {66, 8635, 136, 223, 299, 1872, 136, 230, 303}},      // marks: other
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},  // plain text, not the special token
      {"\xC2\xA0non-breaking\xE3\x80\x80ideographic",
       {1849, 13159, 12, 13395, 5099, 222, 485, 6826}},
      {"", {}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ(tok().encode(text), ids) << text;
}

TEST_F(Gpt2Test, DecodeInvertsEncode) {
  for (const std::string& text : sample_texts()) {
    const Ids ids = tok().encode(text);
    EXPECT_EQ(tok().decode(ids), text);
    for (const int32_t id : ids) EXPECT_TRUE(tok().valid_id(id));
  }
}

TEST_F(Gpt2Test, InvalidUtf8RoundTripsBytes) {
  const std::vector<std::string> broken = {
      "\xFF",
      "\x80",
      "abc\x80"
      "def",
      "\xC3",
      "\xC3(",
      "\xE2\x82",
      "\xE2\x82 x",
      "\xF0\x9F\x98",
      "\xF0\x9F\x98 \xF0\x9F",
      "\xC0\xAF",
      "\xED\xA0\x80",
      "\xF4\x90\x80\x80",
      "\xF8\x88\x80\x80\x80",
      " \xFE\xFE\xFF",
      "it\x92s",
      std::string("nul\0\xFF", 5),
      "'\xFFs",
      "1\xFF"
      "2",
      " \x80 ",
  };
  for (const std::string& text : broken) {
    EXPECT_FALSE(is_valid_utf8(text)) << testing::PrintToString(text);
    EXPECT_EQ(tok().decode(tok().encode(text)), text) << testing::PrintToString(text);
  }
  // Random bytes, biased to UTF-8 lead and continuation bytes.
  std::mt19937 rng(12345);
  for (int round = 0; round < 2000; ++round) {
    std::string text(rng() % 40, '\0');
    for (char& c : text) {
      const uint32_t r = rng();
      c = static_cast<char>(r % 4 == 0   ? 0x80 + (r >> 8) % 0x80
                            : r % 4 == 1 ? ' '
                                         : (r >> 8) % 256);
    }
    ASSERT_EQ(tok().decode(tok().encode(text)), text) << testing::PrintToString(text);
  }
}

TEST_F(Gpt2Test, EncodeKeepsInvalidBytesApart) {
  // An invalid byte is one "other" code point: it joins a punctuation run, not a letter run.
  Ids expected = tok().encode("ab");
  expected.push_back(*tok().token_id(spell_byte(0xFF)));
  for (const int32_t id : tok().encode("cd")) expected.push_back(id);
  EXPECT_EQ(tok().encode("ab\xFF"
                         "cd"),
            expected);
  EXPECT_EQ(tok().decode(tok().encode(" \xFF")), " \xFF");
}

TEST_F(Gpt2Test, StreamingHoldsBackSplitCharacters) {
  // 😀 is F0 9F 98 80; GPT-2 encodes it as [F0 9F 98] [80].
  const Ids ids = tok().encode("😀");
  ASSERT_EQ(ids, (Ids{47249, 222}));
  StreamingDecoder dec(tok());
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "😀");
  EXPECT_EQ(dec.flush(), "");

  // Text ending inside a character: flush() gives one U+FFFD.
  StreamingDecoder partial(tok());
  EXPECT_EQ(partial.push(tok().encode("a")[0]), "a");
  EXPECT_EQ(partial.push(47249), "");
  EXPECT_EQ(partial.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(partial.flush(), "");
  // A stray continuation byte is replaced at once.
  EXPECT_EQ(partial.push(222), "\xEF\xBF\xBD");
}

TEST_F(Gpt2Test, StreamingMatchesDecode) {
  for (const std::string& text : sample_texts()) {
    StreamingDecoder dec(tok());
    std::string out;
    for (const int32_t id : tok().encode(text)) {
      const std::string piece = dec.push(id);
      EXPECT_TRUE(is_valid_utf8(piece));
      out += piece;
    }
    out += dec.flush();
    EXPECT_EQ(out, text);
  }
}

TEST_F(Gpt2Test, StreamingOutputIsAlwaysValidUtf8) {
  std::mt19937 rng(777);
  for (int round = 0; round < 500; ++round) {
    StreamingDecoder dec(tok());
    std::string out;
    Ids ids;
    for (int i = 0; i < 20; ++i) ids.push_back(static_cast<int32_t>(rng() % tok().vocab_size()));
    for (const int32_t id : ids) out += dec.push(id);
    out += dec.flush();
    ASSERT_TRUE(is_valid_utf8(out));
    const std::string bytes = tok().decode(ids);
    if (is_valid_utf8(bytes)) {
      ASSERT_EQ(out, bytes);
    }
  }
}

TEST_F(Gpt2Test, ConcurrentEncodeAgrees) {
  std::vector<Ids> expected;
  for (const std::string& text : sample_texts()) expected.push_back(tok().encode(text));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 50; ++rep) {
        for (size_t i = 0; i < sample_texts().size(); ++i) {
          if (tok().encode(sample_texts()[i]) != expected[i]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
constexpr double kMaxSecondsPerMb = 1.0;  // measured ~0.1 s on a laptop core
#else
constexpr double kMaxSecondsPerMb = 20.0;  // debug or sanitizer build: only catch hangs
#endif

TEST_F(Gpt2Test, EncodesOneMegabyteOfEnglishQuickly) {
  const std::vector<std::string> words = {
      "the",     "of",      "and",      "to",         "in",          "a",           "is",
      "that",    "for",     "it",       "as",         "was",         "with",        "be",
      "by",      "on",      "not",      "he",         "I",           "this",        "are",
      "or",      "his",     "from",     "at",         "which",       "but",         "have",
      "an",      "had",     "they",     "you",        "were",        "their",       "one",
      "all",     "we",      "can",      "her",        "has",         "there",       "been",
      "if",      "more",    "when",     "will",       "would",       "who",         "so",
      "no",      "model",   "language", "tokenizer",  "server",      "request",     "because",
      "through", "between", "however",  "government", "information", "development", "international",
      "2024",    "17",      "don't",    "it's"};
  const std::vector<std::string> seps = {" ", " ", " ", " ", " ", ", ", ". ", ".\n", "; ", "\n\n"};
  std::mt19937 rng(42);
  std::string text = "The";
  while (text.size() < (1 << 20)) {
    text += seps[rng() % seps.size()];
    text += words[rng() % words.size()];
  }
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = tok().encode(text);
  const double secs = seconds_since(start);
  std::printf("encoded %zu bytes into %zu tokens in %.3f s (%.1f MB/s)\n", text.size(), ids.size(),
              secs, text.size() / 1e6 / secs);
  EXPECT_LT(secs, kMaxSecondsPerMb);
  EXPECT_EQ(tok().decode(ids), text);
}

TEST_F(Gpt2Test, LongWordsAreNotQuadratic) {
  // One pre-token of 1 MB (letters only) and 256 KB of random letters.
  const std::string a(1 << 20, 'a');
  std::string random_letters(1 << 18, 'x');
  std::mt19937 rng(9);
  for (char& c : random_letters) c = static_cast<char>('a' + rng() % 26);
  for (const std::string* text : std::vector<const std::string*>{&a, &random_letters}) {
    const auto start = std::chrono::steady_clock::now();
    const Ids ids = tok().encode(*text);
    const double secs = seconds_since(start);
    std::printf("one %zu-byte word: %zu tokens in %.3f s\n", text->size(), ids.size(), secs);
    EXPECT_LT(secs, 2 * kMaxSecondsPerMb);
    EXPECT_EQ(tok().decode(ids), *text);
  }
}

// ---- vocab and merges errors --------------------------------------------------------------------

class LoadErrorTest : public ::testing::Test {
 protected:
  // A valid folder: bytes + "ab", "abc"; merges "a b", "ab c".
  void write_valid() {
    dir_.write("vocab.json", vocab_json(small_vocab({"ab", "abc"})));
    dir_.write("merges.txt", "#version: 0.2\na b\nab c\n");
  }
  std::string load_error() {
    absl::StatusOr<Tokenizer> tok = Tokenizer::load(dir_.path());
    EXPECT_FALSE(tok.ok());
    return tok.ok() ? "" : std::string(tok.status().message());
  }
  TempDir dir_;
};

TEST_F(LoadErrorTest, ValidFolderLoads) {
  write_valid();
  absl::StatusOr<Tokenizer> tok = Tokenizer::load(dir_.path());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->encode("abc abd"), (Ids{257, ' ', 256, 'd'}));
}

TEST_F(LoadErrorTest, MissingFiles) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::load(dir_.path() + "/nowhere");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("nowhere/vocab.json"), std::string::npos);
  EXPECT_NE(tok.status().message().find("No such file"), std::string::npos);

  dir_.write("vocab.json", vocab_json(small_vocab({})));
  const std::string msg = load_error();
  EXPECT_NE(msg.find("merges.txt"), std::string::npos) << msg;
}

TEST_F(LoadErrorTest, InvalidJson) {
  write_valid();
  dir_.write("vocab.json", "{\"a\": 1,");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("vocab.json: invalid JSON"), std::string::npos) << msg;
}

// A token spelled twice in vocab.json (which id?) is refused naming it; so is nesting past the
// depth limit, and an id value is described in bounded space.
TEST_F(LoadErrorTest, DuplicateTokensAndDepth) {
  write_valid();
  std::string text = vocab_json(small_vocab({"ab"}));
  text.back() = ',';
  text += "\"ab\": 300}";
  dir_.write("vocab.json", text);
  std::string msg = load_error();
  EXPECT_NE(msg.find("vocab.json: invalid JSON: ab: duplicate key"), std::string::npos) << msg;
  text = vocab_json(small_vocab({}));
  text.back() = ',';
  text += "\"deep token\": " + std::string(1000, '[') + "}";
  dir_.write("vocab.json", text);
  msg = load_error();
  EXPECT_NE(msg.find("nests deeper than 64 levels"), std::string::npos) << msg;
  auto vocab = nlohmann::json::parse(vocab_json(small_vocab({"ab"})));
  vocab["ab"] = nlohmann::json::array();
  for (int i = 0; i < 10000; ++i) vocab["ab"].push_back(i);
  dir_.write("vocab.json", vocab.dump());
  msg = load_error();
  EXPECT_NE(msg.find("has id a list of 10000 elements"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 500u);
}

TEST_F(LoadErrorTest, JsonNotAnObject) {
  write_valid();
  dir_.write("vocab.json", "[1, 2, 3]");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("vocab.json: expected a JSON object"), std::string::npos) << msg;
}

TEST_F(LoadErrorTest, IdNotAnInteger) {
  write_valid();
  auto vocab = nlohmann::json::parse(vocab_json(small_vocab({"ab", "abc"})));
  vocab["abc"] = "7";
  dir_.write("vocab.json", vocab.dump());
  const std::string msg = load_error();
  EXPECT_NE(msg.find("vocab.json: token \"abc\" has id \"7\""), std::string::npos) << msg;
  vocab["abc"] = -3;
  dir_.write("vocab.json", vocab.dump());
  EXPECT_NE(load_error().find("has id -3"), std::string::npos);
}

TEST_F(LoadErrorTest, DuplicateId) {
  write_valid();
  auto vocab = nlohmann::json::parse(vocab_json(small_vocab({"ab", "abc"})));
  vocab["abc"] = 256;
  dir_.write("vocab.json", vocab.dump());
  const std::string msg = load_error();
  EXPECT_NE(msg.find("id 256 is used by both"), std::string::npos) << msg;
}

TEST_F(LoadErrorTest, MissingByteToken) {
  write_valid();
  auto vocab = nlohmann::json::parse(vocab_json(small_vocab({"ab", "abc"})));
  vocab.erase(spell_byte(' '));
  dir_.write("vocab.json", vocab.dump());
  const std::string msg = load_error();
  EXPECT_NE(msg.find("no token for byte 0x20"), std::string::npos) << msg;
}

TEST_F(LoadErrorTest, TokenOutsideByteAlphabet) {
  write_valid();
  auto vocab = nlohmann::json::parse(vocab_json(small_vocab({"ab", "abc"})));
  vocab["中"] = 300;
  dir_.write("vocab.json", vocab.dump());
  const std::string msg = load_error();
  EXPECT_NE(msg.find("U+4E2D, which is not in GPT-2's byte-level alphabet"), std::string::npos)
      << msg;
}

TEST_F(LoadErrorTest, MergeLineNotTwoTokens) {
  write_valid();
  dir_.write("merges.txt", "#version: 0.2\na b\nab c d\n");
  std::string msg = load_error();
  EXPECT_NE(msg.find("merges.txt:3: expected two tokens"), std::string::npos) << msg;
  dir_.write("merges.txt", "a b\nabc\n");
  msg = load_error();
  EXPECT_NE(msg.find("merges.txt:2: expected two tokens"), std::string::npos) << msg;
  dir_.write("merges.txt", "a b\n\nab c\n");
  msg = load_error();
  EXPECT_NE(msg.find("merges.txt:2: expected two tokens"), std::string::npos) << msg;
}

TEST_F(LoadErrorTest, MergePartNotInVocab) {
  write_valid();
  dir_.write("merges.txt", "#version: 0.2\na b\nab zz\n");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("merges.txt:3: right part \"zz\" is not in the vocab"), std::string::npos)
      << msg;
}

TEST_F(LoadErrorTest, MergeResultNotInVocab) {
  write_valid();
  dir_.write("merges.txt", "#version: 0.2\na b\nb c\n");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("merges.txt:3: result \"bc\" of \"b\" + \"c\" is not in the vocab"),
            std::string::npos)
      << msg;
}

// ---- synthetic vocabularies ---------------------------------------------------------------------

Tokenizer make_tokenizer(const std::vector<std::string>& extra,
                         const std::vector<std::pair<std::string, std::string>>& merges_bytes) {
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& [l, r] : merges_bytes) merges.emplace_back(spell(l), spell(r));
  absl::StatusOr<Tokenizer> tok = Tokenizer::from_tables(small_vocab(extra), merges);
  LTM_ASSERT(tok.ok(), tok.status().message());
  return *std::move(tok);
}

TEST(SyntheticTest, MergesApplyByRank) {
  // "b c" ranks before "a b": "abc" becomes a + bc, not ab + c.
  const Tokenizer tok = make_tokenizer({"ab", "bc"}, {{"b", "c"}, {"a", "b"}});
  EXPECT_EQ(tok.encode("abc"), (Ids{'a', 257}));
  EXPECT_EQ(tok.encode("ab"), (Ids{256}));
  EXPECT_EQ(tok.encode("abab"), (Ids{256, 256}));
  EXPECT_EQ(tok.vocab_size(), 258);
}

TEST(SyntheticTest, RepeatedPairMergesLeftToRight) {
  const Tokenizer tok = make_tokenizer({"aa", "aaaa"}, {{"a", "a"}, {"aa", "aa"}});
  EXPECT_EQ(tok.encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(tok.encode("aaaa"), (Ids{257}));
  EXPECT_EQ(tok.encode("aaaaa"), (Ids{257, 'a'}));
  EXPECT_EQ(tok.encode("aaaaaa"), (Ids{257, 256}));
}

TEST(SyntheticTest, AllOccurrencesOfAPairMergeBeforeTheNextRank) {
  // The reference merges every "a b" before looking again, even though "ab a" ranks lower:
  // "abab" -> ab ab (merging one pair at a time would give aba b).
  const Tokenizer tok = make_tokenizer({"ab", "aba"}, {{"ab", "a"}, {"a", "b"}});
  EXPECT_EQ(tok.encode("abab"), (Ids{256, 256}));
  EXPECT_EQ(tok.encode("aba"), (Ids{257}));
}

TEST(SyntheticTest, PreTokenizationBoundaries) {
  // With no merges every byte is its own token: the ids show only that encode covers all bytes;
  // boundaries show through merges across them, which must never happen.
  const Tokenizer tok = make_tokenizer({" a", "a "}, {{" ", "a"}, {"a", " "}});
  EXPECT_EQ(tok.encode("a a"), (Ids{'a', 256}));         // " a" is one pre-token
  EXPECT_EQ(tok.encode("a  a"), (Ids{'a', ' ', 256}));   // "a", " ", " a"
  EXPECT_EQ(tok.encode("a \n"), (Ids{'a', ' ', '\n'}));  // "a", " \n" (space run at the end)
  EXPECT_EQ(tok.encode("\xFF a"), (Ids{255, 256}));  // an invalid byte is a pre-token of its own
}

TEST(SyntheticTest, SpecialTokenLookup) {
  std::vector<std::pair<std::string, int32_t>> vocab = small_vocab({});
  vocab.emplace_back("<|endoftext|>", 300);  // leaves a gap 256..299
  absl::StatusOr<Tokenizer> tok = Tokenizer::from_tables(vocab, {});
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), 301);
  EXPECT_EQ(tok->token_id("<|endoftext|>"), 300);
  EXPECT_FALSE(tok->valid_id(299));
  EXPECT_TRUE(tok->valid_id(300));
  EXPECT_EQ(tok->token_bytes(300), "<|endoftext|>");
}

// A model samples ids below its checkpoint's vocab_size, which may be larger than vocab.json's
// (a padded vocab) or fall in a gap of its ids: the streaming decoder gives U+FFFD for such an id
// (after what it held back) instead of aborting the process, as it did before.
TEST(SyntheticTest, StreamingDecodesIdsOutsideTheVocabAsReplacement) {
  std::vector<std::pair<std::string, int32_t>> vocab = small_vocab({});
  vocab.emplace_back("<|endoftext|>", 300);  // ids 256..299 are a gap
  absl::StatusOr<Tokenizer> tok = Tokenizer::from_tables(vocab, {});
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  StreamingDecoder dec(*tok);
  EXPECT_EQ(dec.push('a'), "a");
  EXPECT_EQ(dec.push(299), "\xEF\xBF\xBD");   // the gap
  EXPECT_EQ(dec.push(0xE2), "");               // the first byte of a 3-byte character, held back
  EXPECT_EQ(dec.push(301), "\xEF\xBF\xBD\xEF\xBF\xBD");  // past the vocab: held byte, then the id
  EXPECT_EQ(dec.push(-1), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.push('b'), "b");
  EXPECT_EQ(dec.flush(), "");
}

TEST(SyntheticTest, MergeErrorsNameTheMerge) {
  absl::StatusOr<Tokenizer> tok =
      Tokenizer::from_tables(small_vocab({}), {{"a", "b"}}, "test-vocab");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().message(),
            "test-vocab: merge #0: result \"ab\" of \"a\" + \"b\" is not in the vocab");
}

// ---- UTF-8 validation ---------------------------------------------------------------------------

TEST(Utf8Test, Validation) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("é中😀\xF4\x8F\xBF\xBF"));  // U+10FFFF is the last valid one
  EXPECT_TRUE(is_valid_utf8(std::string("a\0b", 3)));
  EXPECT_FALSE(is_valid_utf8("\x80"));              // stray continuation
  EXPECT_FALSE(is_valid_utf8("\xC3"));              // truncated
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(is_valid_utf8("\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xFE"));
  EXPECT_FALSE(is_valid_utf8("ok\xE2\x82"));
}

}  // namespace
}  // namespace ltm
