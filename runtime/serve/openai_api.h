// The OpenAI completions and chat completions APIs (POST /v1/completions, /v1/chat/completions)
// on top of the engine's requests: parsing and validating the JSON body, error objects, and the
// response bodies (whole, or as server-sent event chunks). Pure functions and a per-request
// builder; no sockets (runtime/serve/http_server.h does the HTTP).
//
// Request fields (https://platform.openai.com/docs/api-reference/completions):
//   model            string, optional; must be the served model's name when given
//   prompt           string, list of token ids, or a list of exactly one of either
//   max_tokens       integer >= 1 (default 16); prompt + max_tokens must fit the context
//   temperature      number >= 0 (default 1; 0 = greedy)
//   top_p            number in (0, 1] (default 1); top_k integer >= 0, or -1 for off (default off)
//   n, best_of       1 only
//   stop             string or list of at most 16 non-empty strings
//   seed             integer (default: random)
//   stream           boolean; stream_options.include_usage adds a final usage-only chunk
//   logprobs         integer in [0, 20]: the chosen token's logprob and the top-N alternatives
//                    (log-softmax of the model's logits, before temperature), per token
//   echo             boolean: the prompt is prepended to the text (with its logprobs when asked;
//                    the first prompt token has none)
//   presence_penalty, frequency_penalty   number in [-2, 2]; only 0 is served (else 400: not
//                    supported; repetition_penalty, a number > 0, is the penalty ltm has)
//   user             string, recorded in the log only
//   ignore_eos       boolean (an extension, as vLLM has it)
//   timeout          number of seconds in (0, 86400] (an extension): the request's deadline.
//                    One the server projects it cannot meet is refused at once (429 with a
//                    Retry-After) or shed while it waits (429); one that runs past it ends (408).
//                    Without it, the server's --request-timeout (if any) applies.
//   logit_bias (empty only), suffix (null only); other fields are ignored.
//
// Chat completions (POST /v1/chat/completions, parse_chat_completion) take the same fields but
// prompt, echo, best_of, suffix and the integer logprobs, and these:
//   messages         list of {role: system|user|assistant (developer = system), content: string
//                    or list of {"type": "text", "text"} parts (joined with newlines), name?};
//                    rendered by the model's chat template (runtime/serve/chat_format.h) into the
//                    prompt; a template's raise_exception is a 400 with its message
//   max_tokens, max_completion_tokens   integer >= 1 (the latter wins); default: what the
//                    context leaves after the prompt (as OpenAI)
//   logprobs         boolean; top_logprobs integer in [0, 20] (needs logprobs): per token
//                    {token, logprob, bytes, top_logprobs} under choices[].logprobs.content
//   tools, functions (empty only), tool_choice ("none" only), response_format ({"type": "text"}
//                    only)
// The reply ends at the chat's end ids too (finish_reason "stop"; their text and logprobs are not
// shown). Responses: chat.completion {message}; streamed chat.completion.chunk objects whose
// first delta is {"role": "assistant", "content": ""}, then {"content"} pieces, then {} with the
// finish_reason, then (include_usage) a chunk with no choices and the usage.
// Every refusal is an ApiError naming the field in `param` (OpenAI's error object), including
// the body parser's (common/json_parse.h): nesting past kMaxJsonDepth, a duplicate key, a number
// past a double, a lone surrogate; a number field past FLT_MAX is out of range.
#pragma once

#include <nlohmann/json.hpp>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/sched/request.h"
#include "runtime/serve/request_validation.h"
#include "runtime/text/tokenizer.h"

namespace ltm {

inline constexpr int kMaxLogprobs = 20;

// A request body as parse_completion holds it (common/json_parse.h: std::map objects, so no
// lookup scans the keys; at most kMaxJsonDepth levels; duplicate keys, numbers past a double,
// lone surrogates refused naming the field).
using BodyJson = nlohmann::json;

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the field at fault; empty: null
  std::string code;   // e.g. "model_not_found"; empty: null
};
std::string error_json(const ApiError& e);
// An error of the engine or the validation (absl::Status) as the API reports it: the proto's
// field names become the API's (max_new_tokens -> max_tokens, prompt_token_ids -> prompt),
// param is the field the message starts with; InvalidArgument -> 400, ResourceExhausted -> 429,
// Unavailable -> 503, Unauthenticated -> 401, anything else -> 500.
ApiError api_error(const absl::Status& status);

