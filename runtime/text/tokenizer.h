// GPT-2 byte-level BPE tokenizer (the encoder of OpenAI's GPT-2, as HF's GPT2Tokenizer).
//
// encode(): text bytes -> pre-tokens (OpenAI's regex, implemented as a hand-written scanner over
// code points with Unicode classes from unicode_tables.h) -> each pre-token's bytes -> BPE merges
// by rank -> token ids. decode(): token ids -> concatenated token bytes.
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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace ltm {

class Tokenizer {
 public:
  // Loads `dir`/vocab.json and `dir`/merges.txt (the files of an HF GPT-2 folder). Checks that
  // vocab.json maps token strings to distinct non-negative ids, that every token is spelled in
  // the byte-level alphabet, that all 256 single-byte tokens exist, and that every merges.txt line
  // (after an optional "#version" header) is two tokens of the vocab whose concatenation is too.
  static absl::StatusOr<Tokenizer> load(const std::string& dir);

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
  std::vector<int32_t> encode(std::string_view utf8) const;

  // Concatenated bytes of the tokens; the exact inverse of encode(). The result may be invalid
  // UTF-8 for arbitrary id sequences (use StreamingDecoder for text meant for clients).
  std::string decode(std::span<const int32_t> ids) const;

  // Raw bytes of one token (e.g. " the" for 262). Requires valid_id(id).
  std::string token_bytes(int32_t id) const;

  // One past the largest id in vocab.json (50257 for GPT-2).
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_bytes_.size()); }

  // Id of a token given as spelled in vocab.json (byte-level alphabet: "Ġthe" for " the"); for
  // special tokens such as "<|endoftext|>" (-> 50256) the spelling is the text itself.
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

  Tokenizer() = default;
  // from_tables() with a namer for merge number `rank` in messages (load() names file:line).
  static absl::StatusOr<Tokenizer> build(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, const std::string& source,
      const std::function<std::string(size_t rank)>& merge_location);
  // Appends the BPE token ids of one pre-token (its raw bytes) to `out`.
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::vector<std::string> id_to_bytes_;                  // [vocab_size] raw bytes of each token
  std::vector<bool> id_present_;                          // [vocab_size] false for gaps in the ids
  absl::flat_hash_map<std::string, int32_t> text_to_id_;  // vocab.json spelling -> id
  int32_t byte_to_id_[256] = {};                          // id of each single-byte token
  absl::flat_hash_map<uint64_t, Merge> merges_;           // (left id << 32 | right id) -> merge
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
