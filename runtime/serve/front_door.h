// What the two front doors (gRPC, runtime/serve/grpc_server.h; HTTP, runtime/serve/http_server.h)
// share: the limits a request is validated against, derived once from the model and tokenizer,
// and request ids that differ across restarts.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "runtime/sched/engine_info.h"
#include "runtime/serve/request_validation.h"
#include "runtime/text/tokenizer.h"

namespace ltm {

struct FrontDoorLimits {
  RequestLimits limits;         // context, vocabulary, prompt bytes (make_generation_request)
  int64_t max_token_bytes = 1;  // the tokenizer's longest token
  int64_t max_prompt_tokens = 0;  // context - 1
};

// A prompt of more bytes than (context - 1) x the longest token cannot fit the context, so it is
// refused before it is tokenised; ids likewise by count. Requires info.max_context() > 0.
FrontDoorLimits front_door_limits(const EngineInfo& info, const Tokenizer& tokenizer);

// "<prefix>-<n>" with a random prefix ("ltm-1a2b3c4d"), n counting from 1. Thread-safe.
class RequestIds {
 public:
  explicit RequestIds(const std::string& kind = "ltm");
  std::string next();
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  std::atomic<uint64_t> next_{1};
};

}  // namespace ltm
