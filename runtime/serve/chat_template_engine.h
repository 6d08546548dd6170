// The bridge from a chat template's source to a renderer (runtime/serve/chat_format.h), over the
// Jinja interpreter (runtime/chat/): parsed once, rendered per request, thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace ltm {

using ChatRenderer = std::function<absl::StatusOr<std::string>(const nlohmann::json& context)>;

// InvalidArgument naming line and problem when `source` does not parse.
absl::StatusOr<ChatRenderer> compile_chat_template(const std::string& source);

}  // namespace ltm
