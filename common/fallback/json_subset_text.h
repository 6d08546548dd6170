// The text side of the GPU-only build's JSON stand-in (json_subset.h, which includes this header
// and lists what the subset does): the exceptions it throws, with nlohmann's kinds and ids; the
// writer's pieces that need no value (doubles in their shortest round-trip form, strings escaped
// as nlohmann escapes them), which basic_json::dump calls; and the recursive-descent SAX parser
// behind basic_json::sax_parse. Nothing here knows the value type: the parser hands its events to
// a handler, the writers append to a std::string.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "common/utf8.h"

namespace ltm::json_subset {

enum class error_handler_t { strict, replace, ignore };

class exception : public std::exception {
 public:
  const int id;
  const char* what() const noexcept override { return message_.c_str(); }

 protected:
  exception(int id_, const std::string& kind, const std::string& what)
      : id(id_), message_("[json." + kind + "." + std::to_string(id_) + "] " + what) {}

 private:
  std::string message_;
};
class parse_error : public exception {
 public:
  parse_error(int id_, const std::string& what) : exception(id_, "parse_error", what) {}
};
class type_error : public exception {
 public:
  type_error(int id_, const std::string& what) : exception(id_, "type_error", what) {}
};
class out_of_range : public exception {
 public:
  out_of_range(int id_, const std::string& what) : exception(id_, "out_of_range", what) {}
};

namespace detail {

// The shortest decimal digits that read back as v, laid out as nlohmann lays them out: plain
// decimals while the point falls within 15 digits of the first (or 4 zeros after "0."), with
// ".0" on whole numbers; else d.ddde+XX.
inline void write_double(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  if (v == 0.0) {
    out += std::signbit(v) ? "-0.0" : "0.0";
    return;
  }
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string text(buf);
  if (text[0] == '-') {
    out += '-';
    text.erase(0, 1);
  }
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits = text.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // the point
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int len = static_cast<int>(digits.size()), n = exponent + 1;
  if (len <= n && n <= 15) {
    out += digits + std::string(static_cast<size_t>(n - len), '0') + ".0";
  } else if (0 < n && n <= 15) {
    out += digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
  } else if (-4 < n && n <= 0) {
    out += "0." + std::string(static_cast<size_t>(-n), '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (len > 1) out += "." + digits.substr(1);
    std::snprintf(buf, sizeof(buf), "e%c%02d", n - 1 < 0 ? '-' : '+', std::abs(n - 1));
    out += buf;
  }
}

// The length of the valid UTF-8 sequence at s[i], or 0.
inline size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

inline void write_string(std::string& out, std::string_view s, bool ensure_ascii,
                         error_handler_t handler) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || (c == 0x7F && ensure_ascii)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    const size_t n = utf8_length(s, i);
    if (n == 0) {
      if (handler == error_handler_t::strict) {
        std::snprintf(buf, sizeof(buf), "%02X", c);
        throw type_error(316, std::string("invalid UTF-8 byte at index ") + std::to_string(i) +
                                  ": 0x" + buf);
      }
      if (handler == error_handler_t::replace) out += ensure_ascii ? "\\ufffd" : "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (!ensure_ascii || n == 1) {
      out.append(s.data() + i, n);
    } else {
      uint32_t cp = static_cast<unsigned char>(s[i]) & (0xFF >> (n + 1));
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
    }
    i += n;
  }
  out += '"';
}

// A recursive-descent reader calling nlohmann's SAX callbacks. Depth is the handler's to bound
// (json_parse.h refuses nesting deeper than 64 at start_object/start_array, so the recursion
// here is bounded by it; a handler that never refuses nests as deep as the text does).
template <class Sax>
class Parser {
 public:
  Parser(const char* b, const char* e, Sax* sax, bool strict) : p_(b), b_(b), e_(e), sax_(sax), strict_(strict) {}

  bool run() {
    skip_ws();
    if (!value()) return false;
    skip_ws();
    if (strict_ && p_ != e_) return error(101, token_at(p_, 1), "expected end of input");
    return true;
  }

