// The chat template renderer: walks the syntax tree (template_ast.h) with Python/jinja2
// semantics (template_values.h), counting steps, bytes made and output against the limits.
#include "runtime/chat/chat_template.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "runtime/chat/template_ast.h"
#include "runtime/chat/template_values.h"

namespace ltm {
namespace chat_detail {
namespace {

using K = Value::Kind;
using Scope = std::unordered_map<std::string, Value>;
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

[[noreturn]] void render_error(const std::string& msg) {
  throw TemplateError(TemplateError::Kind::kRender, msg);
}

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

const Value* dict_find(const ValueDict& d, std::string_view key) {
  for (const auto& kv : d)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto drop = [&](char c) {
    if (chars == nullptr || chars->is(K::kNone)) return is_ascii_space(c);
    return chars->str->find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The title filter (not str.title): words start after spaces, '-', and opening brackets.
std::string jinja_title(const std::string& s) {
  std::string out;
  std::string word;
  const auto flush = [&] {
    out += capitalize(word);
    word.clear();
  };
  for (char c : s) {
    const bool sep = is_ascii_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      flush();
      out += c;
    } else {
      word += c;
    }
  }
  flush();
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between code points and at both ends
    const auto cps = code_points(s);
    int64_t n = 0;
    for (const auto cp : cps) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
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

class Renderer {
 public:
  Renderer(const ChatTemplateLimits& limits, Scope context) : limits_(limits) {
    scopes_.push_back(std::move(context));
    scopes_.emplace_back();  // the template's own top-level variables
  }

  std::string run(const Body& body) {
    out_ = &result_;
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

  // ---- statements ----

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow f = exec(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s) {
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

  void assign(const std::vector<std::string>& targets, const Value& v) {
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
  ValueList iterate(const Value& v) {
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

  void exec_for(const Stmt& s) {
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

  Value lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    if (contains(kGlobals, name)) return make_callable(Callable::Kind::kBuiltin, name);
    return Value::undefined(absl::StrCat("'", name, "' is undefined"));
  }

  [[noreturn]] void undefined_error(const Value& v) {
    render_error(v.str && !v.str->empty() ? *v.str : "undefined value");
  }

  Value get_attr(const Value& obj, const std::string& name) {
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

  Value get_item(const Value& obj, const Value& key) {
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

  Value eval(const Expr& e) {
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

  void eval_args(const Expr& e, Args* args, Kwargs* kwargs) {
    for (size_t i = 1; i < e.args.size(); ++i) args->push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) kwargs->emplace_back(k, eval(*v));
  }

  Value eval_slice(const Expr& e) {
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

  static int64_t as_int(const Value& v) { return v.is(K::kBool) ? v.boolean : v.integer; }
  static double as_double(const Value& v) {
    return v.is(K::kFloat) ? v.number : static_cast<double>(as_int(v));
  }

  Value binary(const std::string& op, const Value& a, const Value& b) {
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

  bool in(const Value& needle, const Value& hay) {
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

  bool compare(const std::string& op, const Value& a, const Value& b) {
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

  // ---- calls ----

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

  Value call(const Callable& fn, const Args& args, const Kwargs& kw) {
    if (fn.kind == Callable::Kind::kMethod) return call_method(*fn.self, fn.name, args, kw);
    if (fn.kind == Callable::Kind::kMacro) return call_macro(*fn.macro, args, kw);
    if (fn.name == "raise_exception") {
      throw TemplateError(TemplateError::Kind::kRaised,
                          args.empty() ? std::string() : to_str(args[0]));
    }
    if (fn.name == "range") {
      if (args.empty() || args.size() > 3) render_error("range expects 1 to 3 arguments");
      for (const Value& a : args) {
        if (!a.is(K::kInt) && !a.is(K::kBool))
          render_error(absl::StrCat("range: '", type_name(a), "' is not an integer"));
      }
      const int64_t start = args.size() == 1 ? 0 : as_int(args[0]);
      const int64_t stop = args.size() == 1 ? as_int(args[0]) : as_int(args[1]);
      const int64_t stp = args.size() == 3 ? as_int(args[2]) : 1;
      if (stp == 0) render_error("range() arg 3 must not be zero");
      ValueList l;
      for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp) {
        charge(sizeof(Value));
        l.push_back(Value::of_int(i));
        if ((stp > 0 && i > INT64_MAX - stp) || (stp < 0 && i < INT64_MIN - stp)) break;
      }
      return Value::of_list(std::move(l));
    }
    if (fn.name == "namespace" || fn.name == "dict") {
      ValueDict d;
      if (!args.empty()) {
        if (!args[0].is(K::kDict))
          render_error(absl::StrCat(fn.name, "() takes a dict or keyword arguments"));
        d = *args[0].dict;
      }
      for (const auto& arg : kw) {
        const std::string& key = arg.first;
        auto it = std::find_if(d.begin(), d.end(), [&](const auto& kv) { return kv.first == key; });
        if (it != d.end())
          it->second = arg.second;
        else
          d.emplace_back(key, arg.second);
      }
      charge(d.size() * (sizeof(Value) + 32));
      if (fn.name == "dict") return Value::of_dict(std::move(d));
      Value ns;
      ns.kind = K::kNamespace;
      ns.ns = std::make_shared<ValueDict>(std::move(d));
      return ns;
    }
    if (fn.name == "strftime_now") {
      const std::string& fmt = need_str(arg(args, kw, 0, "format"), "strftime_now");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      return str_value(std::string(buf, n));
    }
    render_error(absl::StrCat("'", fn.name, "' is not callable"));
  }

  Value call_macro(const Stmt& m, const Args& args, const Kwargs& kw) {
    if (call_depth_ >= limits_.max_call_depth) {
      throw TemplateError(TemplateError::Kind::kLimit,
                          absl::StrCat("chat template: macro calls nest deeper than ",
                                       limits_.max_call_depth, " (limit)"));
    }
    if (args.size() > m.targets.size()) {
      render_error(absl::StrCat("macro '", m.text, "' takes ", m.targets.size(), " arguments, got ",
                                args.size()));
    }
    std::vector<Scope> saved = std::move(scopes_);
    scopes_ = {saved[0], saved[1], Scope()};
    for (const auto& [k, v] : kw) {
      if (std::find(m.targets.begin(), m.targets.end(), k) == m.targets.end()) {
        scopes_ = std::move(saved);
        render_error(absl::StrCat("macro '", m.text, "' has no parameter '", k, "'"));
      }
    }
    std::string buf;
    std::string* saved_out = out_;
    ++call_depth_;
    const auto restore = [&] {
      --call_depth_;
      out_ = saved_out;
      scopes_ = std::move(saved);
    };
    try {
      for (size_t i = 0; i < m.targets.size(); ++i) {
        const Value* given = i < args.size() ? &args[i] : kwarg(kw, m.targets[i].c_str());
        if (given)
          scopes_.back()[m.targets[i]] = *given;
        else if (m.conds[i])
          scopes_.back()[m.targets[i]] = eval(*m.conds[i]);
        else
          scopes_.back()[m.targets[i]] =
              Value::undefined(absl::StrCat("'", m.targets[i], "' is undefined"));
      }
      out_ = &buf;
      exec(m.bodies[0]);
    } catch (...) {
      restore();
      throw;
    }
    restore();
    return Value::of_string(std::move(buf));
  }

  Value call_method(const Value& self, const std::string& name, const Args& args,
                    const Kwargs& kw) {
    if (self.is(K::kDict)) {
      const ValueDict& d = *self.dict;
      if (name == "items") {
        ValueList l;
        for (const auto& [k, v] : d) l.push_back(Value::of_list({Value::of_string(k), v}));
        return made(Value::of_list(std::move(l)));
      }
      if (name == "keys" || name == "values") {
        ValueList l;
        for (const auto& [k, v] : d) l.push_back(name == "keys" ? Value::of_string(k) : v);
        return made(Value::of_list(std::move(l)));
      }
      // get(key, default=None)
      const Value* key = arg(args, kw, 0, "key");
      const Value* found = key && key->is(K::kString) ? dict_find(d, *key->str) : nullptr;
      if (found) return *found;
      const Value* dflt = arg(args, kw, 1, "default");
      return dflt ? *dflt : Value::none();
    }
    const std::string& s = *self.str;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = arg(args, kw, 0, "chars");
      if (chars && !chars->is(K::kNone) && !chars->is(K::kString))
        render_error(name + " arg must be None or str");
      return str_value(strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "startswith" || name == "endswith") {
      const Value* what = arg(args, kw, 0, "prefix");
      ValueList options;
      if (what && what->is(K::kList))
        options = *what->list;
      else if (what)
        options.push_back(*what);
      for (const Value& o : options) {
        const std::string& p = need_str(&o, name);
        if (name == "startswith"
                ? s.compare(0, p.size(), p) == 0
                : (s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)) {
          return Value::of_bool(true);
        }
      }
      if (options.empty()) render_error(name + " needs an argument");
      return Value::of_bool(false);
    }
    if (name == "split") {
      const Value* sep = arg(args, kw, 0, "sep");
      const Value* maxv = arg(args, kw, 1, "maxsplit");
      int64_t maxsplit = maxv && maxv->is(K::kInt) ? maxv->integer : -1;
      ValueList parts;
      if (!sep || sep->is(K::kNone)) {
        size_t i = 0;
        while (true) {
          while (i < s.size() && is_ascii_space(s[i])) ++i;
          if (i >= s.size()) break;
          if (maxsplit == 0) {
            size_t e = s.size();
            while (e > i && is_ascii_space(s[e - 1])) --e;
            parts.push_back(Value::of_string(s.substr(i, e - i)));
            break;
          }
          size_t j = i;
          while (j < s.size() && !is_ascii_space(s[j])) ++j;
          parts.push_back(Value::of_string(s.substr(i, j - i)));
          --maxsplit;
          i = j;
        }
      } else {
        const std::string& sp = need_str(sep, "split");
        if (sp.empty()) render_error("split: empty separator");
        size_t pos = 0;
        while (true) {
          const size_t at = maxsplit == 0 ? std::string::npos : s.find(sp, pos);
          if (at == std::string::npos) {
            parts.push_back(Value::of_string(s.substr(pos)));
            break;
          }
          parts.push_back(Value::of_string(s.substr(pos, at - pos)));
          pos = at + sp.size();
          --maxsplit;
        }
      }
      charge(s.size());
      return made(Value::of_list(std::move(parts)));
    }
    if (name == "upper") return str_value(to_upper(s));
    if (name == "lower") return str_value(to_lower(s));
    if (name == "title") return str_value(title(s));
    if (name == "capitalize") return str_value(capitalize(s));
    if (name == "replace") {
      const Value* cnt = arg(args, kw, 2, "count");
      return str_value(replace(s, need_str(arg(args, kw, 0, "old"), "replace"),
                               need_str(arg(args, kw, 1, "new"), "replace"),
                               cnt ? as_int(*cnt) : -1));
    }
    if (name == "join") {
      const Value* items = arg(args, kw, 0, "iterable");
      if (!items) render_error("join needs an argument");
      std::string out;
      bool first = true;
      for (const Value& v : iterate(*items)) {
        if (!first) out += s;
        first = false;
        out += need_str(&v, "join");
      }
      return str_value(std::move(out));
    }
    if (name == "find" || name == "count") {
      const std::string& sub = need_str(arg(args, kw, 0, "sub"), name);
      if (name == "find") {
        const size_t at = s.find(sub);
        return Value::of_int(at == std::string::npos
                                 ? -1
                                 : static_cast<int64_t>(code_points(s.substr(0, at)).size()));
      }
      if (sub.empty()) return Value::of_int(static_cast<int64_t>(code_points(s).size()) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::of_int(n);
    }
    render_error(absl::StrCat("'str' object has no method '", name, "'"));
  }

  // ---- filters and tests ----

  // The value of `attribute` (dotted: "a.b", digits index lists) of an item, as getattr does.
  Value attribute_of(const Value& item, const std::string& path) {
    Value v = item;
    size_t pos = 0;
    while (true) {
      const size_t dot = path.find('.', pos);
      const std::string part =
          path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                       [](char c) { return c >= '0' && c <= '9'; });
      v = digits && v.is(K::kList) ? get_item(v, Value::of_int(std::stoll(part)))
                                   : get_item(v, Value::of_string(part));
      if (dot == std::string::npos) return v;
      pos = dot + 1;
    }
  }

  Value filter(const std::string& name, const Value& v, const Args& args, const Kwargs& kw) {
    if (name == "default" || name == "d") {
      const Value* dflt = arg(args, kw, 0, "default_value");
      const Value* boolean = arg(args, kw, 1, "boolean");
      const bool use = v.is(K::kUndefined) || (boolean && truthy(*boolean) && !truthy(v));
      if (!use) return v;
      return dflt ? *dflt : Value::of_string("");
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case K::kUndefined: return Value::of_int(0);
        case K::kString: return Value::of_int(static_cast<int64_t>(code_points(*v.str).size()));
        case K::kList: return Value::of_int(static_cast<int64_t>(v.list->size()));
        case K::kDict: return Value::of_int(static_cast<int64_t>(v.dict->size()));
        default: render_error(absl::StrCat("object of type '", type_name(v), "' has no len()"));
      }
    }
    if (name == "tojson") {
      JsonStyle style;
      const Value* indent = arg(args, kw, 0, "indent");
      if (indent && !indent->is(K::kNone)) {
        style.has_indent = true;
        style.item_sep = ",";
        if (indent->is(K::kString))
          style.indent = *indent->str;
        else if (indent->is(K::kInt))
          style.indent = std::string(std::clamp<int64_t>(indent->integer, 0, 64), ' ');
        else
          render_error("tojson: indent must be an integer or a string");
      }
      if (const Value* seps = kwarg(kw, "separators");
          seps && seps->is(K::kList) && seps->list->size() == 2) {
        style.item_sep = need_str(&(*seps->list)[0], "tojson separators");
        style.key_sep = need_str(&(*seps->list)[1], "tojson separators");
      }
      if (const Value* sk = kwarg(kw, "sort_keys")) style.sort_keys = truthy(*sk);
      if (const Value* ea = kwarg(kw, "ensure_ascii"); ea && truthy(*ea)) {
        render_error("tojson: ensure_ascii=True is not supported");
      }
      return str_value(to_json(v, style));
    }
    if (name == "string") return v.is(K::kString) ? v : str_value(to_str(v));
    if (name == "safe") return v;
    if (name == "trim" || name == "upper" || name == "lower" || name == "capitalize" ||
        name == "title") {
      const std::string s = to_str(v);
      if (name == "trim") return str_value(strip(s, arg(args, kw, 0, "chars"), true, true));
      if (name == "title") return str_value(jinja_title(s));
      if (name == "capitalize") return str_value(capitalize(s));
      return call_method(Value::of_string(s), name, {}, {});
    }
    if (name == "replace") {
      const Value* cnt = arg(args, kw, 2, "count");
      return str_value(replace(to_str(v), need_str(arg(args, kw, 0, "old"), "replace"),
                               need_str(arg(args, kw, 1, "new"), "replace"),
                               cnt && !cnt->is(K::kNone) ? as_int(*cnt) : -1));
    }
    if (name == "int" || name == "float") {
      const Value* dflt = arg(args, kw, 0, "default");
      const Value fallback = dflt ? *dflt : name == "int" ? Value::of_int(0) : Value::of_float(0);
      double d = 0;
      if (v.is_number()) {
        d = as_double(v);
        if (name == "int" && !v.is(K::kFloat)) return Value::of_int(as_int(v));
      } else if (v.is(K::kString)) {
        const std::string s = strip(*v.str, nullptr, true, true);
        char* end = nullptr;
        if (name == "int") {
          errno = 0;
          const long long i = std::strtoll(s.c_str(), &end, 10);
          if (!s.empty() && *end == '\0' && errno == 0) return Value::of_int(i);
        }
        d = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0') return fallback;
      } else {
        return fallback;
      }
      if (name == "float") return Value::of_float(d);
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
      return Value::of_int(static_cast<int64_t>(d));
    }
    if (name == "abs") {
      if (v.is(K::kFloat)) return Value::of_float(std::fabs(v.number));
      if (v.is(K::kInt) || v.is(K::kBool)) {
        if (as_int(v) == INT64_MIN) render_error("integer overflow");
        return Value::of_int(std::llabs(as_int(v)));
      }
      render_error(absl::StrCat("bad operand type for abs(): '", type_name(v), "'"));
    }
    if (name == "first" || name == "last") {
      ValueList items = iterate(v);
      if (items.empty())
        return Value::undefined(absl::StrCat("No ", name, " item, sequence was empty."));
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return made(Value::of_list(iterate(v)));
    if (name == "reverse") {
      if (v.is(K::kString)) {
        auto cps = code_points(*v.str);
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return str_value(std::move(out));
      }
      ValueList items = iterate(v);
      std::reverse(items.begin(), items.end());
      return made(Value::of_list(std::move(items)));
    }
    if (name == "items") {
      if (v.is(K::kUndefined)) return Value::of_list({});
      if (!v.is(K::kDict))
        render_error(absl::StrCat("items: '", type_name(v), "' is not a mapping"));
      return call_method(v, "items", {}, {});
    }
    if (name == "join") {
      const Value* sep = arg(args, kw, 0, "d");
      const Value* attr = arg(args, kw, 1, "attribute");
      const std::string d = sep ? to_str(*sep) : "";
      std::string out;
      bool first = true;
      for (const Value& item : iterate(v)) {
        if (!first) out += d;
        first = false;
        out += to_str(attr ? attribute_of(item, to_str(*attr)) : item);
        charge(0);
      }
      return str_value(std::move(out));
    }
    if (name == "map") {
      ValueList out;
      const Value* attr = kwarg(kw, "attribute");
      for (const Value& item : iterate(v)) {
        step();
        if (attr) {
          Value x = attribute_of(item, to_str(*attr));
          if (x.is(K::kUndefined)) {
            if (const Value* dflt = kwarg(kw, "default")) x = *dflt;
          }
          out.push_back(std::move(x));
        } else {
          if (args.empty() || !args[0].is(K::kString))
            render_error("map needs a filter name or attribute=");
          out.push_back(filter(*args[0].str, item, Args(args.begin() + 1, args.end()), {}));
        }
      }
      return made(Value::of_list(std::move(out)));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "selectattr" || name == "select";
      size_t i = 0;
      std::string attr;
      if (by_attr) {
        if (args.empty()) render_error(name + " needs an attribute name");
        attr = to_str(args[i++]);
      }
      std::string test_name;
      if (i < args.size()) test_name = need_str(&args[i++], name);
      const Args test_args(args.begin() + std::min(i, args.size()), args.end());
      ValueList out;
      for (const Value& item : iterate(v)) {
        step();
        const Value x = by_attr ? attribute_of(item, attr) : item;
        const bool pass = test_name.empty() ? truthy(x) : test(test_name, x, test_args);
        if (pass == keep_if) out.push_back(item);
      }
      return made(Value::of_list(std::move(out)));
    }
    render_error(absl::StrCat("no filter named '", name, "'"));
  }

  bool test(const std::string& name, const Value& v, const Args& args) {
    const auto need_arg = [&]() -> const Value& {
      if (args.empty()) render_error(absl::StrCat("test '", name, "' needs an argument"));
      return args[0];
    };
    if (name == "defined") return !v.is(K::kUndefined);
    if (name == "undefined") return v.is(K::kUndefined);
    if (name == "none") return v.is(K::kNone);
    if (name == "boolean") return v.is(K::kBool);
    if (name == "true") return v.is(K::kBool) && v.boolean;
    if (name == "false") return v.is(K::kBool) && !v.boolean;
    if (name == "integer") return v.is(K::kInt);
    if (name == "float") return v.is(K::kFloat);
    if (name == "number") return v.is_number();
    if (name == "string") return v.is(K::kString);
    if (name == "mapping") return v.is(K::kDict);
    if (name == "iterable")
      return v.is(K::kString) || v.is(K::kList) || v.is(K::kDict) || v.is(K::kUndefined);
    if (name == "sequence") return v.is(K::kString) || v.is(K::kList) || v.is(K::kDict);
    if (name == "callable") return v.is(K::kCallable);
    if (name == "equalto" || name == "eq" || name == "==") return equals(v, need_arg());
    if (name == "ne" || name == "!=") return !equals(v, need_arg());
    if (name == "sameas") {
      const Value& o = need_arg();
      return v.kind == o.kind && (v.is(K::kNone) || (v.is(K::kBool) && v.boolean == o.boolean));
    }
    if (name == "lt" || name == "lessthan" || name == "<") return compare("<", v, need_arg());
    if (name == "le" || name == "<=") return compare("<=", v, need_arg());
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(">", v, need_arg());
    if (name == "ge" || name == ">=") return compare(">=", v, need_arg());
    if (name == "in") return in(v, need_arg());
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (!v.is(K::kInt) && !v.is(K::kBool))
        render_error(absl::StrCat("test '", name, "' needs an integer"));
      if (name == "divisibleby") {
        const Value& d = need_arg();
        if (!d.is(K::kInt) || d.integer == 0) render_error("divisibleby needs a non-zero integer");
        return as_int(v) % d.integer == 0;
      }
      return (as_int(v) % 2 != 0) == (name == "odd");
    }
    if (name == "lower" || name == "upper") {  // str.islower() / str.isupper()
      if (!v.is(K::kString)) return false;
      const std::string lower = to_lower(*v.str), upper = to_upper(*v.str);
      if (lower == upper) return false;  // nothing cased
      return *v.str == (name == "lower" ? lower : upper);
    }
    render_error(absl::StrCat("no test named '", name, "'"));
  }

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
};

}  // namespace
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
