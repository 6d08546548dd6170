// Python semantics of chat template values; see template_values.h.
#include "runtime/chat/template_values.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace ltm::chat_detail {

using K = Value::Kind;

namespace {

thread_local WalkBudget* walk_budget = nullptr;

void walk_step() {
  WalkBudget* b = walk_budget;
  if (b != nullptr && ++*b->steps > b->max_steps) {
    throw TemplateError(TemplateError::Kind::kLimit,
                        absl::StrCat("chat template: the render took more than ", b->max_steps,
                                     " steps (limit)"));
  }
}

void walk_wrote(const std::string& out) {
  WalkBudget* b = walk_budget;
  if (b != nullptr && static_cast<int64_t>(out.size()) > b->max_bytes) {
    throw TemplateError(TemplateError::Kind::kLimit,
                        absl::StrCat("chat template: the render made more than ", b->max_bytes,
                                     " bytes of values (limit)"));
  }
}

}  // namespace

WalkBudgetScope::WalkBudgetScope(WalkBudget* budget) : saved_(walk_budget) {
  walk_budget = budget;
}
WalkBudgetScope::~WalkBudgetScope() { walk_budget = saved_; }

void value_too_deep() {
  throw TemplateError(TemplateError::Kind::kLimit,
                      absl::StrCat("chat template: values nest more than ", kMaxValueDepth,
                                   " deep (limit)"));
}

Value from_json(const nlohmann::ordered_json& j, int max_depth) {
  if (max_depth <= 0) {
    throw TemplateError(TemplateError::Kind::kLimit, "chat template: context nests too deeply");
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::of_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::of_int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::of_float(static_cast<double>(u));
      return Value::of_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::of_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::of_string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e, max_depth - 1));
      return Value::of_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      d.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.emplace_back(k, from_json(e, max_depth - 1));
      return Value::of_dict(std::move(d));
    }
    default: return Value::none();  // binary, discarded: not produced by JSON text
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case K::kUndefined: return "undefined";
    case K::kNone: return "NoneType";
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kFloat: return "float";
    case K::kString: return "str";
    case K::kList: return "list";
    case K::kDict: return "dict";
    case K::kNamespace: return "Namespace";
    case K::kCallable: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case K::kUndefined:
    case K::kNone: return false;
    case K::kBool: return v.boolean;
    case K::kInt: return v.integer != 0;
    case K::kFloat: return v.number != 0;
    case K::kString: return !v.str->empty();
    case K::kList: return !v.list->empty();
    case K::kDict: return !v.dict->empty();
    case K::kNamespace:
    case K::kCallable: return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional when -4 <= exponent < 16.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const size_t e_at = sci.find('e');
  std::string mant = sci.substr(0, e_at);
  const int exp10 = std::atoi(sci.c_str() + e_at + 1);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp10 - 1), '0');
      out += digits;
    } else if (static_cast<int>(digits.size()) <= exp10 + 1) {
      out += digits;
      out.append(exp10 + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, exp10 + 1);
      out += '.';
      out.append(digits, exp10 + 1);
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1);
  }
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + ebuf;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

double as_double(const Value& v) {
  return v.kind == K::kFloat  ? v.number
         : v.kind == K::kBool ? (v.boolean ? 1 : 0)
                              : static_cast<double>(v.integer);
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonStyle& st, int level) {
  walk_step();
  walk_wrote(out);
  const auto newline = [&](int lvl) {
    if (!st.has_indent) return;
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += st.indent;
  };
  switch (v.kind) {
    case K::kNone: out += "null"; return;
    case K::kBool: out += v.boolean ? "true" : "false"; return;
    case K::kInt: out += std::to_string(v.integer); return;
    case K::kFloat:
      if (std::isnan(v.number))
        out += "NaN";
      else if (std::isinf(v.number))
        out += v.number < 0 ? "-Infinity" : "Infinity";
      else
        out += float_repr(v.number);
      return;
    case K::kString: json_string(out, *v.str); return;
    case K::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) out += st.item_sep;
        newline(level + 1);
        json_value(out, (*v.list)[i], st, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case K::kDict: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += st.item_sep;
        newline(level + 1);
        json_string(out, items[i]->first);
        out += st.key_sep;
        json_value(out, items[i]->second, st, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      throw TemplateError(
          TemplateError::Kind::kRender,
          absl::StrCat("Object of type ", type_name(v), " is not JSON serializable"));
  }
}

}  // namespace

namespace {

// repr at `level` levels down: lists and dicts are at most kMaxValueDepth deep by construction,
// but namespaces can hold each other, in a chain or a cycle (`{% set ns.a = ns %}`): the walk
// stops there. (Python prints a cycle as `{...}`; a template that prints one gets an error.)
void repr_into(std::string& out, const Value& v, uint32_t level) {
  if (level > kMaxValueDepth) value_too_deep();
  walk_step();
  walk_wrote(out);
  switch (v.kind) {
    case K::kString: out += repr_string(*v.str); return;
    case K::kList:
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) out += ", ";
        repr_into(out, (*v.list)[i], level + 1);
      }
      out += ']';
      return;
    case K::kDict:
    case K::kNamespace: {
      const ValueDict& d = v.is(K::kDict) ? *v.dict : *v.ns;
      if (v.is(K::kNamespace)) out += "<Namespace ";
      out += '{';
      for (size_t i = 0; i < d.size(); ++i) {
        if (i > 0) out += ", ";
        out += repr_string(d[i].first);
        out += ": ";
        repr_into(out, d[i].second, level + 1);
      }
      out += '}';
      if (v.is(K::kNamespace)) out += '>';
      return;
    }
    default: out += to_str(v); return;
  }
}

}  // namespace

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case K::kUndefined: return "";
    case K::kNone: return "None";
    case K::kBool: return v.boolean ? "True" : "False";
    case K::kInt: return std::to_string(v.integer);
    case K::kFloat: return float_repr(v.number);
    case K::kString: return *v.str;
    case K::kCallable: return "<function " + v.fn->name + ">";
    default: return repr(v);
  }
}

