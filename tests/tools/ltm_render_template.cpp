// ltm-render-template: renders chat templates with runtime/chat for tests and scripts.
//
//   ltm-render-template TEMPLATE_FILE CONTEXT_JSON_FILE   prints the rendered text; on an error
//                                                         prints it on stderr and exits 1
//   ltm-render-template --lines    reads one JSON object {"template": "...", "context": {...}}
//                                  per line on stdin, writes one JSON object per line:
//                                  {"text": "..."} or {"error": "..."}
// Context keys keep their order (tojson prints them as given).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/chat/chat_template.h"

namespace {

bool read_file(const char* path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

int lines_mode() {
  std::string line;
  for (int line_no = 1; std::getline(std::cin, line); ++line_no) {
    const auto in = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!in.is_object() || !in.contains("template") || !in["template"].is_string() ||
        !in.contains("context")) {
      std::fprintf(stderr, "ltm-render-template: line %d: expected {\"template\", \"context\"}\n",
                   line_no);
      return 1;
    }
    const absl::StatusOr<std::string> text =
        ltm::render_chat_template(in["template"].get<std::string>(), in["context"]);
    nlohmann::ordered_json out;
    if (text.ok())
      out["text"] = *text;
    else
      out["error"] = std::string(text.status().message());
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n"
              << std::flush;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--lines") return lines_mode();
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TEMPLATE_FILE CONTEXT_JSON_FILE | --lines\n", argv[0]);
    return 2;
  }
  std::string source, context_text;
  if (!read_file(argv[1], &source) || !read_file(argv[2], &context_text)) {
    std::fprintf(stderr, "ltm-render-template: cannot read %s or %s\n", argv[1], argv[2]);
    return 1;
  }
  const auto context = nlohmann::ordered_json::parse(context_text, nullptr, false);
  if (context.is_discarded()) {
    std::fprintf(stderr, "ltm-render-template: %s is not JSON\n", argv[2]);
    return 1;
  }
  const absl::StatusOr<std::string> text = ltm::render_chat_template(source, context);
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}
