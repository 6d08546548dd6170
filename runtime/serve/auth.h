// Access control of the gRPC front end: a bearer token (--api-key-file) checked on every call
// except the health service, compared in constant time.
//
// A client sends the metadata "authorization: Bearer <token>". check_bearer() answers OK when it
// matches, Unauthenticated otherwise (missing header, another scheme, wrong token), with a message
// that never quotes what was sent. The comparison's time depends only on the lengths, never on
// where the first differing byte is.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ltm {

// a == b in time that depends only on a.size() and b.size().
bool constant_time_equal(std::string_view a, std::string_view b);

// `header` is the value of the "authorization" metadata, or nullptr when there is none.
absl::Status check_bearer(const std::string_view* header, std::string_view api_key);

// Reads a token file: its contents without a trailing newline (\n or \r\n) and without
// surrounding spaces. InvalidArgument (naming the file) when it cannot be read, is empty, is
// longer than 4096 bytes or holds characters that cannot go in a header (control bytes).
absl::StatusOr<std::string> read_api_key_file(const std::string& path);

}  // namespace ltm
