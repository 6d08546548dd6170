// What a tokenizer.json file adds to a BPE vocabulary (internal to runtime/text): the added
// tokens, the normalizer and pre-tokenizer steps, the model's options. Filled by
// tokenizer_json.cpp, run by Tokenizer::encode (tokenizer.cpp). Immutable once built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/text/text_regex.h"

namespace ltm {

struct TokenizerPipeline;

// Helpers shared by tokenizer.cpp, tokenizer_pipeline.cpp and tokenizer_json.cpp.
namespace text_detail {
inline constexpr int32_t kMaxId = 1 << 24;  // ids are rows of the embedding; bigger: a broken file
absl::StatusOr<std::string> read_file(const std::string& path);
// `s` in quotes for an error message, cut after about 60 bytes (at a UTF-8 boundary).
std::string quote_for_message(std::string_view s);
// Raw bytes of a byte-level spelling ("\u0120the" -> " the"); fails outside the alphabet.
absl::StatusOr<std::string> spelling_to_bytes(std::string_view text);
bool is_space(char32_t cp);  // the White_Space property
// The code point at s[i] (its length in *len); 0xFFFFFFFF with *len 1 for an invalid byte.
char32_t code_point_at(std::string_view s, size_t i, size_t* len);
size_t utf8_length(std::string_view s, size_t i);  // of the sequence at s[i]; 1 if invalid
// Byte ranges of GPT-2's pre-tokens of `text` (the hand-written scanner of OpenAI's regex).
void gpt2_pre_tokens(std::string_view text, std::vector<std::pair<size_t, size_t>>& out);
// `text` through the pipeline's normalizer steps.
std::string normalize(const TokenizerPipeline& p, std::string_view text);
}  // namespace text_detail

// A text matched whole before the model runs (tokenizer.json's added_tokens).
struct AddedTokenSpec {
  std::string content;
  int32_t id = 0;
  bool lstrip = false;      // the match takes the whitespace before it
  bool rstrip = false;      // and after it
  bool normalized = false;  // matched in the normalized text (else in the raw text)
};

// One normalizer step (a Sequence is flattened).
struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kUnicode };
  Kind kind = Kind::kPrepend;
  const void* unicode_form = nullptr;     // kUnicode: the icu::Normalizer2 (NFC, NFD, NFKC, NFKD)
  std::string text;                       // kPrepend: the prefix; kReplace: a literal pattern
  std::shared_ptr<const TextRegex> regex;  // kReplace with a Regex pattern (else literal)
  std::string content;                    // kReplace: the replacement
};

// How a Split keeps the delimiters it finds (HF's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer step (a Sequence is flattened).
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  Kind kind = Kind::kSplit;
  // kSplit: a regex or a literal (`literal`) pattern.
  std::shared_ptr<const TextRegex> regex;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kByteLevel: GPT-2's regex (the hand-written scanner) when use_regex; a " " prefix.
  bool add_prefix_space = false;
  bool use_regex = true;
  // kMetaspace: " " -> replacement; replacement prefix (always, or only at the text's start);
  // split before each replacement.
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever };
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};

struct TokenizerPipeline {
  std::vector<AddedTokenSpec> added;  // longest content first
  // Indices into `added` by the first byte of their content, longest first: those matched in the
  // raw text ([0]) and those matched in the normalized text ([1]).
  std::vector<uint32_t> added_by_byte[2][256];
  bool any_added[2] = {false, false};
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  // The model: BPE over bytes (byte-level vocabularies: keys are raw bytes) or over code points
  // (SentencePiece-style: keys are the vocab's own spellings).
  bool byte_units = true;
  bool ignore_merges = false;  // a pre-token that is one token of the vocab is not merged
  bool byte_fallback = false;  // a code point without a token: its bytes' <0xNN> tokens
  bool fuse_unk = false;
  int32_t unk_id = -1;               // -1: none (an unknown code point is dropped, as HF does)
  int32_t byte_fallback_id[256];     // id of <0xNN>, -1 where absent
  absl::flat_hash_map<std::string, int32_t> key_to_id;  // model key (raw bytes or spelling) -> id
};

}  // namespace ltm
