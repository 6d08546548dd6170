// The chat template interpreter (runtime/chat/chat_template.h) on any bytes as a template, as a
// model's tokenizer_config.json or --chat-template file could hold: parse() answers a template or
// an InvalidArgument naming line and column; render() over a small conversation answers text
// within the output limit or an error of the documented kinds, all with short messages, and
// gives the same answer twice (a parsed template holds no state between renders).
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/chat/chat_template.h"

namespace {

bool short_message(const absl::Status& s) {
  const std::string m(s.message());
  return m.rfind("chat template", 0) == 0 && m.size() <= 512;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<ltm::ChatTemplate> t = ltm::ChatTemplate::parse(source);
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (!short_message(t.status())) std::abort();
    if (std::string(t.status().message()).find("line ") == std::string::npos) std::abort();
    return 0;
  }
  static const nlohmann::ordered_json context = {
      {"messages",
       {{{"role", "system"}, {"content", " Be brief. "}},
        {{"role", "user"}, {"content", "Hi \"there\" é"}},
        {{"role", "assistant"}, {"content", "Hello!"}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"tools", nlohmann::ordered_json::array()}};
  ltm::ChatTemplateLimits limits;
  limits.max_steps = 20000;
  limits.max_output_bytes = 1 << 16;
  limits.max_alloc_bytes = 1 << 20;
  limits.max_call_depth = 16;
  const absl::StatusOr<std::string> a = t->render(context, limits);
  const absl::StatusOr<std::string> b = t->render(context, limits);
  if (a.ok()) {
    if (static_cast<int64_t>(a->size()) > limits.max_output_bytes) std::abort();
  } else {
    const absl::StatusCode c = a.status().code();
    if (c != absl::StatusCode::kInvalidArgument && c != absl::StatusCode::kResourceExhausted) {
      std::abort();
    }
    if (!short_message(a.status())) std::abort();
  }
  // strftime_now may cross a second between the two renders; everything else is deterministic.
  if (source.find("strftime_now") == std::string::npos &&
      (a.ok() != b.ok() || (a.ok() && *a != *b))) {
    std::abort();
  }
  return 0;
}
