// The chat template renderer's walk (Renderer, template_render.h): statements and expressions
// over the syntax tree (template_ast.h) with Python/jinja2 semantics (template_values.h), counting
// steps, bytes made and output against the limits; and ChatTemplate's parse() and render(),
// which turn errors into absl::Status values. The built-ins the walk calls (globals, macros,
// methods, filters, tests) are in template_builtins.cpp.
#include "runtime/chat/chat_template.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/chat/template_ast.h"
#include "runtime/chat/template_render.h"
#include "runtime/chat/template_values.h"

namespace ltm {
namespace chat_detail {
namespace {

// The names of the built-ins in template_builtins.cpp: the globals (Renderer::call) and the str
// and dict methods (Renderer::call_method).
const std::vector<std::string> kGlobals = {"range", "namespace", "dict", "raise_exception",
                                           "strftime_now"};
const std::vector<std::string> kStringMethods = {
    "strip", "lstrip", "rstrip",     "startswith", "endswith", "split", "upper",
    "lower", "title",  "capitalize", "replace",    "join",     "find",  "count"};
const std::vector<std::string> kDictMethods = {"items", "keys", "values", "get"};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

Value make_callable(Callable::Kind kind, std::string name, const Value* self = nullptr,
                    const Stmt* macro = nullptr) {
  auto c = std::make_shared<Callable>();
  c->kind = kind;
  c->name = std::move(name);
  if (self) c->self = std::make_shared<const Value>(*self);
  c->macro = macro;
  Value v;
  v.kind = K::kCallable;
  v.fn = std::move(c);
  return v;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Python's slice indices for a sequence of n items.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop,
                                   const Value& step) {
  const auto as_opt_int = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is(K::kNone) || v.is(K::kUndefined)) return std::nullopt;
    if (v.is(K::kInt)) return v.integer;
    if (v.is(K::kBool)) return v.boolean ? 1 : 0;
    render_error(absl::StrCat("slice ", what, " must be an integer or None, not ", type_name(v)));
  };
  const int64_t st = as_opt_int(step, "step").value_or(1);
  if (st == 0) render_error("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(as_opt_int(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(as_opt_int(stop, "stop"), st > 0 ? n : -1);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t i = b; i < e; i += st) idx.push_back(i);
  else
    for (int64_t i = b; i > e; i += st) idx.push_back(i);
  return idx;
}

}  // namespace

// ---- statements ----

Renderer::Flow Renderer::exec(const Body& body) {
  for (const auto& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::exec(const Stmt& s) {
  step();
  line_ = s.line;
  switch (s.kind) {
    case Stmt::Kind::kText: write(s.text); return Flow::kNormal;
    case Stmt::Kind::kOutput: write(to_str(eval(*s.expr))); return Flow::kNormal;
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.conds.size(); ++i) {
        if (truthy(eval(*s.conds[i]))) return exec(s.bodies[i]);
      }
      if (s.bodies.size() > s.conds.size()) return exec(s.bodies.back());
      return Flow::kNormal;
    case Stmt::Kind::kFor: exec_for(s); return Flow::kNormal;
    case Stmt::Kind::kSet: {
      Value v = eval(*s.expr);
      if (!s.text.empty()) {
        Value ns = lookup(s.targets[0]);
        if (!ns.is(K::kNamespace)) {
          render_error(absl::StrCat("cannot set attribute '", s.text, "' of ", type_name(ns),
                                    " '", s.targets[0], "' (only of a namespace())"));
        }
        for (auto& kv : *ns.ns) {
          if (kv.first == s.text) {
            kv.second = std::move(v);
            return Flow::kNormal;
          }
        }
        charge(sizeof(Value) + 32);
        ns.ns->emplace_back(s.text, std::move(v));
      } else {
        assign(s.targets, v);
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock: {
      std::string buf;
      std::string* saved = out_;
      out_ = &buf;
      exec(s.bodies[0]);
      out_ = saved;
      scopes_.back()[s.targets[0]] = Value::of_string(std::move(buf));
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro:
      scopes_.back()[s.text] = make_callable(Callable::Kind::kMacro, s.text, nullptr, &s);
      return Flow::kNormal;
    case Stmt::Kind::kBreak: return Flow::kBreak;
    case Stmt::Kind::kContinue: return Flow::kContinue;
    case Stmt::Kind::kBlock: return exec(s.bodies[0]);
  }
  return Flow::kNormal;
}

void Renderer::assign(const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    scopes_.back()[targets[0]] = v;
    return;
  }
  const ValueList items = iterate(v);
  if (items.size() != targets.size()) {
    render_error(
        absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
  }
  for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = items[i];
}

// The items a for loop visits: list items, dict keys, string code points; undefined: none.
ValueList Renderer::iterate(const Value& v) {
  switch (v.kind) {
    case K::kUndefined: return {};
    case K::kList: return *v.list;
    case K::kDict: {
      ValueList keys;
      for (const auto& kv : *v.dict) keys.push_back(Value::of_string(kv.first));
      charge(keys.size() * sizeof(Value));
      return keys;
    }
    case K::kString: {
      ValueList chars;
      for (const auto cp : code_points(*v.str))
        chars.push_back(Value::of_string(std::string(cp)));
      charge(chars.size() * (sizeof(Value) + 32));
      return chars;
    }
    default: render_error(absl::StrCat("'", type_name(v), "' object is not iterable"));
  }
}

void Renderer::exec_for(const Stmt& s) {
  ValueList items = iterate(eval(*s.expr));
  scopes_.emplace_back();
  if (s.cond) {  // the loop filter runs before loop.* is known
    ValueList kept;
    for (const Value& item : items) {
      step();
      assign(s.targets, item);
      if (truthy(eval(*s.cond))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    step();
    ValueDict loop = {
        {"index", Value::of_int(i + 1)},
        {"index0", Value::of_int(i)},
        {"revindex", Value::of_int(n - i)},
        {"revindex0", Value::of_int(n - i - 1)},
        {"first", Value::of_bool(i == 0)},
        {"last", Value::of_bool(i == n - 1)},
        {"length", Value::of_int(n)},
        {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
        {"nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item")},
    };
    scopes_.back()["loop"] = Value::of_dict(std::move(loop));  // freed next iteration
    assign(s.targets, items[i]);
    if (exec(s.bodies[0]) == Flow::kBreak) break;
  }
  scopes_.pop_back();
  if (n == 0 && s.bodies.size() > 1) exec(s.bodies[1]);
}

// ---- expressions ----

Value Renderer::lookup(const std::string& name) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    const auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  if (contains(kGlobals, name)) return make_callable(Callable::Kind::kBuiltin, name);
  return Value::undefined(absl::StrCat("'", name, "' is undefined"));
}

Value Renderer::get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case K::kUndefined: undefined_error(obj);
    case K::kDict:
      if (contains(kDictMethods, name)) return make_callable(Callable::Kind::kMethod, name, &obj);
      if (const Value* v = dict_find(*obj.dict, name)) return *v;
      break;
    case K::kNamespace:
      if (const Value* v = dict_find(*obj.ns, name)) return *v;
      break;
    case K::kString:
      if (contains(kStringMethods, name))
        return make_callable(Callable::Kind::kMethod, name, &obj);
      break;
    default: break;
  }
  return Value::undefined(
      absl::StrCat("'", type_name(obj), " object' has no attribute '", name, "'"));
}

Value Renderer::get_item(const Value& obj, const Value& key) {
  if (obj.is(K::kUndefined)) undefined_error(obj);
  if (key.is(K::kString) && (obj.is(K::kDict) || obj.is(K::kNamespace))) {
    const Value* v = dict_find(obj.is(K::kDict) ? *obj.dict : *obj.ns, *key.str);
    if (v) return *v;
    return get_attr(obj, *key.str);
  }
  if ((obj.is(K::kList) || obj.is(K::kString)) && (key.is(K::kInt) || key.is(K::kBool))) {
    int64_t i = key.is(K::kBool) ? key.boolean : key.integer;
    if (obj.is(K::kList)) {
      const int64_t n = static_cast<int64_t>(obj.list->size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return (*obj.list)[i];
    } else {
      const auto cps = code_points(*obj.str);
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::of_string(std::string(cps[i]));
    }
    return Value::undefined(
        absl::StrCat("'", type_name(obj), " object' has no element ", to_str(key)));
  }
  if (key.is(K::kString)) return get_attr(obj, *key.str);
  return Value::undefined(
      absl::StrCat("'", type_name(obj), " object' has no element ", repr(key)));
}

Value Renderer::eval(const Expr& e) {
  step();
  line_ = e.line;
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.value;
    case Expr::Kind::kName: return lookup(e.name);
    case Expr::Kind::kAttr: return get_attr(eval(*e.args[0]), e.name);
    case Expr::Kind::kItem: {
      Value obj = eval(*e.args[0]);
      return get_item(obj, eval(*e.args[1]));
    }
    case Expr::Kind::kSlice: return eval_slice(e);
    case Expr::Kind::kCall: {
      Value fn = eval(*e.args[0]);
      Args args;
      Kwargs kwargs;
      eval_args(e, &args, &kwargs);
      if (fn.is(K::kUndefined)) undefined_error(fn);
      if (!fn.is(K::kCallable))
        render_error(absl::StrCat("'", type_name(fn), "' object is not callable"));
      return call(*fn.fn, args, kwargs);
    }
    case Expr::Kind::kFilter: {
      Value v = eval(*e.args[0]);
      Args args;
      Kwargs kwargs;
      eval_args(e, &args, &kwargs);
      return filter(e.name, v, args, kwargs);
    }
    case Expr::Kind::kTest: {
      Value v = eval(*e.args[0]);
      Args args;
      Kwargs kwargs;
      eval_args(e, &args, &kwargs);
      return Value::of_bool(test(e.name, v, args) != e.negate);
    }
    case Expr::Kind::kUnary: {
      Value v = eval(*e.args[0]);
      if (e.name == "not") return Value::of_bool(!truthy(v));
      if (v.is(K::kUndefined)) undefined_error(v);
      if (v.is(K::kFloat)) return Value::of_float(e.name == "-" ? -v.number : v.number);
      if (v.is(K::kInt) || v.is(K::kBool)) {
        const int64_t i = v.is(K::kBool) ? v.boolean : v.integer;
        if (e.name == "-" && i == INT64_MIN) render_error("integer overflow");
        return Value::of_int(e.name == "-" ? -i : i);
      }
      render_error(absl::StrCat("bad operand type for unary ", e.name, ": '", type_name(v), "'"));
    }
    case Expr::Kind::kBinary: {
      if (e.name == "and") {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      if (e.name == "or") {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      Value a = eval(*e.args[0]);
      Value b = eval(*e.args[1]);
      line_ = e.line;
      return binary(e.name, a, b);
    }
    case Expr::Kind::kCompare: {
      Value a = eval(*e.args[0]);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value b = eval(*e.args[i + 1]);
        line_ = e.line;
        if (!compare(e.ops[i], a, b)) return Value::of_bool(false);
        a = std::move(b);
      }
      return Value::of_bool(true);
    }
    case Expr::Kind::kCond:
      if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
      if (e.args.size() > 2) return eval(*e.args[2]);
      return Value::undefined("the conditional expression had no else");
    case Expr::Kind::kList: {
      ValueList l;
      for (const auto& a : e.args) l.push_back(eval(*a));
      return made(Value::of_list(std::move(l)));
    }
    case Expr::Kind::kDict: {
      ValueDict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i]);
        if (!k.is(K::kString)) render_error("dict literal keys must be strings here");
        Value v = eval(*e.args[i + 1]);
        auto it =
            std::find_if(d.begin(), d.end(), [&](const auto& kv) { return kv.first == *k.str; });
        if (it != d.end())
          it->second = std::move(v);
        else
          d.emplace_back(*k.str, std::move(v));
      }
      return made(Value::of_dict(std::move(d)));
    }
  }
  return Value::undefined();
}

void Renderer::eval_args(const Expr& e, Args* args, Kwargs* kwargs) {
  for (size_t i = 1; i < e.args.size(); ++i) args->push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) kwargs->emplace_back(k, eval(*v));
}

Value Renderer::eval_slice(const Expr& e) {
  Value obj = eval(*e.args[0]);
  Value a = eval(*e.args[1]), b = eval(*e.args[2]), c = eval(*e.args[3]);
  line_ = e.line;
  if (obj.is(K::kUndefined)) undefined_error(obj);
  if (obj.is(K::kList)) {
    ValueList out;
    for (int64_t i : slice_indices(static_cast<int64_t>(obj.list->size()), a, b, c))
      out.push_back((*obj.list)[i]);
    return made(Value::of_list(std::move(out)));
  }
  if (obj.is(K::kString)) {
    const auto cps = code_points(*obj.str);
    std::string out;
    for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()), a, b, c)) out += cps[i];
    return str_value(std::move(out));
  }
  render_error(absl::StrCat("'", type_name(obj), "' object cannot be sliced"));
}