bool equals(const Value& a, const Value& b) {
  walk_step();
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::kFloat && b.kind != K::kFloat) {
      const int64_t x = a.kind == K::kBool ? a.boolean : a.integer;
      const int64_t y = b.kind == K::kBool ? b.boolean : b.integer;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return *a.str == *b.str;
    case K::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case K::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& item : *a.dict) {
        const auto it = std::find_if(b.dict->begin(), b.dict->end(),
                                     [&](const auto& kv) { return kv.first == item.first; });
        if (it == b.dict->end() || !equals(item.second, it->second)) return false;
      }
      return true;
    case K::kNamespace: return a.ns == b.ns;
    case K::kCallable: return a.fn == b.fn;
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  walk_step();
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::kFloat && b.kind != K::kFloat) {
      return (a.kind == K::kBool ? a.boolean : a.integer) <
             (b.kind == K::kBool ? b.boolean : b.integer);
    }
    return as_double(a) < as_double(b);
  }
  if (a.kind == K::kString && b.kind == K::kString) return *a.str < *b.str;  // bytes: code points
  if (a.kind == K::kList && b.kind == K::kList) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      if (!equals((*a.list)[i], (*b.list)[i])) return less((*a.list)[i], (*b.list)[i]);
    }
    return a.list->size() < b.list->size();
  }
  throw TemplateError(TemplateError::Kind::kRender,
                      absl::StrCat("'<' not supported between instances of '", type_name(a),
                                   "' and '", type_name(b), "'"));
}

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_value(out, v, style, 0);
  return out;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        n = 1;
        break;
      }
    }
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

namespace {

uint32_t decode(std::string_view cp) {
  const unsigned char c = cp[0];
  if (cp.size() == 1) return c;
  uint32_t v = c & (0xFF >> (cp.size() + 1));
  for (size_t i = 1; i < cp.size(); ++i) v = (v << 6) | (static_cast<unsigned char>(cp[i]) & 0x3F);
  return v;
}

void encode(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Latin Extended-A's case pairs: in [0x100, 0x138) and [0x14A, 0x178) the upper case letter is
// even; in [0x139, 0x149) and [0x179, 0x17F) it is odd.
bool ext_a_pair(uint32_t cp, bool* is_upper) {
  if ((cp >= 0x100 && cp < 0x138) || (cp >= 0x14A && cp < 0x178)) {
    *is_upper = cp % 2 == 0;
    return true;
  }
  if ((cp >= 0x139 && cp < 0x149) || (cp >= 0x179 && cp < 0x17F)) {
    *is_upper = cp % 2 == 1;
    return true;
  }
  return false;
}

uint32_t upper_cp(uint32_t c) {
  bool up = false;
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) ||
      (c >= 0x430 && c <= 0x44F))
    return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if (ext_a_pair(c, &up)) return up ? c : c - 1;
  switch (c) {
    case 0xB5: return 0x39C;
    case 0xFF: return 0x178;
    case 0x131: return 'I';
    case 0x17F: return 'S';
    case 0x3C2: return 0x3A3;
    case 0x3AC: return 0x386;
    case 0x3AD:
    case 0x3AE:
    case 0x3AF: return c - 0x25;
    case 0x3CC: return 0x38C;
    case 0x3CD:
    case 0x3CE: return c - 0x3F;
    default: return c;
  }
}

uint32_t lower_cp(uint32_t c) {
  bool up = false;
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) ||
      (c >= 0x410 && c <= 0x42F))
    return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (ext_a_pair(c, &up)) return up ? c + 1 : c;
  switch (c) {
    case 0x178: return 0xFF;
    case 0x386: return 0x3AC;
    case 0x388:
    case 0x389:
    case 0x38A: return c + 0x25;
    case 0x38C: return 0x3CC;
    case 0x38E:
    case 0x38F: return c + 0x3F;
    default: return c;
  }
}

void put_upper(std::string& out, std::string_view cp) {
  const uint32_t c = decode(cp);
  if (c == 0xDF) {
    out += "SS";
    return;
  }
  const uint32_t u = upper_cp(c);
  if (u == c)
    out += cp;
  else
    encode(out, u);
}

void put_lower(std::string& out, std::string_view cp) {
  const uint32_t c = decode(cp);
  if (c == 0x130) {
    out += "i\xcc\x87";
    return;
  }  // İ -> i + combining dot above
  const uint32_t l = lower_cp(c);
  if (l == c)
    out += cp;
  else
    encode(out, l);
}

bool is_cased(std::string_view cp) {
  const uint32_t c = decode(cp);
  return c == 0xDF || upper_cp(c) != c || lower_cp(c) != c;
}

}  // namespace

std::string to_upper(std::string_view s) {
  std::string out;
  for (const auto cp : code_points(s)) put_upper(out, cp);
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out;
  for (const auto cp : code_points(s)) put_lower(out, cp);
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (const auto cp : code_points(s)) {
    if (first)
      put_upper(out, cp);
    else
      put_lower(out, cp);
    first = false;
  }
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (const auto cp : code_points(s)) {
    const bool cased = is_cased(cp);
    if (!cased)
      out += cp;
    else if (prev_cased)
      put_lower(out, cp);
    else
      put_upper(out, cp);
    prev_cased = cased;
  }
  return out;
}

}  // namespace ltm::chat_detail
