// A regular expression of a tokenizer.json file (a `Split` pre-tokenizer's or a `Replace`
// normalizer's pattern), matched with PCRE2 (Debian's libpcre2-8) in UTF mode with Unicode
// properties for \d \s \w and POSIX classes (UCP), as Hugging Face tokenizers' Oniguruma does.
// Text that is not valid UTF-8 is accepted (PCRE2_MATCH_INVALID_UTF): an invalid byte matches
// nothing, so it stays between matches.
//
// Immutable after compile(); find_all() is const and thread-safe (match data per call). Compiled
// with PCRE2's JIT when it is available, with the interpreter otherwise.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ltm {

class TextRegex {
 public:
  // InvalidArgument with PCRE2's message and the offset in the pattern when it does not compile.
  static absl::StatusOr<std::shared_ptr<const TextRegex>> compile(std::string_view pattern);
  ~TextRegex();
  TextRegex(const TextRegex&) = delete;
  TextRegex& operator=(const TextRegex&) = delete;

  // Byte ranges [first, second) of the successive non-overlapping matches in `text`, left to
  // right (appended to `out`). An empty match is kept and the search goes on one character
  // after it.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  TextRegex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace ltm