Value Renderer::binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return str_value(to_str(a) + to_str(b));
  if (a.is(K::kUndefined)) undefined_error(a);
  if (b.is(K::kUndefined)) undefined_error(b);
  const auto unsupported = [&]() -> Value {
    render_error(absl::StrCat("unsupported operand type(s) for ", op, ": '", type_name(a),
                              "' and '", type_name(b), "'"));
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = !a.is(K::kFloat) && !b.is(K::kFloat);
    if (op == "/") {
      if (as_double(b) == 0) render_error("division by zero");
      return Value::of_float(as_double(a) / as_double(b));
    }
    if (ints) {
      const int64_t x = as_int(a), y = as_int(b);
      int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) render_error("integer overflow");
        return Value::of_int(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) render_error("integer overflow");
        return Value::of_int(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) render_error("integer overflow");
        return Value::of_int(r);
      }
      if (op == "//" || op == "%") {
        if (y == 0) render_error("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) render_error("integer overflow");
        const int64_t q = floor_div(x, y);
        return Value::of_int(op == "//" ? q : x - q * y);
      }
      if (op == "**") {
        if (y < 0)
          return Value::of_float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t result = 1;
        for (int64_t i = 0; i < y; ++i) {
          step();
          if (__builtin_mul_overflow(result, x, &result)) render_error("integer overflow");
          if (result == 0 || result == 1) break;
        }
        return Value::of_int(result);
      }
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return Value::of_float(x + y);
    if (op == "-") return Value::of_float(x - y);
    if (op == "*") return Value::of_float(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) render_error("float division or modulo by zero");
      const double q = std::floor(x / y);
      return Value::of_float(op == "//" ? q : x - q * y);
    }
    if (op == "**") return Value::of_float(std::pow(x, y));
    return unsupported();
  }
  if (op == "+" && a.is(K::kString) && b.is(K::kString)) return str_value(*a.str + *b.str);
  if (op == "+" && a.is(K::kList) && b.is(K::kList)) {
    ValueList l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return made(Value::of_list(std::move(l)));
  }
  if (op == "*" && (a.is(K::kString) || a.is(K::kList) || b.is(K::kString) || b.is(K::kList))) {
    const Value& seq = a.is(K::kString) || a.is(K::kList) ? a : b;
    const Value& times = &seq == &a ? b : a;
    if (times.is(K::kFloat) || !times.is_number()) return unsupported();
    const int64_t n = std::max<int64_t>(0, as_int(times));
    const size_t unit = seq.is(K::kString) ? seq.str->size() : seq.list->size() * sizeof(Value);
    if (unit > 0 && n > limits_.max_alloc_bytes / static_cast<int64_t>(unit)) charge(SIZE_MAX);
    if (seq.is(K::kString)) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += *seq.str;
      return str_value(std::move(s));
    }
    ValueList l;
    for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.list->begin(), seq.list->end());
    return made(Value::of_list(std::move(l)));
  }
  return unsupported();
}

