#include "runtime/serve/request_validation.h"

#include <cmath>
#include <random>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"

namespace ltm {
namespace {

absl::Status invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

absl::Status check_sampling(const v1::GenerateRequest& p) {
  if (p.has_temperature()) {
    const float t = p.temperature();
    if (!(t >= 0) || !std::isfinite(t))
      return invalid(absl::StrFormat("temperature must be >= 0 (0 = greedy), got %g", t));
  }
  if (p.has_top_k() && p.top_k() < 0)
    return invalid(absl::StrCat("top_k must be >= 0 (0 = off), got ", p.top_k()));
  if (p.has_top_p()) {
    const float v = p.top_p();
    if (!(v > 0 && v <= 1)) return invalid(absl::StrFormat("top_p must be in (0, 1], got %g", v));
  }
  if (p.has_repetition_penalty()) {
    const float r = p.repetition_penalty();
    if (!(r > 0) || !std::isfinite(r))
      return invalid(absl::StrFormat("repetition_penalty must be > 0 (1 = off), got %g", r));
  }
  return absl::OkStatus();
}

absl::Status check_stop(const v1::GenerateRequest& p) {
  if (p.stop_size() > kMaxStopStrings)
    return invalid(absl::StrCat("stop has ", p.stop_size(), " strings; at most ", kMaxStopStrings,
                                " are allowed"));
  for (int i = 0; i < p.stop_size(); ++i) {
    const std::string& s = p.stop(i);
    if (s.empty()) return invalid(absl::StrCat("stop[", i, "] is empty"));
    if (s.size() > kMaxStopBytes)
      return invalid(absl::StrCat("stop[", i, "] is ", s.size(), " bytes long; at most ",
                                  kMaxStopBytes, " are allowed"));
    if (!is_valid_utf8(s)) return invalid(absl::StrCat("stop[", i, "] is not valid UTF-8"));
  }
  return absl::OkStatus();
}

// Assigns a proto value to a SamplingParams field of whatever arithmetic type it has.
template <typename Field, typename Value>
void assign(Field& field, Value value) {
  field = static_cast<std::remove_reference_t<Field>>(value);
}

}  // namespace

absl::Status check_token_ids(const google::protobuf::RepeatedField<int32_t>& ids,
                             const Tokenizer& tokenizer, int64_t vocab_size, const char* field) {
  for (int i = 0; i < ids.size(); ++i) {
    const int32_t id = ids.Get(i);
    if (id < 0 || id >= vocab_size || !tokenizer.valid_id(id))
      return invalid(absl::StrCat(field, "[", i, "] = ", id, " is not in the vocabulary (size ",
                                  vocab_size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationRequest> make_generation_request(const v1::GenerateRequest& p,
                                                          const Tokenizer& tokenizer,
                                                          const RequestLimits& limits) {
  LTM_ASSERT(limits.context_length > 0 && limits.vocab_size > 0);

  // Cheap checks first: no tokenization for a request that is wrong anyway.
  const bool has_text = p.has_prompt();
  const bool has_ids = p.prompt_token_ids_size() > 0;
  if (has_text && has_ids)
    return invalid("prompt and prompt_token_ids are both set; set exactly one");
  if (!has_text && !has_ids) return invalid("prompt is missing: set prompt or prompt_token_ids");
  if (has_text && p.prompt().empty()) return invalid("prompt is empty");
  if (has_text && !is_valid_utf8(p.prompt())) return invalid("prompt is not valid UTF-8");
  if (p.has_max_new_tokens() && p.max_new_tokens() < 1)
    return invalid(absl::StrCat("max_new_tokens must be >= 1, got ", p.max_new_tokens()));
  LTM_RETURN_IF_ERROR(check_sampling(p));
  LTM_RETURN_IF_ERROR(check_stop(p));
  if (p.request_id().size() > kMaxRequestIdBytes)
    return invalid(absl::StrCat("request_id is ", p.request_id().size(), " bytes long; at most ",
                                kMaxRequestIdBytes, " are allowed"));
  if (p.adapter().size() > kMaxAdapterFieldBytes)
    return invalid(absl::StrCat("adapter is ", p.adapter().size(), " bytes long; at most ",
                                kMaxAdapterFieldBytes, " are allowed"));

  // Sizes before tokenising or copying anything.
  if (has_text && limits.max_prompt_bytes > 0 &&
      static_cast<int64_t>(p.prompt().size()) > limits.max_prompt_bytes)
    return invalid(absl::StrCat("prompt is ", p.prompt().size(), " bytes long; at most ",
                                limits.max_prompt_bytes, " can fit the context of ",
                                limits.context_length, " tokens"));
  if (has_ids && p.prompt_token_ids_size() >= limits.context_length)
    return invalid(absl::StrCat("prompt_token_ids is ", p.prompt_token_ids_size(),
                                " tokens long; the context holds ", limits.context_length,
                                " tokens, prompt and generated together, so at most ",
                                limits.context_length - 1, " fit"));

  GenerationRequest r;
  if (has_text) {
    r.prompt_ids = tokenizer.encode_prompt(p.prompt());  // with the bos a Llama tokenizer adds
    if (r.prompt_ids.empty()) return invalid("prompt is empty after tokenization");
    for (int32_t id : r.prompt_ids)  // a tokenizer larger than the model's embedding
      if (id >= limits.vocab_size)
        return invalid(absl::StrCat("prompt encodes to token ", id,
                                    ", which is not in the model's vocabulary (size ",
                                    limits.vocab_size, ")"));
  } else {
    LTM_RETURN_IF_ERROR(
        check_token_ids(p.prompt_token_ids(), tokenizer, limits.vocab_size, "prompt_token_ids"));
    r.prompt_ids.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  }
  const char* prompt_field = has_text ? "prompt" : "prompt_token_ids";
  const int64_t n_prompt = static_cast<int64_t>(r.prompt_ids.size());
  if (n_prompt >= limits.context_length)
    return invalid(absl::StrCat(prompt_field, " is ", n_prompt,
                                " tokens long; the context holds ", limits.context_length,
                                " tokens, prompt and generated together, so at most ",
                                limits.context_length - 1, " fit"));
  r.max_new_tokens = p.has_max_new_tokens() ? p.max_new_tokens() : kDefaultMaxNewTokens;
  if (n_prompt + r.max_new_tokens > limits.context_length)
    return invalid(absl::StrCat("max_new_tokens = ", r.max_new_tokens, " with a prompt of ",
                                n_prompt, " tokens exceeds the context of ",
                                limits.context_length, " tokens; at most ",
                                limits.context_length - n_prompt, " fit"));

  assign(r.sampling.temperature, p.has_temperature() ? p.temperature() : 1.0f);
  assign(r.sampling.top_k, p.has_top_k() ? p.top_k() : 0);
  assign(r.sampling.top_p, p.has_top_p() ? p.top_p() : 1.0f);
  assign(r.sampling.repetition_penalty,
         p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f);
  assign(r.sampling.seed, p.has_seed() ? p.seed() : random_seed());
  // The sampler's own rules (the checks above already cover them; this keeps the two in step).
  if (absl::Status s = validate(r.sampling); !s.ok())
    return invalid(std::string(s.message()));

  r.request_id = p.request_id();
  r.stop.assign(p.stop().begin(), p.stop().end());
  r.return_logprobs = p.return_logprobs();
  r.ignore_eos = p.ignore_eos();
  r.adapter = p.adapter();
  return r;
}

}  // namespace ltm
