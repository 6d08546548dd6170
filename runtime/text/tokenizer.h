// Byte-pair-encoding tokenizers of Hugging Face model folders, from either of two formats:
//   - vocab.json + merges.txt: GPT-2's byte-level BPE (the encoder of OpenAI's GPT-2, as HF's
//     GPT2Tokenizer): OpenAI's pre-tokenizer regex (a hand-written scanner over code points with
//     Unicode classes from unicode_tables.h), then each pre-token's bytes -> BPE merges by rank.
//   - tokenizer.json (HF tokenizers' format; tokenizer_json.cpp reads it): model BPE with either
//     ByteLevel pre-tokenization (GPT-2, Llama 3, Qwen2: a Sequence of Split with the file's own
//     regex, matched by PCRE2, then ByteLevel) or SentencePiece-style pieces (Llama 2, Mistral:
//     a Metaspace pre-tokenizer or Prepend+Replace normalizers, byte_fallback <0xNN> tokens).
//     Added tokens (special or not) are matched in the text before the normalizer and the model
//     run; the post-processor's bos/eos (or tokenizer_config.json's add_bos_token/add_eos_token)
//     are added by encode_prompt(). Anything the file asks for that is not implemented is refused
//     at load, naming the field.
// A folder with both formats is read from tokenizer.json, as transformers does.
//
// encode(): text -> added tokens split out -> normalizer -> pre-tokens -> each pre-token's units
// (bytes for byte-level BPE, code points for SentencePiece-style) -> BPE merges by rank -> ids.
// decode(): token ids -> concatenated token bytes (each token's text as the file's decoder
// makes it: byte-level spelling undone, "\u2581" -> " ", <0xNN> -> that byte), then the decoder's
// strip of the leading space the encoder prepended.
//
// Ownership and threading: a Tokenizer is an immutable value after load(); it owns its tables
// (several MB for GPT-2) and may be shared read-only by any number of threads. Copying it copies
// the tables; move it or hold it by const reference/shared_ptr instead.
//
// Failures: load() returns an absl::Status that names the file and what is wrong with it. encode()
// accepts any bytes (invalid UTF-8 included) and never fails. decode() and token_bytes() require
// valid_id(id); an invalid id is a caller bug and aborts (LTM_ASSERT), so ids that come from
// outside (requests) must be checked with valid_id() first. StreamingDecoder::push() takes any id
// (the model's samples range over the checkpoint's vocab_size, which may exceed vocab.json's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace ltm {