 private:
  void skip_ws() {
    while (p_ != e_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  static std::string token_at(const char* p, size_t n) { return std::string(p, n); }
  bool error(int id, const std::string& last_token, const std::string& why) {
    const size_t at = static_cast<size_t>(p_ - b_);
    std::string what = "parse error at byte " + std::to_string(at) + ": " + why;
    if (!last_token.empty()) what += "; last read: '" + last_token + "'";
    if (id == 406) {
      const out_of_range ex(406, what);
      return sax_->parse_error(at, last_token, ex);
    }
    const parse_error ex(id, what);
    return sax_->parse_error(at, last_token, ex);
  }
  bool end_of_input() { return error(101, "", "unexpected end of input"); }

  bool literal(const char* word, size_t n) {
    if (static_cast<size_t>(e_ - p_) < n || std::string_view(p_, n) != std::string_view(word, n)) {
      size_t k = 0;
      while (k < n && p_ + k != e_ && p_[k] == word[k]) ++k;
      const std::string got = token_at(p_, p_ + k == e_ ? k : k + 1);
      return error(101, got, "invalid literal");
    }
    p_ += n;
    return true;
  }

  bool value() {
    if (p_ == e_) return end_of_input();
    switch (*p_) {
      case '{': return object();
      case '[': return array();
      case '"': {
        std::string s;
        if (!string(&s)) return false;
        return sax_->string(s);
      }
      case 't': return literal("true", 4) && sax_->boolean(true);
      case 'f': return literal("false", 5) && sax_->boolean(false);
      case 'n': return literal("null", 4) && sax_->null();
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number();
        return error(101, token_at(p_, 1), "unexpected character, expected a value");
    }
  }

  bool object() {
    ++p_;
    if (!sax_->start_object(static_cast<size_t>(-1))) return false;
    skip_ws();
    if (p_ != e_ && *p_ == '}') {
      ++p_;
      return sax_->end_object();
    }
    for (;;) {
      skip_ws();
      if (p_ == e_) return end_of_input();
      if (*p_ != '"') return error(101, token_at(p_, 1), "expected a string key");
      std::string key;
      if (!string(&key)) return false;
      if (!sax_->key(key)) return false;
      skip_ws();
      if (p_ == e_) return end_of_input();
      if (*p_ != ':') return error(101, token_at(p_, 1), "expected ':'");
      ++p_;
      skip_ws();
      if (!value()) return false;
      skip_ws();
      if (p_ == e_) return end_of_input();
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ == '}') {
        ++p_;
        return sax_->end_object();
      }
      return error(101, token_at(p_, 1), "expected ',' or '}'");
    }
  }

  bool array() {
    ++p_;
    if (!sax_->start_array(static_cast<size_t>(-1))) return false;
    skip_ws();
    if (p_ != e_ && *p_ == ']') {
      ++p_;
      return sax_->end_array();
    }
    for (;;) {
      skip_ws();
      if (!value()) return false;
      skip_ws();
      if (p_ == e_) return end_of_input();
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ == ']') {
        ++p_;
        return sax_->end_array();
      }
      return error(101, token_at(p_, 1), "expected ',' or ']'");
    }
  }

  bool hex4(uint32_t* out) {
    if (e_ - p_ < 4) return error(101, token_at(p_, static_cast<size_t>(e_ - p_)), "\\u needs 4 hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = p_[k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else return error(101, token_at(p_, k + 1), "\\u needs 4 hex digits");
    }
    p_ += 4;
    *out = v;
    return true;
  }

  bool string(std::string* out) {
    const char* start = p_;
    ++p_;
    for (;;) {
      if (p_ == e_) return error(101, token_at(start, static_cast<size_t>(p_ - start)), "missing closing quote");
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c < 0x20)
        return error(101, token_at(start, static_cast<size_t>(p_ - start) + 1),
                     "control character in a string must be escaped");
      if (c == '\\') {
        ++p_;
        if (p_ == e_) return error(101, token_at(start, static_cast<size_t>(p_ - start)), "missing closing quote");
        const char x = *p_++;
        switch (x) {
          case '"': *out += '"'; break;
          case '\\': *out += '\\'; break;
          case '/': *out += '/'; break;
          case 'b': *out += '\b'; break;
          case 'f': *out += '\f'; break;
          case 'n': *out += '\n'; break;
          case 'r': *out += '\r'; break;
          case 't': *out += '\t'; break;
          case 'u': {
            uint32_t cp;
            if (!hex4(&cp)) return false;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
              return error(101, token_at(start, static_cast<size_t>(p_ - start)), "lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              uint32_t lo;
              if (e_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u')
                return error(101, token_at(start, static_cast<size_t>(p_ - start)), "high surrogate without a low one");
              p_ += 2;
              if (!hex4(&lo)) return false;
              if (lo < 0xDC00 || lo > 0xDFFF)
                return error(101, token_at(start, static_cast<size_t>(p_ - start)), "high surrogate without a low one");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            ltm::append_utf8(*out, cp);
            break;
          }
          default:
            return error(101, token_at(start, static_cast<size_t>(p_ - start)), "invalid escape");
        }
        continue;
      }
      const size_t n = utf8_length(std::string_view(p_, static_cast<size_t>(e_ - p_)), 0);
      if (n == 0) return error(101, token_at(start, static_cast<size_t>(p_ - start) + 1), "invalid UTF-8");
      out->append(p_, n);
      p_ += n;
    }
  }

  bool number() {
    const char* start = p_;
    const auto digit = [&] { return p_ != e_ && *p_ >= '0' && *p_ <= '9'; };
    const auto bad = [&] {
      return error(101, token_at(start, static_cast<size_t>(p_ - start) + (p_ != e_)), "invalid number");
    };
    bool negative = false, integer = true;
    if (*p_ == '-') {
      negative = true;
      ++p_;
    }
    if (!digit()) return bad();
    if (*p_ == '0') {
      ++p_;
    } else {
      while (digit()) ++p_;
    }
    if (p_ != e_ && *p_ == '.') {
      integer = false;
      ++p_;
      if (!digit()) return bad();
      while (digit()) ++p_;
    }
    if (p_ != e_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      ++p_;
      if (p_ != e_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digit()) return bad();
      while (digit()) ++p_;
    }
    const std::string text(start, p_);
    if (integer) {
      errno = 0;
      char* end = nullptr;
      if (negative) {
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (errno == 0) return sax_->number_integer(static_cast<int64_t>(v));
      } else {
        const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
        if (errno == 0) return sax_->number_unsigned(static_cast<uint64_t>(v));
      }
    }
    const double d = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(d)) return error(406, text, "number overflow parsing '" + text + "'");
    return sax_->number_float(d, text);
  }

  const char* p_;
  const char* b_;
  const char* e_;
  Sax* sax_;
  bool strict_;
};

}  // namespace detail

}  // namespace ltm::json_subset