class ChatFormat;

struct CompletionContext {
  const Tokenizer* tokenizer = nullptr;
  RequestLimits limits;
  std::string model_name;
  // The model's chat template and end tokens (runtime/serve/chat_format.h); null: none (chat
  // requests get a 400 that says so).
  const ChatFormat* chat = nullptr;
};

struct CompletionParams {
  bool chat = false;  // a chat completion (chat.completion objects, delta chunks)
  std::string model;  // the served model's name (echoed in every response)
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  int32_t logprobs = -1;  // -1: none; else alternatives per token
  std::string user;
  double timeout_s = 0;  // `timeout`: the request's deadline in seconds from now (0: none)
  std::string prompt_text;  // echo: the prompt as given (or decoded from its ids)
};

struct ParsedCompletion {
  GenerationRequest request;  // validated (make_generation_request); request_id left empty
  CompletionParams params;
};

// Parses and validates a request body. On failure returns the error (nothing else is set).
std::optional<ApiError> parse_completion(std::string_view body, const CompletionContext& ctx,
                                         ParsedCompletion* out);
// The same for POST /v1/chat/completions: the messages are rendered by ctx.chat's template and
// tokenized into the prompt; the request ends at the chat's end ids as well.
std::optional<ApiError> parse_chat_completion(std::string_view body, const CompletionContext& ctx,
                                              ParsedCompletion* out);

// One token's logprob and its top alternatives, from a row of logits over the vocabulary.
struct TokenLogprob {
  int32_t token = -1;
  bool has_logprob = true;  // false: the first prompt token (nothing predicts it)
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // best first, ties by id
};
// What the last stage reduced a token's row to (runtime/sampling/sampler.h), as the API reports it.
TokenLogprob token_logprob(const RowLogprobs& lp);

const char* openai_finish_reason(FinishReason r);  // "stop" | "length" | nullptr

// Builds the bodies of one completion. Not thread-safe (one per request).
class CompletionBuilder {
 public:
  CompletionBuilder(const Tokenizer& tokenizer, CompletionParams params, std::string id,
                    int64_t created);

  // A non-streamed response: everything at once.
  std::string full_json(const std::string& text, const std::vector<TokenLogprob>& logprobs,
                        FinishReason finish, int32_t prompt_tokens,
                        int32_t completion_tokens);
  // One streamed chunk's JSON (the caller writes "data: " + it + "\n\n"); finish kNone: null.
  std::string chunk_json(const std::string& text, const std::vector<TokenLogprob>& logprobs,
                         FinishReason finish);
  // stream_options.include_usage: the last chunk, with no choices and the usage.
  std::string usage_chunk_json(int32_t prompt_tokens, int32_t completion_tokens);
  // Chat: the first chunk, delta {"role": "assistant", "content": ""}.
  std::string role_chunk_json();

  // The token as text for `tokens` / `top_logprobs` keys: its bytes when they are valid UTF-8,
  // else "bytes:\xNN..." (as OpenAI writes partial characters).
  std::string token_string(int32_t id) const;

 private:
  enum class ChatPart { kMessage, kDelta, kRole };  // what a chat choice carries
  std::string logprobs_json(const std::vector<TokenLogprob>& lps);
  // Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
  nlohmann::ordered_json chat_logprobs_json(const std::vector<TokenLogprob>& lps) const;
  // The response object both shapes share (id, object, created, model, one choice).
  nlohmann::ordered_json completion(const std::string& text,
                                    const std::vector<TokenLogprob>& logprobs,
                                    FinishReason finish, ChatPart part);
  const Tokenizer& tokenizer_;
  CompletionParams params_;
  std::string id_;
  int64_t created_;
  int64_t text_offset_ = 0;  // bytes of text given out so far (text_offset of the next token)
};

}  // namespace ltm