struct TokenizerPipeline;

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json when the folder has one (see from_tokenizer_json), else
  // `dir`/vocab.json and `dir`/merges.txt (the files of an HF GPT-2 folder); then
  // `dir`/tokenizer_config.json, when present, for add_bos_token/add_eos_token (with its
  // bos_token/eos_token), which replace the tokens the post-processor adds. For vocab.json:
  // checks that
  // vocab.json maps token strings to distinct non-negative ids, that every token is spelled in
  // the byte-level alphabet, that all 256 single-byte tokens exist, and that every merges.txt line
  // (after an optional "#version" header) is two tokens of the vocab whose concatenation is too.
  static absl::StatusOr<Tokenizer> load(const std::string& dir);

  // Whether `dir` holds a tokenizer that load() reads (tokenizer.json or vocab.json).
  static bool folder_has_tokenizer(const std::string& dir);

  // Builds a tokenizer from the text of a tokenizer.json file; `source` names it in messages.
  // Errors name the field: "tokenizer.json: pre_tokenizer.pretokenizers[1].type: \"Digits\" is
  // not supported (...)". Loads any size the caller read; ids must be below 2^24.
  static absl::StatusOr<Tokenizer> from_tokenizer_json(std::string_view json_text,
                                                       const std::string& source);

  // Builds a tokenizer from tables already in memory (for tests and tools): `vocab` maps
  // vocab.json token strings (byte-level alphabet) to ids; `merges` lists the merge pairs in rank
  // order. Same checks as load(); `source` names the origin in error messages.
  static absl::StatusOr<Tokenizer> from_tables(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges,
      const std::string& source = "<memory>");

  // Token ids of `utf8`. Any bytes are accepted: an invalid UTF-8 byte is treated as one code
  // point of class "other" and encoded through its byte token, so decode(encode(s)) == s always.
  // Thread-safe (const, no shared mutable state; per-thread scratch buffers). About 10 MB/s on
  // one core; a single pre-token (a run of letters, say) must be under 2 GiB.
  // tokenizer.json: added tokens in the text become their ids (as HF's encode does, special
  // ones included); no bos/eos is added (encode_prompt() adds them).
  std::vector<int32_t> encode(std::string_view utf8) const { return encode(utf8, true); }
  // `at_text_start` false: the text continues an earlier one (the part of a rendered chat prompt
  // after a special token), for a Metaspace prepend_scheme "first" that marks only the start.
  std::vector<int32_t> encode(std::string_view utf8, bool at_text_start) const;
  // encode() with what the tokenizer adds to a prompt: the post-processor's tokens (Llama's
  // <s>, <|begin_of_text|>), or tokenizer_config.json's add_bos_token/add_eos_token. Same as
  // encode() for GPT-2 (nothing to add).
  std::vector<int32_t> encode_prompt(std::string_view utf8) const;

  // Concatenated bytes of the tokens (the decoder's leading-space strip applied); the inverse of
  // encode() for byte-level BPE, and for SentencePiece-style vocabularies whenever every code
  // point has a token or a byte fallback (an unknown one becomes the unk token). The result may
  // be invalid UTF-8 for arbitrary id sequences (use StreamingDecoder for text for clients).
  std::string decode(std::span<const int32_t> ids) const;

  // Raw bytes of one token (e.g. " the" for 262; "\u2581the" decodes to " the" too). No
  // leading-space strip: a generated token continues text. Requires valid_id(id).
  std::string token_bytes(int32_t id) const;

  // One past the largest id in vocab.json or tokenizer.json (model vocab and added tokens).
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_bytes_.size()); }

  // Id of a token given as spelled in the vocab (byte-level alphabet: "Ġthe" for " the"); for
  // special tokens such as "<|endoftext|>" (-> 50256) the spelling is the text itself, as for
  // tokenizer.json's added tokens.
  std::optional<int32_t> token_id(std::string_view token_text) const;

  // Whether `id` names a token of the vocab (0 <= id < vocab_size() and not a gap in the ids).
  bool valid_id(int32_t id) const {
    return id >= 0 && id < vocab_size() && id_present_[static_cast<size_t>(id)];
  }

 private:
  struct Merge {
    int32_t rank;    // line index in merges.txt: lower merges first
    int32_t result;  // id of the merged token
  };

  friend struct TokenizerJsonReader;  // tokenizer_json.cpp fills the tables

  Tokenizer() = default;
  // from_tables() with a namer for merge number `rank` in messages (load() names file:line).
  // `byte_level`: spellings are in GPT-2's byte-level alphabet and all 256 bytes have a token;
  // else a spelling is the token's text (any valid UTF-8), which the caller may rewrite.
  static absl::StatusOr<Tokenizer> build(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, const std::string& source,
      const std::function<std::string(size_t rank)>& merge_location, bool byte_level);
  static absl::StatusOr<Tokenizer> load_vocab_merges(const std::string& dir);
  // Appends the BPE token ids of one pre-token (its raw bytes) to `out`.
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  // Merges the symbols in `syms` (token ids) by rank and appends the result to `out`.
  void bpe_symbols(std::span<const int32_t> syms, std::vector<int32_t>& out) const;
  // tokenizer.json: one piece of text between added tokens (already normalized or not).
  void encode_with_pipeline(std::string_view text, bool at_start,
                            std::vector<int32_t>& out) const;
  void encode_segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_pre_token(std::string_view piece, std::vector<int32_t>& out) const;
  absl::Status read_tokenizer_config(const std::string& dir);
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::vector<std::string> id_to_bytes_;                  // [vocab_size] raw bytes of each token
  std::vector<bool> id_present_;                          // [vocab_size] false for gaps in the ids
  absl::flat_hash_map<std::string, int32_t> text_to_id_;  // vocab.json spelling -> id
  int32_t byte_to_id_[256] = {};                          // id of each single-byte token
  absl::flat_hash_map<uint64_t, Merge> merges_;           // (left id << 32 | right id) -> merge
  // tokenizer.json only (null for vocab.json): normalizer, pre-tokenizer, added tokens, model
  // options, decoder and post-processor (tokenizer_pipeline.h). Immutable, shared by copies.
  std::shared_ptr<const TokenizerPipeline> pipeline_;
  std::vector<int32_t> prompt_prefix_, prompt_suffix_;  // what encode_prompt() adds
  size_t decode_strip_start_ = 0;  // leading spaces decode() removes (the decoder's Strip)
  size_t decode_strip_stop_ = 0;   // trailing ones
};

// Turns a stream of token ids into client text one id at a time. push() returns the text that is
// complete so far: a UTF-8 sequence split across tokens is held back (at most 3 bytes) until the
// token that completes it arrives. Invalid UTF-8 is replaced by U+FFFD (one per maximal invalid
// subsequence, as Python's and WHATWG's decoders do), so everything returned is valid UTF-8 and
// all push() outputs + flush() == decode(all ids) whenever decode(all ids) is valid UTF-8.
// One decoder per sequence; not thread-safe; it references the tokenizer, which must outlive it.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  // Any id: one that is not tokenizer.valid_id(id) (no token in vocab.json) comes out as U+FFFD,
  // after what was held back (also U+FFFD, as flush()).
  std::string push(int32_t id);
  // Returns what is held back (as U+FFFD: it can only be an incomplete sequence) and resets.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence at the end of the stream so far
};

// Strict UTF-8 check (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace ltm
