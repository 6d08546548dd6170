// Turns a public-API GenerateRequest (proto ltm.v1) into the engine's GenerationRequest, or
// explains why it cannot be served.
//
// Every check the engine relies on happens here, before the request is queued (docs/architecture.md,
// "Serving"): a request that passes is well-formed for the engine; one that fails returns
// InvalidArgument whose message starts with the field's name ("top_p must be in (0, 1], got 0"),
// and nothing else is disturbed. Defaults of unset fields are those documented in ltm.proto.
//
// Pure functions of their arguments (apart from drawing a random seed when none is given):
// thread-safe, no gRPC server needed.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ltm/v1/ltm.pb.h"
#include "runtime/sched/request.h"
#include "runtime/text/tokenizer.h"

namespace ltm {

inline constexpr int32_t kDefaultMaxNewTokens = 16;
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 1024;      // per stop string
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr size_t kMaxAdapterFieldBytes = 128;  // GenerateRequest.adapter

// What a request is checked against.
struct RequestLimits {
  int64_t context_length = 0;  // prompt tokens + max_new_tokens must not exceed it
  int64_t vocab_size = 0;      // the model's; ids must also be valid_id() of the tokenizer
  // Prompt text longer than this is refused before it is tokenised (0: no limit). The server sets
  // (context_length - 1) x the longest token's bytes: a longer prompt cannot fit the context.
  int64_t max_prompt_bytes = 0;
};

// Validates `proto` and builds the engine's request: tokenizes `prompt` (or checks
// `prompt_token_ids`), applies defaults, copies request_id, stop strings and flags. The deadline
// and cancel flag are left at their defaults for the caller (the RPC) to set. An unset seed is
// drawn at random. Errors: InvalidArgument naming the field.
absl::StatusOr<GenerationRequest> make_generation_request(const v1::GenerateRequest& proto,
                                                          const Tokenizer& tokenizer,
                                                          const RequestLimits& limits);

// Checks that every id is in the vocabulary (tokenizer.valid_id and < vocab_size). `field` names
// the ids in the error: "prompt_token_ids[3] = 70000 is not in the vocabulary (size 50257)".
absl::Status check_token_ids(const google::protobuf::RepeatedField<int32_t>& ids,
                             const Tokenizer& tokenizer, int64_t vocab_size,
                             const char* field);

}  // namespace ltm
