// tokenizer.json reading (Tokenizer::from_tokenizer_json) on arbitrary files, then the tokenizer
// it gives on arbitrary text. The input is FILE, a NUL byte, TEXT (no NUL: all of it is FILE,
// TEXT empty). A file is refused with a message or loads; a loaded one must give valid ids for
// any TEXT, with and without the prompt's tokens, decode them, and stream them as valid UTF-8.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view file = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  absl::StatusOr<ltm::Tokenizer> tok = ltm::Tokenizer::from_tokenizer_json(file, "fuzz.json");
  if (!tok.ok()) {
    if (tok.status().message().empty()) std::abort();
    return 0;
  }
  for (const bool prompt : {false, true}) {
    const std::vector<int32_t> ids = prompt ? tok->encode_prompt(text) : tok->encode(text);
    for (const int32_t id : ids)
      if (!tok->valid_id(id)) std::abort();
    (void)tok->decode(ids);
    ltm::StreamingDecoder decoder(*tok);
    for (const int32_t id : ids)
      if (!ltm::is_valid_utf8(decoder.push(id))) std::abort();
    if (!ltm::is_valid_utf8(decoder.flush())) std::abort();
  }
  (void)tok->encode(text, /*at_text_start=*/false);
  return 0;
}
