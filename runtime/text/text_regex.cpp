#include "runtime/text/text_regex.h"

#include "absl/strings/str_cat.h"
#include "common/check.h"

#if LTM_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace ltm {

absl::StatusOr<std::shared_ptr<const TextRegex>> TextRegex::compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_offset,
                    nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("the regex does not compile (PCRE2: ",
                                                   reinterpret_cast<const char*>(message),
                                                   ", at offset ", error_offset, ")"));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // no JIT (an error here): the interpreter runs
  std::shared_ptr<TextRegex> re(new TextRegex());
  re->code_ = code;
  return std::shared_ptr<const TextRegex>(std::move(re));
}

TextRegex::~TextRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void TextRegex::find_all(std::string_view text,
                         std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  LTM_ASSERT(md != nullptr, "PCRE2: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), start, 0, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a limit: the rest has no match
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t first = ov[0], last = ov[1];
    out.emplace_back(first, last);
    if (last > first) {
      start = last;
      continue;
    }
    // An empty match: go on after the next character (the whole UTF-8 sequence).
    if (first >= text.size()) break;
    size_t next = first + 1;
    while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
    start = next;
  }
  pcre2_match_data_free(md);
}

}  // namespace ltm

#else  // a build without PCRE2 (the GPU-only build): no regex compiles

namespace ltm {

absl::StatusOr<std::shared_ptr<const TextRegex>> TextRegex::compile(std::string_view) {
  return absl::UnimplementedError(
      "this build has no PCRE2 (the GPU-only build), so it cannot match the file's regexes");
}

TextRegex::~TextRegex() = default;

void TextRegex::find_all(std::string_view, std::vector<std::pair<size_t, size_t>>&) const {}

}  // namespace ltm

#endif
