// The chat template renderer, class Renderer: internal to runtime/chat (chat_template.h is the
// API). It walks the syntax tree (template_ast.h) with Python/jinja2 semantics
// (template_values.h), counting steps, bytes made and output against the limits. Its members
// live in two files: the walk, statements and expressions, in chat_template.cpp; the built-ins
// it calls (the globals, macro calls, string and dict methods, filters and tests) in
// template_builtins.cpp. The budgets and other small members are here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/chat/chat_template.h"
#include "runtime/chat/template_ast.h"
#include "runtime/chat/template_values.h"

namespace ltm::chat_detail {

using K = Value::Kind;
using Scope = std::unordered_map<std::string, Value>;
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

[[noreturn]] inline void render_error(const std::string& msg) {
  throw TemplateError(TemplateError::Kind::kRender, msg);
}

inline const Value* dict_find(const ValueDict& d, std::string_view key) {
  for (const auto& kv : d)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

class Renderer {
 public:
  Renderer(const ChatTemplateLimits& limits, Scope context) : limits_(limits) {
    scopes_.push_back(std::move(context));
    scopes_.emplace_back();  // the template's own top-level variables
  }
  // A namespace is the one mutable value, so the one way to make a cycle of shared_ptrs
  // (`{% set ns.a = ns %}`, or ns inside a list stored back in ns): every namespace this render
  // made is emptied when it ends, which breaks every such cycle. Nothing outlives the render.
  ~Renderer() {
    for (const auto& ns : namespaces_) ns->clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run(const Body& body) {
    out_ = &result_;
    WalkBudget walks{&steps_, limits_.max_steps, limits_.max_alloc_bytes};
    WalkBudgetScope scope(&walks);
    exec(body);
    return std::move(result_);
  }

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };

  // ---- budgets ----

  void step() {
    if (++steps_ > limits_.max_steps) {
      throw TemplateError(TemplateError::Kind::kLimit,
                          absl::StrCat("chat template: the render took more than ",
                                       limits_.max_steps, " steps (limit)"));
    }
  }
  void charge(size_t bytes) {
    if (bytes > static_cast<size_t>(std::max<int64_t>(0, limits_.max_alloc_bytes - alloc_))) {
      throw TemplateError(TemplateError::Kind::kLimit,
                          absl::StrCat("chat template: the render made more than ",
                                       limits_.max_alloc_bytes, " bytes of values (limit)"));
    }
    alloc_ += static_cast<int64_t>(bytes);
  }
  Value made(Value v) {  // charges a value the render just created
    if (v.is(K::kString))
      charge(v.str->size());
    else if (v.is(K::kList))
      charge(v.list->size() * sizeof(Value));
    else if (v.is(K::kDict))
      charge(v.dict->size() * (sizeof(Value) + 32));
    return v;
  }
  Value str_value(std::string s) { return made(Value::of_string(std::move(s))); }
  void write(const std::string& s) {
    if (out_ == &result_) {
      if (static_cast<int64_t>(result_.size() + s.size()) > limits_.max_output_bytes) {
        throw TemplateError(TemplateError::Kind::kLimit,
                            absl::StrCat("chat template: the output is longer than ",
                                         limits_.max_output_bytes, " bytes (limit)"));
      }
    } else {
      charge(s.size());
    }
    out_->append(s);
  }

  // ---- statements (chat_template.cpp) ----

  Flow exec(const Body& body);
  Flow exec(const Stmt& s);
  void assign(const std::vector<std::string>& targets, const Value& v);
  ValueList iterate(const Value& v);
  void exec_for(const Stmt& s);

  // ---- expressions (chat_template.cpp) ----

  Value lookup(const std::string& name);

  [[noreturn]] void undefined_error(const Value& v) {
    render_error(v.str && !v.str->empty() ? *v.str : "undefined value");
  }

  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  Value eval(const Expr& e);
  void eval_args(const Expr& e, Args* args, Kwargs* kwargs);
  Value eval_slice(const Expr& e);

  static int64_t as_int(const Value& v) { return v.is(K::kBool) ? v.boolean : v.integer; }
  static double as_double(const Value& v) {
    return v.is(K::kFloat) ? v.number : static_cast<double>(as_int(v));
  }

  Value binary(const std::string& op, const Value& a, const Value& b);
  bool in(const Value& needle, const Value& hay);
  bool compare(const std::string& op, const Value& a, const Value& b);

  // ---- calls (template_builtins.cpp) ----

  static const Value* kwarg(const Kwargs& kw, const char* name) {
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
  // Positional argument i, else keyword `name`, else nullptr.
  static const Value* arg(const Args& args, const Kwargs& kw, size_t i, const char* name) {
    if (i < args.size()) return &args[i];
    return kwarg(kw, name);
  }
  static const std::string& need_str(const Value* v, const std::string& what) {
    if (!v || !v->is(K::kString)) {
      render_error(
          absl::StrCat(what, " needs a string argument, got ", v ? type_name(*v) : "none"));
    }
    return *v->str;
  }

  Value call(const Callable& fn, const Args& args, const Kwargs& kw);
  Value call_macro(const Stmt& m, const Args& args, const Kwargs& kw);
  Value call_method(const Value& self, const std::string& name, const Args& args,
                    const Kwargs& kw);

  // ---- filters and tests (template_builtins.cpp) ----

  Value attribute_of(const Value& item, const std::string& path);
  Value filter(const std::string& name, const Value& v, const Args& args, const Kwargs& kw);
  bool test(const std::string& name, const Value& v, const Args& args);

 public:
  int line() const { return line_; }

 private:
  const ChatTemplateLimits& limits_;
  std::vector<Scope> scopes_;
  std::string result_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  int64_t alloc_ = 0;
  int call_depth_ = 0;
  int line_ = 0;
  std::vector<std::shared_ptr<ValueDict>> namespaces_;  // every namespace() made (see ~Renderer)
};

}  // namespace ltm::chat_detail
