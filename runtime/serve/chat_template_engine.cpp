#include "runtime/serve/chat_template_engine.h"

#include <memory>
#include <utility>

#include "runtime/chat/chat_template.h"

namespace ltm {

absl::StatusOr<ChatRenderer> compile_chat_template(const std::string& source) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::parse(source);
  if (!parsed.ok()) return parsed.status();
  auto shared = std::make_shared<const ChatTemplate>(std::move(*parsed));
  return ChatRenderer([shared](const nlohmann::json& context) -> absl::StatusOr<std::string> {
    return shared->render(nlohmann::ordered_json(context));
  });
}

}  // namespace ltm
