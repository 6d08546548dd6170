#include "runtime/serve/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ltm {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited whatever the contents; a length difference is
  // folded into the same accumulator.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  unsigned char acc = 0;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    acc |= static_cast<unsigned char>(x ^ y);
  }
  diff = static_cast<unsigned char>(diff | acc);
  return diff == 0;
}

absl::Status check_bearer(const std::string_view* header, std::string_view api_key) {
  if (header == nullptr)
    return absl::UnauthenticatedError(
        "this server needs an API key: send the metadata \"authorization: Bearer <key>\"");
  constexpr std::string_view kScheme = "Bearer ";
  std::string_view h = *header;
  if (h.size() < kScheme.size() || !constant_time_equal(h.substr(0, kScheme.size()), kScheme))
    return absl::UnauthenticatedError("the authorization metadata must be \"Bearer <key>\"");
  h.remove_prefix(kScheme.size());
  if (!constant_time_equal(h, api_key)) return absl::UnauthenticatedError("the API key is not valid");
  return absl::OkStatus();
}

absl::StatusOr<std::string> read_api_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--api-key-file ", path, ": cannot be read"));
  std::string key;
  char buf[4097];
  in.read(buf, sizeof(buf));
  key.assign(buf, static_cast<size_t>(in.gcount()));
  if (key.size() > 4096)
    return absl::InvalidArgumentError(
        absl::StrCat("--api-key-file ", path, ": longer than 4096 bytes; is it the right file?"));
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' ||
                          key.back() == '\t'))
    key.pop_back();
  size_t start = 0;
  while (start < key.size() && (key[start] == ' ' || key[start] == '\t')) ++start;
  key.erase(0, start);
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("--api-key-file ", path, ": is empty"));
  for (unsigned char c : key)
    if (c < 0x20 || c == 0x7f)
      return absl::InvalidArgumentError(absl::StrCat(
          "--api-key-file ", path, ": holds a control character (the key goes in a header)"));
  return key;
}

}  // namespace ltm