bool Renderer::in(const Value& needle, const Value& hay) {
  switch (hay.kind) {
    case K::kUndefined: return false;
    case K::kString:
      if (!needle.is(K::kString)) {
        render_error(absl::StrCat("'in <string>' requires string as left operand, not ",
                                  type_name(needle)));
      }
      return hay.str->find(*needle.str) != std::string::npos;
    case K::kList:
      for (const Value& v : *hay.list)
        if (equals(needle, v)) return true;
      return false;
    case K::kDict:
      if (!needle.is(K::kString)) return false;
      return dict_find(*hay.dict, *needle.str) != nullptr;
    default:
      render_error(absl::StrCat("argument of type '", type_name(hay), "' is not iterable"));
  }
}

bool Renderer::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return in(a, b);
  if (op == "notin") return !in(a, b);
  if (a.is(K::kUndefined)) undefined_error(a);
  if (b.is(K::kUndefined)) undefined_error(b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  return !less(a, b);  // >=
}

}  // namespace chat_detail

using chat_detail::TemplateError;

namespace {

// Length of the valid UTF-8 sequence at s[i] (as strict as a JSON encoder), 0 if invalid.
size_t utf8_len(std::string_view s, size_t i) {
  const auto at = [&](size_t k) -> unsigned {
    return k < s.size() ? static_cast<unsigned char>(s[k]) : 0;
  };
  const unsigned c = at(i);
  const auto cont = [&](size_t k, unsigned lo, unsigned hi) { return at(k) >= lo && at(k) <= hi; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2, 0x80, 0xBF) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

// An error message as callers can put it in a JSON reply: at most ~400 bytes, valid UTF-8 (a
// template's bytes or a raise_exception text may be neither).
std::string clean_message(std::string_view m) {
  constexpr size_t kMaxBytes = 400;
  std::string out;
  for (size_t i = 0; i < m.size();) {
    if (out.size() >= kMaxBytes) {
      out += "...";
      break;
    }
    const size_t n = utf8_len(m, i);
    if (n == 0) {
      out += '?';
      ++i;
    } else {
      out.append(m, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const chat_detail::Program> program)
    : program_(std::move(program)) {}

absl::StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  try {
    return ChatTemplate(chat_detail::parse_program(source));
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(clean_message(absl::StrCat("chat template: ", e.what())));
  }
}

absl::StatusOr<std::string> ChatTemplate::render(const nlohmann::ordered_json& context,
                                                 const ChatTemplateLimits& limits) const {
  if (!context.is_object() && !context.is_null()) {
    return absl::InvalidArgumentError("chat template: the context must be an object");
  }
  int line = 0;
  try {
    chat_detail::Scope scope;
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) scope[k] = chat_detail::from_json(v);
    }
    chat_detail::Renderer r(limits, std::move(scope));
    try {
      return r.run(program_->body);
    } catch (const TemplateError&) {
      line = r.line();
      throw;
    }
  } catch (const TemplateError& e) {
    switch (e.kind) {
      case TemplateError::Kind::kRaised:
        return absl::InvalidArgumentError(
            clean_message(absl::StrCat("chat template raised: ", e.what())));
      case TemplateError::Kind::kLimit: return absl::ResourceExhaustedError(e.what());
      default:
        return absl::InvalidArgumentError(
            clean_message(absl::StrCat("chat template: line ", line, ": ", e.what())));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("chat template: out of memory while rendering");
  }
}

absl::StatusOr<std::string> render_chat_template(std::string_view source,
                                                 const nlohmann::ordered_json& context,
                                                 const ChatTemplateLimits& limits) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::parse(source);
  if (!t.ok()) return t.status();
  return t->render(context, limits);
}

}  // namespace ltm
