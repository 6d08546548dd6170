// Chat templates: the small Jinja interpreter that renders a model's `chat_template` (HF
// tokenizer_config.json) into the prompt text, as Hugging Face transformers does.
//
// The language is the subset of Jinja2 that chat templates use, with transformers' settings:
// trim_blocks and lstrip_blocks on, `{%-`/`-%}`/`{%+`/`+%}` whitespace control, one trailing
// newline of the source dropped; text, {{ }}, {% %}, {# #}; for (with else, loop filter, tuple
// targets, `loop.*`), if/elif/else, set (plain, `ns.attr`, block), macro, break/continue,
// generation blocks (rendered as their body); the usual operators, tests, filters and string/dict
// methods (the list is in docs/architecture.md, "Chat templates"), and the globals range,
// namespace, dict, raise_exception and strftime_now. Values behave as in Python: None/True/False
// print as such, floats as repr(), lists and dicts as their Python repr, `tojson` is
// transformers' (json.dumps with ensure_ascii=False, indent when given). An undefined name prints
// as nothing and is falsy; an attribute or item of it is an error, as with jinja2's Undefined.
// Not supported (a clear parse error): extends/include/import, call blocks, filter blocks, raw.
// upper/lower/title/capitalize change ASCII letters only.
//
// Everything a render does is bounded (ChatTemplateLimits): messages come from clients, and a
// template can loop. Errors are absl::Status values, never exceptions or crashes:
//   - bad syntax: InvalidArgument "chat template: line L, column C: ..." from parse();
//   - raise_exception(msg) in the template: InvalidArgument whose message is
//     "chat template raised: <msg>" (the conversation does not fit the template);
//   - any other render error (a type error, an attribute of an undefined value):
//     InvalidArgument "chat template: line L: ...";
//   - a limit: ResourceExhausted "chat template: ... limit ...".
// Messages are valid UTF-8 and at most ~400 bytes (longer ones end in "...").
//
// Thread-safety: a parsed ChatTemplate is immutable; render() may run on many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ltm {

struct ChatTemplateLimits {
  int64_t max_output_bytes = 4 << 20;  // the rendered text
  int64_t max_steps = 2'000'000;       // expressions evaluated + loop iterations
  int64_t max_alloc_bytes = 64 << 20;  // bytes of strings and list/dict slots a render creates
  int max_call_depth = 32;             // macro calls nested
};

namespace chat_detail {
struct Program;  // the parsed template (runtime/chat/template_ast.h)
}  // namespace chat_detail

class ChatTemplate {
 public:
  // Parses once (at model load); errors name the line and column.
  static absl::StatusOr<ChatTemplate> parse(std::string_view source);

  // Renders with `context` as the template's variables: an object such as
  //   {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true,
  //    "bos_token": "<s>", "eos_token": "</s>"}  (plus any extra keys: tools, documents, ...).
  // Object keys keep their order (ordered_json), so `tojson` prints them as the client sent
  // them; a plain nlohmann::json converts implicitly (keys then sorted). null: no variables.
  absl::StatusOr<std::string> render(const nlohmann::ordered_json& context,
                                     const ChatTemplateLimits& limits = {}) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const chat_detail::Program> program);
  std::shared_ptr<const chat_detail::Program> program_;
};

// parse() then render(), for one-off use.
absl::StatusOr<std::string> render_chat_template(std::string_view source,
                                                 const nlohmann::ordered_json& context,
                                                 const ChatTemplateLimits& limits = {});

}  // namespace ltm
