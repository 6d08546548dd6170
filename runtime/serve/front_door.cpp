#include "runtime/serve/front_door.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ltm {

FrontDoorLimits front_door_limits(const EngineInfo& info, const Tokenizer& tokenizer) {
  FrontDoorLimits out;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.valid_id(id))
      out.max_token_bytes = std::max<int64_t>(out.max_token_bytes, tokenizer.token_bytes(id).size());
  out.max_prompt_tokens = info.max_context() - 1;
  out.limits.context_length = info.max_context();
  out.limits.vocab_size = info.model.vocab_size;
  out.limits.max_prompt_bytes = out.max_prompt_tokens * out.max_token_bytes;
  return out;
}

RequestIds::RequestIds(const std::string& kind) {
  std::random_device rd;
  prefix_ = absl::StrFormat("%s-%08x", kind, rd());
}

std::string RequestIds::next() {
  return absl::StrCat(prefix_, "-", next_.fetch_add(1, std::memory_order_relaxed));
}

}  // namespace ltm
