// Helpers for tests that build a small tokenizer in memory (Tokenizer::from_tables).
#pragma once

#include <string>

namespace ltm::testing_vocab {

// GPT-2's bytes_to_unicode spelling of byte `b`, UTF-8 encoded: printable Latin-1 bytes stand for
// themselves, the others map to U+0100 onwards in byte order. Written from GPT-2's definition,
// independently of runtime/text/tokenizer.cpp.
inline std::string byte_spelling(int b) {
  auto printable = [](int x) {
    return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
  };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += printable(x) ? 0 : 1;
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

}  // namespace ltm::testing_vocab
