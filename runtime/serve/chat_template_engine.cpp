#include "runtime/serve/chat_template_engine.h"

namespace ltm {

absl::StatusOr<ChatRenderer> compile_chat_template(const std::string& source) {
  (void)source;
  return absl::UnimplementedError("no Jinja interpreter in this build yet");
}

}  // namespace ltm
