// Python semantics of chat template values (runtime/chat/template_ast.h): truthiness, str() and
// repr(), equality and ordering, json.dumps, and UTF-8 code points (Python strings index and
// count code points, not bytes).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/chat/template_ast.h"

namespace ltm::chat_detail {

// The budget of the walks over values (repr, str, ==, <, json.dumps) on this thread while a
// render runs (Renderer::run installs it): lists are immutable but may share elements, so a list
// 256 deep can hold 2^256 paths, and a walk must count its work and output, not trust the
// values' size. Each element visited is a step of the render's own count; a walk's output
// past `max_bytes` is a limit error as well. Without one installed, walks are unbounded.
struct WalkBudget {
  int64_t* steps;     // the render's step count, advanced by the walks
  int64_t max_steps;  // its limit
  int64_t max_bytes;  // the most one walk may write
};
class WalkBudgetScope {
 public:
  explicit WalkBudgetScope(WalkBudget* budget);
  ~WalkBudgetScope();
  WalkBudgetScope(const WalkBudgetScope&) = delete;
  WalkBudgetScope& operator=(const WalkBudgetScope&) = delete;

 private:
  WalkBudget* saved_;
};

// Converts JSON (keys in order) to a value; throws TemplateError past `max_depth` nesting.
Value from_json(const nlohmann::ordered_json& j, int max_depth = 128);

// Python's type name: 'str', 'int', 'NoneType', ... ('undefined' for an undefined value).
const char* type_name(const Value& v);

bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); an undefined value is ""
std::string repr(const Value& v);    // repr(v)
std::string float_repr(double d);    // repr(float): 1.0, 0.1, 1e+16, nan, inf
bool equals(const Value& a, const Value& b);
// a < b as Python orders numbers, strings and lists; throws TemplateError kRender otherwise.
bool less(const Value& a, const Value& b);

struct JsonStyle {
  std::string indent;  // "" with has_indent: newlines, no indentation
  bool has_indent = false;
  std::string item_sep = ", ";  // json.dumps' defaults: (", ", ": "), (",", ": ") with indent
  std::string key_sep = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ensure_ascii=False, ...); throws TemplateError kRender for what JSON cannot hold.
std::string to_json(const Value& v, const JsonStyle& style);

// The code points of a UTF-8 string, each as its bytes (an invalid byte stands alone).
std::vector<std::string_view> code_points(std::string_view s);

// Python's str.upper()/lower()/capitalize()/title() for ASCII, Latin-1, Latin Extended-A, basic
// Greek and Cyrillic letters (other code points are left as they are; Greek final sigma is not
// special-cased).
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
std::string capitalize(std::string_view s);
std::string title(std::string_view s);

}  // namespace ltm::chat_detail
