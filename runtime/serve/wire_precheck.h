// A check of a request's raw protobuf bytes before anything is parsed, tokenised or copied.
//
// The typed parse of a message allocates per element: a 4 MiB GenerateRequest of 1.4 M one-byte
// `stop` entries costs about 185 MB of heap before the request's own limits (16 stop strings)
// could be checked. precheck_message walks the wire format in place instead (no allocation per
// field): it counts the elements of every repeated field, measures every length-delimited field,
// checks string fields for UTF-8, and refuses a field over its limit with InvalidArgument naming
// it ("stop has 1400000 strings; at most 16 are allowed"). Only a message that passes is handed to
// the typed parse, whose memory is then bounded by the limits.
//
// The message's descriptor gives field names, types and whether a field is repeated, so one
// scanner serves every request message. Unknown fields are skipped (proto3 keeps them; they are
// counted against `max_unknown_fields`), and so are known fields sent with a wire type their type
// does not take (a float as a varint, a string as fixed32): protobuf keeps those as unknown
// fields too, so a request of a million of them is refused at the 65th. Groups (wire types 3 and 4) and malformed varints or
// lengths are refused as a message that does not parse.
//
// Pure function of its arguments; thread-safe; fuzzed by fuzz/request_precheck_fuzz.cpp.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace google::protobuf {
class Descriptor;
}

namespace ltm {

struct FieldLimit {
  int number = 0;             // field number
  int64_t max_count = -1;     // elements of a repeated field (packed ones counted per value); -1: no limit
  int64_t max_bytes = -1;     // bytes of one length-delimited element; -1: no limit
  // How the count is phrased: "stop has N strings" / "prompt_token_ids has N ids".
  const char* unit = "elements";
};

struct PrecheckLimits {
  std::vector<FieldLimit> fields;
  int64_t max_unknown_fields = 64;
};

absl::Status precheck_message(std::string_view bytes, const google::protobuf::Descriptor& descriptor,
                              const PrecheckLimits& limits);

}  // namespace ltm
