// The chat template renderer's built-ins (Renderer, template_render.h), which the walk in
// chat_template.cpp calls: the globals (range, namespace, dict, raise_exception, strftime_now),
// macro calls, string and dict methods, filters and tests.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/chat/template_ast.h"
#include "runtime/chat/template_render.h"
#include "runtime/chat/template_values.h"

namespace ltm::chat_detail {
namespace {

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

}  // namespace

// ---- calls ----

Value Renderer::call(const Callable& fn, const Args& args, const Kwargs& kw) {
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
    namespaces_.push_back(ns.ns);
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

Value Renderer::call_macro(const Stmt& m, const Args& args, const Kwargs& kw) {
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

Value Renderer::call_method(const Value& self, const std::string& name, const Args& args,
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
Value Renderer::attribute_of(const Value& item, const std::string& path) {
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

Value Renderer::filter(const std::string& name, const Value& v, const Args& args,
                       const Kwargs& kw) {
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
      // std::string(","), not ",": GCC 12 at -O2 warns (-Wrestrict, a false positive) outside
      // the unity build.
      style.item_sep = std::string(",");
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

bool Renderer::test(const std::string& name, const Value& v, const Args& args) {
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

}  // namespace ltm::chat_detail
