// The chat template lexer's tokenizing (Lexer, template_lex.h): newlines normalized, the source
// cut into text and tags (whitespace control: trim_blocks, lstrip_blocks, '-' and '+' on a tag's
// ends; comments dropped), and names, numbers, string literals (Python escapes) and operators
// inside the tags.
#include "runtime/chat/template_lex.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace ltm::chat_detail {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

}  // namespace

Lexer::Lexer(std::string_view source) {
  // jinja2 normalizes newlines to \n and drops one trailing newline (keep_trailing_newline off).
  src_.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src_ += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src_ += source[i];
    }
  }
  if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  for (size_t i = 0; i < src_.size(); ++i) {
    if (src_[i] == '\n') newlines_.push_back(i);
  }
}

std::vector<Token> Lexer::run() {
  size_t pos = 0;
  bool line_start = true;  // the text about to be cut starts a line (lstrip_blocks)
  while (pos < src_.size()) {
    size_t p = pos;
    while (true) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) {
        p = std::string::npos;
        break;
      }
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++p;
    }
    std::string text = src_.substr(pos, p == std::string::npos ? std::string::npos : p - pos);
    if (p == std::string::npos) {
      if (!text.empty()) tokens_.push_back({T::kText, std::move(text), pos});
      break;
    }
    const char kind = src_[p + 1];
    const char mod = p + 2 < src_.size() ? src_[p + 2] : '\0';
    if (mod == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (kind != '{' && mod != '+') {
      const size_t nl = text.rfind('\n');
      const size_t tail = nl == std::string::npos ? 0 : nl + 1;
      const bool blank = std::all_of(text.begin() + tail, text.end(),
                                     [](char c) { return c == ' ' || c == '\t'; });
      if (blank && (nl != std::string::npos || line_start)) text.resize(tail);
    }
    if (!text.empty()) tokens_.push_back({T::kText, std::move(text), pos});
    size_t q = p + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
    char end_mod = '\0';
    if (kind == '#') {
      const size_t e = src_.find("#}", q);
      if (e == std::string::npos) fail(p, "comment not closed (no #})");
      if (e > q && (src_[e - 1] == '-' || src_[e - 1] == '+')) end_mod = src_[e - 1];
      q = e + 2;
    } else {
      tokens_.push_back({kind == '{' ? T::kVarBegin : T::kBlockBegin, "", p});
      q = lex_tag(q, kind == '{' ? '}' : '%', &end_mod);
    }
    const size_t after = q;
    if (end_mod == '-') {
      while (q < src_.size() && is_space(src_[q])) ++q;
    } else if (kind != '{' && end_mod != '+' && q < src_.size() && src_[q] == '\n') {
      ++q;  // trim_blocks
    }
    line_start = q > after ? src_[q - 1] == '\n' : false;
    pos = q;
  }
  tokens_.push_back({T::kEof, "", src_.size()});
  return std::move(tokens_);
}

// Tokens from `pos` to the tag's end (`}}` or `%}` outside brackets); returns the offset after
// it and sets *end_mod to '-' or '+' when the end has one.
size_t Lexer::lex_tag(size_t pos, char close, char* end_mod) {
  const size_t begin = pos;
  int depth = 0;
  while (true) {
    while (pos < src_.size() && is_space(src_[pos])) ++pos;
    if (pos >= src_.size())
      fail(begin - 2, close == '}' ? "'{{' not closed (no }})" : "'{%' not closed (no %})");
    const auto ends_at = [&](size_t at) {
      return at + 1 < src_.size() && src_[at] == close && src_[at + 1] == '}' &&
             (close == '%' || depth == 0);
    };
    if ((src_[pos] == '-' || src_[pos] == '+') && ends_at(pos + 1)) {
      *end_mod = src_[pos];
      tokens_.push_back({close == '}' ? T::kVarEnd : T::kBlockEnd, "", pos});
      return pos + 3;
    }
    if (ends_at(pos)) {
      tokens_.push_back({close == '}' ? T::kVarEnd : T::kBlockEnd, "", pos});
      return pos + 2;
    }
    const char c = src_[pos];
    if (is_name_start(c)) {
      size_t e = pos;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      tokens_.push_back({T::kName, src_.substr(pos, e - pos), pos});
      pos = e;
    } else if (is_digit(c)) {
      pos = lex_number(pos);
    } else if (c == '\'' || c == '"') {
      pos = lex_string(pos);
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                   "{",  "}",  ",",  ".",  ":",  "|",  "="};
      std::string op;
      for (const char* o : kOps) {
        if (src_.compare(pos, std::char_traits<char>::length(o), o) == 0) {
          op = o;
          break;
        }
      }
      if (op.empty()) fail(pos, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      if (op == "(" || op == "[" || op == "{") {
        if (++depth > kMaxNesting) fail(pos, "brackets nested too deeply");
      } else if (op == ")" || op == "]" || op == "}") {
        if (depth == 0) fail(pos, absl::StrCat("unexpected '", op, "'"));
        --depth;
      }
      tokens_.push_back({T::kOp, op, pos});
      pos += op.size();
    }
  }
}

size_t Lexer::lex_number(size_t pos) {
  size_t e = pos;
  bool is_float = false;
  while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
  if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
    is_float = true;
    ++e;
    while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
  }
  if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
    size_t x = e + 1;
    if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
    if (x < src_.size() && is_digit(src_[x])) {
      is_float = true;
      e = x;
      while (e < src_.size() && is_digit(src_[e])) ++e;
    }
  }
  std::string digits;
  for (size_t i = pos; i < e; ++i)
    if (src_[i] != '_') digits += src_[i];
  if (!is_float) {
    errno = 0;
    std::strtoll(digits.c_str(), nullptr, 10);
    if (errno == ERANGE) fail(pos, "integer literal too large");
  }
  tokens_.push_back({is_float ? T::kFloat : T::kInt, digits, pos});
  return e;
}

// Python string literal escapes (jinja2 unescapes as Python's unicode-escape does).
size_t Lexer::lex_string(size_t pos) {
  const char quote = src_[pos];
  std::string out;
  size_t i = pos + 1;
  while (true) {
    if (i >= src_.size()) fail(pos, "string literal not closed");
    const char c = src_[i];
    if (c == quote) break;
    if (c != '\\' || i + 1 >= src_.size()) {
      out += c;
      ++i;
      continue;
    }
    const char e = src_[i + 1];
    i += 2;
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '0': out += '\0'; break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (i + n > src_.size()) fail(i - 2, "truncated escape in string literal");
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const char h = src_[i + k];
          const int d = is_digit(h)              ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
          if (d < 0) fail(i - 2, "bad escape in string literal");
          cp = cp * 16 + d;
        }
        if (cp > 0x10FFFF) fail(i - 2, "escape out of Unicode range");
        append_utf8(out, cp);
        i += n;
        break;
      }
      default:
        out += '\\';
        out += e;
        break;  // Python keeps unknown escapes as they are
    }
  }
  tokens_.push_back({T::kString, std::move(out), pos});
  return i + 1;
}

}  // namespace ltm::chat_detail
