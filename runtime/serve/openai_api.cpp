#include "runtime/serve/openai_api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/json_parse.h"
#include "ltm/v1/ltm.pb.h"
#include "runtime/serve/chat_format.h"

namespace ltm {
namespace {

using json = nlohmann::ordered_json;  // responses keep OpenAI's field order
// Request bodies: std::map objects (parse_json; key order does not matter there, and
// ordered_json's linear key search made a body of n keys cost O(n^2)).
using body_json = BodyJson;

ApiError bad(std::string message, std::string param = "", std::string code = "") {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* type_of(const body_json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  return "null";
}

ApiError wrong_type(const std::string& field, const char* want, const body_json& v) {
  return bad(absl::StrCat(field, " must be ", want, ", got ", type_of(v)), field);
}

// The value of `name`, or nullptr when it is absent or null (OpenAI treats null as unset).
const body_json* field(const body_json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer value in int64 range; nullopt for anything else (the caller names the problem).
std::optional<int64_t> as_int(const body_json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> get_int(const body_json& j, const char* name, int64_t lo, int64_t hi,
                                std::optional<int64_t>* out) {
  const body_json* v = field(j, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) return wrong_type(name, "an integer", *v);
  const std::optional<int64_t> i = as_int(*v);
  if (!i || *i < lo || *i > hi)
    return bad(absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", v->dump()), name);
  *out = *i;
  return std::nullopt;
}

std::optional<ApiError> get_number(const body_json& j, const char* name,
                                   std::optional<double>* out) {
  const body_json* v = field(j, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return wrong_type(name, "a number", *v);
  const double d = v->get<double>();
  // Every number field is a float in the engine: a double past FLT_MAX (1e39) would become inf.
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
    return bad(absl::StrFormat("%s must be a finite 32-bit float (at most %g in magnitude), got %g",
                               name, std::numeric_limits<float>::max(), d),
               name);
  *out = d;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const body_json& j, const char* name, bool* out) {
  const body_json* v = field(j, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return wrong_type(name, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

// prompt: a string, a list of token ids, or a one-element list of either.
std::optional<ApiError> get_prompt(const body_json& j, v1::GenerateRequest& p) {
  const body_json* v = field(j, "prompt");
  if (v == nullptr) return bad("prompt is missing: give a string or a list of token ids", "prompt");
  const body_json* one = v;
  if (v->is_array() && !v->empty() && ((*v)[0].is_string() || (*v)[0].is_array())) {
    if (v->size() != 1)
      return bad(absl::StrCat("prompt: only one prompt per request is served, got ", v->size(),
                              "; send one request each"),
                 "prompt");
    one = &(*v)[0];
  }
  if (one->is_string()) {
    p.set_prompt(one->get<std::string>());
    return std::nullopt;
  }
  if (!one->is_array())
    return wrong_type("prompt", "a string or a list of token ids", *one);
  if (one->empty()) return bad("prompt is empty", "prompt");
  for (size_t i = 0; i < one->size(); ++i) {
    const body_json& id = (*one)[i];
    if (!id.is_number_integer())
      return bad(absl::StrCat("prompt[", i, "] must be a token id (an integer), got ",
                              type_of(id)),
                 "prompt");
    const std::optional<int64_t> x = as_int(id);
    if (!x || *x < 0 || *x > std::numeric_limits<int32_t>::max())
      return bad(absl::StrCat("prompt[", i, "] = ", id.dump(), " is not in the vocabulary"),
                 "prompt");
    p.add_prompt_token_ids(static_cast<int32_t>(*x));
  }
  return std::nullopt;
}

std::optional<ApiError> get_stop(const body_json& j, v1::GenerateRequest& p) {
  const body_json* v = field(j, "stop");
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    p.add_stop(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return wrong_type("stop", "a string or a list of strings", *v);
  if (v->size() > static_cast<size_t>(kMaxStopStrings))
    return bad(absl::StrCat("stop has ", v->size(), " strings; at most ", kMaxStopStrings,
                            " are allowed"),
               "stop");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      return bad(absl::StrCat("stop[", i, "] must be a string, got ", type_of((*v)[i])), "stop");
    p.add_stop((*v)[i].get<std::string>());
  }
  return std::nullopt;
}

// The API's name of a proto field at the start of a validation message.
std::string api_message(const std::string& message) {
  return absl::StrReplaceAll(message, {{"max_new_tokens", "max_tokens"},
                                       {"prompt_token_ids", "prompt"}});
}

std::string leading_field(const std::string& message) {
  size_t n = 0;
  while (n < message.size() && (std::isalnum(static_cast<unsigned char>(message[n])) ||
                                message[n] == '_'))
    ++n;
  static const char* kFields[] = {"prompt", "max_tokens", "temperature", "top_p", "top_k",
                                  "stop", "seed", "repetition_penalty", "request_id", "logprobs"};
  const std::string f = message.substr(0, n);
  for (const char* k : kFields)
    if (f == k) return f;
  return "";
}

}  // namespace

std::string error_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return dump(json{{"error", err}});
}

ApiError api_error(const absl::Status& status) {
  ApiError e;
  e.message = api_message(std::string(status.message()));
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      e.http_status = 400;
      e.param = leading_field(e.message);
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 408;
      e.type = "timeout";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

namespace {

// The body as a JSON object, or the error.
std::optional<ApiError> parse_body(std::string_view body, body_json* out) {
  JsonFault fault;
  absl::StatusOr<body_json> parsed = parse_json<body_json>(body, &fault, kMaxJsonDepth);
  if (!parsed.ok())
    return bad(absl::StrCat("the body is not valid JSON: ", parsed.status().message()),
               fault.field);
  if (!parsed->is_object())
    return bad(absl::StrCat("the body must be a JSON object, got ", type_of(*parsed)));
  *out = std::move(*parsed);
  return std::nullopt;
}

// model: the served model's name, or a LoRA adapter's (as other OpenAI-compatible servers do);
// the scheduler answers NotFound when no such adapter is loaded (http_session.cpp).
std::optional<ApiError> get_model(const body_json& j, const CompletionContext& ctx,
                                  v1::GenerateRequest& p, CompletionParams& params) {
  params.model = ctx.model_name;
  if (const body_json* m = field(j, "model")) {
    if (!m->is_string()) return wrong_type("model", "a string", *m);
    if (m->get<std::string>() != ctx.model_name) {
      params.model = m->get<std::string>();
      p.set_adapter(params.model);
    }
  }
  return std::nullopt;
}

// The fields completions and chat completions share: sampling, stop, n, stream, user, ...
// The `timeout` field: the request's deadline, from now.
void set_deadline(const CompletionParams& params, GenerationRequest& r) {
  if (params.timeout_s > 0)
    r.deadline = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(params.timeout_s));
}

std::optional<ApiError> get_common(const body_json& j, v1::GenerateRequest& p,
                                   CompletionParams& params) {
  std::optional<int64_t> i;
  if (auto e = get_int(j, "top_k", -1, std::numeric_limits<int32_t>::max(), &i)) return e;
  if (i && *i > 0) p.set_top_k(static_cast<int32_t>(*i));
  i.reset();
  if (auto e = get_int(j, "n", 1, 1, &i)) {
    e->message = absl::StrCat("n: only n = 1 is served (one completion per request); ",
                              e->message);
    return e;
  }
  if (const body_json* s = field(j, "seed")) {
    if (!s->is_number_integer()) return wrong_type("seed", "an integer", *s);
    p.set_seed(s->is_number_unsigned() ? s->get<uint64_t>()
                                       : static_cast<uint64_t>(s->get<int64_t>()));
  }

  std::optional<double> d;
  if (auto e = get_number(j, "temperature", &d)) return e;
  if (d) {
    if (*d < 0) return bad(absl::StrFormat("temperature must be >= 0 (0 = greedy), got %g", *d),
                           "temperature");
    p.set_temperature(static_cast<float>(*d));
  }
  d.reset();
  if (auto e = get_number(j, "top_p", &d)) return e;
  if (d) {
    if (!(*d > 0 && *d <= 1))
      return bad(absl::StrFormat("top_p must be in (0, 1], got %g", *d), "top_p");
    p.set_top_p(static_cast<float>(*d));
  }
  d.reset();
  if (auto e = get_number(j, "repetition_penalty", &d)) return e;
  if (d) p.set_repetition_penalty(static_cast<float>(*d));
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    d.reset();
    if (auto e = get_number(j, name, &d)) return e;
    if (d && (*d < -2 || *d > 2))
      return bad(absl::StrFormat("%s must be in [-2, 2], got %g", name, *d), name);
    if (d && *d != 0)
      return bad(absl::StrFormat("%s is not supported by this server (only 0); "
                                 "repetition_penalty (> 0, 1 = off) is",
                                 name),
                 name, "unsupported_parameter");
  }

  if (auto e = get_stop(j, p)) return e;
  if (auto e = get_bool(j, "stream", &params.stream)) return e;
  bool ignore_eos = false;
  if (auto e = get_bool(j, "ignore_eos", &ignore_eos)) return e;
  p.set_ignore_eos(ignore_eos);
  if (const body_json* so = field(j, "stream_options")) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    if (!params.stream)
      return bad("stream_options is only allowed with stream: true", "stream_options");
    if (auto e = get_bool(*so, "include_usage", &params.include_usage)) {
      e->param = "stream_options";
      return e;
    }
  }
  if (const body_json* u = field(j, "user")) {
    if (!u->is_string()) return wrong_type("user", "a string", *u);
    params.user = u->get<std::string>().substr(0, 256);
  }
  std::optional<double> timeout_s;
  if (auto e = get_number(j, "timeout", &timeout_s)) return e;
  if (timeout_s && !(*timeout_s > 0 && *timeout_s <= 86400))
    return bad(absl::StrFormat("timeout must be in (0, 86400] seconds, got %g", *timeout_s),
               "timeout");
  if (timeout_s) params.timeout_s = *timeout_s;
  if (const body_json* lb = field(j, "logit_bias")) {
    if (!lb->is_object()) return wrong_type("logit_bias", "an object", *lb);
    if (!lb->empty())
      return bad("logit_bias is not supported by this server", "logit_bias",
                 "unsupported_parameter");
  }
  return std::nullopt;
}

void add_end_ids(GenerationRequest& r, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (std::find(r.end_ids.begin(), r.end_ids.end(), id) == r.end_ids.end())
      r.end_ids.push_back(id);
}

// One message's content: a string, or a list of text parts ({"type": "text", "text": ...}),
// joined with newlines.
std::optional<ApiError> get_content(const body_json& m, const std::string& at,
                                    std::string* out) {
  const std::string name = at + ".content";
  const body_json* c = field(m, "content");
  if (c == nullptr) return bad(absl::StrCat(name, " is missing"), name);
  if (c->is_string()) {
    *out = c->get<std::string>();
    return std::nullopt;
  }
  if (!c->is_array()) return wrong_type(name, "a string or a list of text parts", *c);
  out->clear();
  for (size_t k = 0; k < c->size(); ++k) {
    const body_json& part = (*c)[k];
    const std::string pn = absl::StrCat(name, "[", k, "]");
    if (!part.is_object()) return wrong_type(pn, "an object", part);
    const body_json* type = field(part, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text")
      return bad(absl::StrCat(pn, ".type must be \"text\" (only text is served), got ",
                              type ? json_brief(*type) : std::string("nothing")),
                 pn + ".type", type ? "unsupported_parameter" : "");
    const body_json* text = field(part, "text");
    if (text == nullptr || !text->is_string())
      return bad(absl::StrCat(pn, ".text must be a string"), pn + ".text");
    if (k > 0) out->push_back('\n');
    out->append(text->get<std::string>());
  }
  return std::nullopt;
}

// messages -> the list the template gets: [{role, content[, name]}], every one checked.
std::optional<ApiError> get_messages(const body_json& j, int64_t max_messages,
                                     nlohmann::json* out) {
  const body_json* ms = field(j, "messages");
  if (ms == nullptr)
    return bad("messages is missing: give a list of {\"role\", \"content\"} objects", "messages");
  if (!ms->is_array()) return wrong_type("messages", "a list of messages", *ms);
  if (ms->empty()) return bad("messages is empty", "messages");
  if (static_cast<int64_t>(ms->size()) >= max_messages)
    return bad(absl::StrCat("messages has ", ms->size(), " messages; a prompt of the context (",
                            max_messages, " tokens) cannot hold them"),
               "messages");
  *out = nlohmann::json::array();
  for (size_t i = 0; i < ms->size(); ++i) {
    const body_json& m = (*ms)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return wrong_type(at, "an object", m);
    const body_json* role = field(m, "role");
    if (role == nullptr) return bad(absl::StrCat(at, ".role is missing"), at + ".role");
    if (!role->is_string()) return wrong_type(at + ".role", "a string", *role);
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for system
    if (r != "system" && r != "user" && r != "assistant")
      return bad(absl::StrCat(at, ".role is ", json_brief(*role),
                              ": it must be \"system\", \"user\" or \"assistant\""),
                 at + ".role");
    for (const char* unsupported : {"tool_calls", "function_call"}) {
      const body_json* f = field(m, unsupported);
      if (f != nullptr && !(f->is_array() && f->empty()))
        return bad(absl::StrCat(at, ".", unsupported, " is not supported by this server"),
                   absl::StrCat(at, ".", unsupported), "unsupported_parameter");
    }
    std::string content;
    if (auto e = get_content(m, at, &content)) return e;
    nlohmann::json msg = {{"role", r}, {"content", std::move(content)}};
    if (const body_json* n = field(m, "name")) {
      if (!n->is_string()) return wrong_type(at + ".name", "a string", *n);
      msg["name"] = n->get<std::string>();
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_completion(std::string_view body, const CompletionContext& ctx,
                                         ParsedCompletion* out) {
  body_json j;
  if (auto e = parse_body(body, &j)) return e;
  CompletionParams params;
  v1::GenerateRequest p;
  if (auto e = get_model(j, ctx, p, params)) return e;
  if (auto e = get_prompt(j, p)) return e;

  std::optional<int64_t> i;
  if (auto e = get_int(j, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &i)) return e;
  if (i) p.set_max_new_tokens(static_cast<int32_t>(*i));
  i.reset();
  if (auto e = get_int(j, "best_of", 1, 1, &i)) {
    e->message = absl::StrCat("best_of: only best_of = 1 is served; ", e->message);
    return e;
  }
  i.reset();
  if (auto e = get_int(j, "logprobs", 0, kMaxLogprobs, &i)) return e;
  if (i) params.logprobs = static_cast<int32_t>(*i);
  if (auto e = get_common(j, p, params)) return e;
  if (auto e = get_bool(j, "echo", &params.echo)) return e;
  if (const body_json* sfx = field(j, "suffix")) {
    if (!sfx->is_string()) return wrong_type("suffix", "a string", *sfx);
    if (!sfx->get<std::string>().empty())
      return bad("suffix is not supported by this server", "suffix", "unsupported_parameter");
  }

  absl::StatusOr<GenerationRequest> r = make_generation_request(p, *ctx.tokenizer, ctx.limits);
  if (!r.ok()) return api_error(r.status());
  if (params.logprobs >= 0) {
    // The alternatives are reduced from each token's row on the last stage (RowLogprobs).
    r->logprob_alternatives = params.logprobs;
    r->score_prompt = params.echo;
  }
  if (ctx.chat != nullptr) add_end_ids(*r, ctx.chat->generation_eos_ids());
  set_deadline(params, *r);
  if (params.echo)
    params.prompt_text = p.has_prompt() ? p.prompt() : ctx.tokenizer->decode(r->prompt_ids);
  out->request = std::move(*r);
  out->params = std::move(params);
  return std::nullopt;
}

std::optional<ApiError> parse_chat_completion(std::string_view body, const CompletionContext& ctx,
                                              ParsedCompletion* out) {
  body_json j;
  if (auto e = parse_body(body, &j)) return e;
  CompletionParams params;
  params.chat = true;
  v1::GenerateRequest p;
  if (auto e = get_model(j, ctx, p, params)) return e;
  nlohmann::json messages;
  if (auto e = get_messages(j, ctx.limits.context_length, &messages)) return e;

  std::optional<int64_t> max_tokens;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    std::optional<int64_t> i;
    if (auto e = get_int(j, name, 1, std::numeric_limits<int32_t>::max(), &i)) return e;
    if (i) max_tokens = i;  // max_completion_tokens (OpenAI's newer name) wins
  }
  bool logprobs = false;
  if (auto e = get_bool(j, "logprobs", &logprobs)) return e;
  std::optional<int64_t> top;
  if (auto e = get_int(j, "top_logprobs", 0, kMaxLogprobs, &top)) return e;
  if (top && !logprobs)
    return bad("top_logprobs needs logprobs: true", "top_logprobs");
  if (logprobs) params.logprobs = static_cast<int32_t>(top.value_or(0));
  if (auto e = get_common(j, p, params)) return e;
  for (const char* name : {"tools", "functions"}) {
    const body_json* t = field(j, name);
    if (t != nullptr && !(t->is_array() && t->empty()))
      return bad(absl::StrCat(name, " is not supported by this server"), name,
                 "unsupported_parameter");
  }
  if (const body_json* tc = field(j, "tool_choice");
      tc != nullptr && !(tc->is_string() && tc->get<std::string>() == "none"))
    return bad("tool_choice is not supported by this server (only \"none\")", "tool_choice",
               "unsupported_parameter");
  if (const body_json* rf = field(j, "response_format")) {
    if (!rf->is_object()) return wrong_type("response_format", "an object", *rf);
    const body_json* type = field(*rf, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text")
      return bad("response_format: only {\"type\": \"text\"} is served", "response_format",
                 "unsupported_parameter");
  }

  if (ctx.chat == nullptr || !ctx.chat->has_template())
    return bad(absl::StrCat("the model \"", ctx.model_name,
                            "\" has no chat template (no \"chat_template\" in its "
                            "tokenizer_config.json, no --chat-template FILE): it cannot chat; "
                            "use /v1/completions"),
               "messages", "no_chat_template");
  absl::StatusOr<std::string> text = ctx.chat->render(messages);
  if (!text.ok()) return bad(std::string(text.status().message()), "messages");
  for (int32_t id : ctx.chat->encode(*text)) p.add_prompt_token_ids(id);
  if (p.prompt_token_ids().empty())
    return bad("messages: the chat template made an empty prompt of them", "messages");
  if (max_tokens) {
    p.set_max_new_tokens(static_cast<int32_t>(*max_tokens));
  } else {  // OpenAI's default: as many as the context leaves
    const int64_t left = ctx.limits.context_length - p.prompt_token_ids_size();
    p.set_max_new_tokens(static_cast<int32_t>(
        std::clamp<int64_t>(left, 1, std::numeric_limits<int32_t>::max())));
  }

  absl::StatusOr<GenerationRequest> r = make_generation_request(p, *ctx.tokenizer, ctx.limits);
  if (!r.ok()) {
    ApiError e = api_error(r.status());
    if (e.param == "prompt") {
      e.param = "messages";
      e.message = absl::StrCat("messages (the prompt the chat template makes of them): ",
                               e.message);
    }
    return e;
  }
  if (params.logprobs >= 0) r->logprob_alternatives = params.logprobs;
  add_end_ids(*r, ctx.chat->chat_end_ids());
  set_deadline(params, *r);
  out->request = std::move(*r);
  out->params = std::move(params);
  return std::nullopt;
}

TokenLogprob token_logprob(const RowLogprobs& lp) {
  TokenLogprob out;
  out.token = lp.token;
  out.logprob = lp.logprob;
  for (int32_t j = 0; j < lp.n_top; ++j) out.top.emplace_back(lp.top[j].id, lp.top[j].logprob);
  return out;
}

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop:
    case FinishReason::kEos: return "stop";
    default: return nullptr;
  }
}

CompletionBuilder::CompletionBuilder(const Tokenizer& tokenizer, CompletionParams params,
                                     std::string id, int64_t created)
    : tokenizer_(tokenizer), params_(std::move(params)), id_(std::move(id)), created_(created) {}

std::string CompletionBuilder::token_string(int32_t id) const {
  if (!tokenizer_.valid_id(id)) return absl::StrCat("<", id, ">");
  const std::string bytes = tokenizer_.token_bytes(id);
  if (is_valid_utf8(bytes)) return bytes;
  std::string out = "bytes:";
  for (unsigned char c : bytes) absl::StrAppendFormat(&out, "\\x%02x", c);
  return out;
}

std::string CompletionBuilder::logprobs_json(const std::vector<TokenLogprob>& lps) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = token_string(t.token);
    tokens.push_back(s);
    offsets.push_back(text_offset_);
    text_offset_ += tokenizer_.valid_id(t.token)
                        ? static_cast<int64_t>(tokenizer_.token_bytes(t.token).size())
                        : 0;
    if (!t.has_logprob) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(t.logprob);
    json alternatives = json::object();
    for (const auto& [alt, lp] : t.top) alternatives[token_string(alt)] = lp;
    top.push_back(std::move(alternatives));
  }
  return dump(json{{"tokens", tokens},
                   {"token_logprobs", token_logprobs},
                   {"top_logprobs", top},
                   {"text_offset", offsets}});
}

json CompletionBuilder::chat_logprobs_json(const std::vector<TokenLogprob>& lps) const {
  auto entry = [&](int32_t id, float logprob) {
    json bytes = json::array();
    if (tokenizer_.valid_id(id))
      for (unsigned char c : tokenizer_.token_bytes(id)) bytes.push_back(c);
    return json{{"token", token_string(id)}, {"logprob", logprob}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    if (!t.has_logprob) continue;
    json e = entry(t.token, t.logprob);
    json top = json::array();
    for (const auto& [alt, lp] : t.top) top.push_back(entry(alt, lp));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return json{{"content", content}};
}

json CompletionBuilder::completion(const std::string& text,
                                  const std::vector<TokenLogprob>& logprobs,
                                  FinishReason finish, ChatPart part) {
  const char* fr = openai_finish_reason(finish);
  if (params_.chat) {
    json choice = {{"index", 0}};
    if (part == ChatPart::kMessage) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      json delta = json::object();
      if (part == ChatPart::kRole) delta["role"] = "assistant";
      if (part == ChatPart::kRole || !text.empty()) delta["content"] = text;
      choice["delta"] = std::move(delta);
    }
    choice["logprobs"] = params_.logprobs >= 0 && part != ChatPart::kRole
                             ? chat_logprobs_json(logprobs)
                             : json(nullptr);
    choice["finish_reason"] = fr ? json(fr) : json(nullptr);
    return {{"id", id_},
            {"object", part == ChatPart::kMessage ? "chat.completion" : "chat.completion.chunk"},
            {"created", created_},
            {"model", params_.model},
            {"choices", json::array({choice})}};
  }
  json choice = {{"text", text}, {"index", 0}};
  choice["logprobs"] =
      params_.logprobs >= 0 ? json::parse(logprobs_json(logprobs)) : json(nullptr);
  choice["finish_reason"] = fr ? json(fr) : json(nullptr);
  return {{"id", id_},
          {"object", "text_completion"},
          {"created", created_},
          {"model", params_.model},
          {"choices", json::array({choice})}};
}

std::string CompletionBuilder::full_json(const std::string& text,
                                         const std::vector<TokenLogprob>& logprobs,
                                         FinishReason finish, int32_t prompt_tokens,
                                         int32_t completion_tokens) {
  json out = completion(params_.echo ? params_.prompt_text + text : text, logprobs, finish,
                        ChatPart::kMessage);
  out["usage"] = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens}};
  return dump(out);
}

std::string CompletionBuilder::chunk_json(const std::string& text,
                                          const std::vector<TokenLogprob>& logprobs,
                                          FinishReason finish) {
  return dump(completion(text, logprobs, finish, ChatPart::kDelta));
}

std::string CompletionBuilder::role_chunk_json() {
  return dump(completion("", {}, FinishReason::kNone, ChatPart::kRole));
}

std::string CompletionBuilder::usage_chunk_json(int32_t prompt_tokens, int32_t completion_tokens) {
  json out = {{"id", id_},
              {"object", params_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", params_.model},
              {"choices", json::array()},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}}}};
  return dump(out);
}

}  // namespace ltm
