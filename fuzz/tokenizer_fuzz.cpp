// The GPT-2 tokenizer (runtime/text/tokenizer.h) with the real vocabulary on arbitrary input:
//   - encode(bytes) gives valid ids and decode(encode(bytes)) == bytes, for any bytes;
//   - the same input read as ids (valid ones kept): the streaming decoder's pieces are valid UTF-8
//     and, when decode(ids) is valid UTF-8, add up to it.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_tokenizer.h"
#include "runtime/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ltm::Tokenizer& tok = ltm::fuzz::gpt2_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok.encode(text);
  for (int32_t id : ids)
    if (!tok.valid_id(id)) std::abort();
  if (tok.decode(ids) != text) std::abort();

  std::vector<int32_t> raw;
  for (size_t i = 0; i + 2 <= size; i += 2) {
    const int32_t id = static_cast<int32_t>(data[i] | (data[i + 1] << 8)) % tok.vocab_size();
    if (tok.valid_id(id)) raw.push_back(id);
  }
  ltm::StreamingDecoder decoder(tok);
  std::string streamed;
  for (int32_t id : raw) {
    const std::string piece = decoder.push(id);
    if (!ltm::is_valid_utf8(piece)) std::abort();
    streamed += piece;
  }
  const std::string tail = decoder.flush();
  if (!ltm::is_valid_utf8(tail)) std::abort();
  streamed += tail;
  const std::string whole = tok.decode(raw);
  if (ltm::is_valid_utf8(whole) && streamed != whole) std::abort();
  return 0;
}
