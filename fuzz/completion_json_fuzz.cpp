// The HTTP front door's request parsing (runtime/serve/openai_api.h), as the server runs it on a
// POST /v1/completions body: parse_completion with the real GPT-2 tokenizer. Whatever the bytes,
// the answer is a 4xx error object naming what is wrong, or a request within the limits; and the
// error object is valid JSON. And the bounded parse under it (common/json_parse.h) agrees with
// nlohmann's own: it accepts what nlohmann accepts, with the same value, except for nesting past
// kMaxJsonDepth and duplicate keys, and its messages stay short.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "common/json_parse.h"
#include "fuzz/fuzz_tokenizer.h"
#include "runtime/serve/openai_api.h"
#include "runtime/text/tokenizer.h"

namespace {
constexpr int64_t kContext = 256;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ltm::Tokenizer& tok = ltm::fuzz::gpt2_tokenizer();
  ltm::CompletionContext ctx;
  ctx.tokenizer = &tok;
  ctx.limits.context_length = kContext;
  ctx.limits.vocab_size = tok.vocab_size();
  ctx.limits.max_prompt_bytes = (kContext - 1) * 128;
  ctx.model_name = "gpt2";
  ltm::ParsedCompletion out;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  {
    absl::StatusOr<nlohmann::json> bounded = ltm::parse_json(body);
    const nlohmann::json plain = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (bounded.ok() && (plain.is_discarded() || *bounded != plain)) std::abort();
    if (!bounded.ok()) {
      const std::string m(bounded.status().message());
      if (m.empty() || m.size() > 600) std::abort();
      const bool ours = m.find("nests deeper than") != std::string::npos ||
                        m.find("duplicate key") != std::string::npos;
      if (!plain.is_discarded() && !ours) std::abort();
    }
  }
  if (std::optional<ltm::ApiError> e = ltm::parse_completion(body, ctx, &out)) {
    if (e->http_status != 400 || e->message.empty()) std::abort();
    if (!nlohmann::json::accept(ltm::error_json(*e))) std::abort();
    return 0;
  }
  const ltm::GenerationRequest& r = out.request;
  const int64_t n = static_cast<int64_t>(r.prompt_ids.size());
  if (n < 1 || r.max_new_tokens < 1 || n + r.max_new_tokens > kContext) std::abort();
  for (int32_t id : r.prompt_ids)
    if (!tok.valid_id(id)) std::abort();
  if (out.params.logprobs > ltm::kMaxLogprobs || r.stop.size() > ltm::kMaxStopStrings) std::abort();
  return 0;
}
