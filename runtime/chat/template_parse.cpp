// The chat template lexer and parser: source text -> Program (runtime/chat/template_ast.h).
//
// The lexer cuts the source into text and tags the way jinja2 does with transformers' settings
// (trim_blocks, lstrip_blocks, one trailing newline dropped) and tokenizes inside the tags; the
// parser is a recursive descent over jinja2's expression grammar, lowest precedence first:
//   cond (a if c else b) < or < and < not < compare (== != < <= > >= in, not in)
//   < + - < ~ < * / // % < ** < unary - + < postfix (.a [i] [a:b:c] (call)) | filter, is test
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/chat/template_ast.h"

namespace ltm::chat_detail {
namespace {

constexpr int kMaxNesting = 200;  // brackets, operators and blocks nested: bounds the recursion

struct Token {
  enum class Type : uint8_t {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  std::string text;  // kText: the data; kString: the unescaped value; kOp/kName: the spelling
  size_t pos = 0;    // offset in the source, for line/column
};
using T = Token::Type;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
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

  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    const size_t line =
        std::upper_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin();
    const size_t line_begin = line == 0 ? 0 : newlines_[line - 1] + 1;
    throw TemplateError(
        TemplateError::Kind::kSyntax,
        absl::StrCat("line ", line + 1, ", column ", pos - line_begin + 1, ": ", msg));
  }
  int line_of(size_t pos) const {
    return static_cast<int>(std::upper_bound(newlines_.begin(), newlines_.end(), pos) -
                            newlines_.begin()) +
           1;
  }

  std::vector<Token> run() {
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

 private:
  // Tokens from `pos` to the tag's end (`}}` or `%}` outside brackets); returns the offset after
  // it and sets *end_mod to '-' or '+' when the end has one.
  size_t lex_tag(size_t pos, char close, char* end_mod) {
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

  size_t lex_number(size_t pos) {
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
  size_t lex_string(size_t pos) {
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

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

// ---- parser -------------------------------------------------------------------------------------

using ExprPtr = std::unique_ptr<Expr>;

class Parser {
 public:
  Parser(const Lexer& lexer, std::vector<Token> tokens) : lexer_(lexer), toks_(std::move(tokens)) {}

  std::unique_ptr<Program> run() {
    auto program = std::make_unique<Program>();
    std::string end;
    program->body = parse_body({}, &end);
    return program;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    return toks_[std::min(i_ + ahead, toks_.size() - 1)];
  }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == T::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* n, size_t ahead = 0) const {
    return peek(ahead).type == T::kName && peek(ahead).text == n;
  }
  [[noreturn]] void fail(const std::string& msg) const { lexer_.fail(peek().pos, msg); }
  int line() const { return lexer_.line_of(peek().pos); }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case T::kEof: return "end of template";
      case T::kVarEnd: return "'}}'";
      case T::kBlockEnd: return "'%}'";
      case T::kText: return "text";
      case T::kString: return "a string";
      default: return absl::StrCat("'", t.text, "'");
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(absl::StrCat("expected '", op, "', found ", describe(peek())));
    next();
  }
  std::string expect_name(const char* what) {
    if (peek().type != T::kName)
      fail(absl::StrCat("expected ", what, ", found ", describe(peek())));
    return next().text;
  }
  void expect_block_end() {
    if (peek().type != T::kBlockEnd) fail(absl::StrCat("expected '%}', found ", describe(peek())));
    next();
  }
  struct Nest {
    explicit Nest(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting) p_->fail("template nested too deeply");
    }
    ~Nest() { --p_->depth_; }
    Parser* p_;
  };

  ExprPtr node(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Statements up to a {% keyword %} in `ends` (returned in *end, the keyword consumed) or EOF.
  Body parse_body(const std::vector<std::string>& ends, std::string* end) {
    Nest nest(this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.type == T::kEof) {
        if (!ends.empty()) fail(absl::StrCat("missing {% ", ends.back(), " %}"));
        *end = "";
        return body;
      }
      if (t.type == T::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = lexer_.line_of(t.pos);
        s->text = next().text;
        body.push_back(std::move(s));
        continue;
      }
      if (t.type == T::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = line();
        s->expr = parse_expr();
        if (peek().type != T::kVarEnd)
          fail(absl::StrCat("expected '}}', found ", describe(peek())));
        next();
        body.push_back(std::move(s));
        continue;
      }
      // {% keyword ... %}
      next();
      const std::string kw = expect_name("a statement keyword");
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        *end = kw;
        return body;
      }
      body.push_back(parse_statement(kw));
    }
  }

  std::unique_ptr<Stmt> parse_statement(const std::string& kw) {
    auto s = std::make_unique<Stmt>();
    s->line = line();
    std::string end;
    if (kw == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conds.push_back(parse_expr());
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, &end));
        if (end == "elif") {
          s->conds.push_back(parse_expr());
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->bodies.push_back(parse_body({"endif"}, &end));
          break;
        } else {
          break;
        }
      }
      expect_block_end();
    } else if (kw == "for") {
      s->kind = Stmt::Kind::kFor;
      const bool paren = is_op("(");
      if (paren) next();
      s->targets.push_back(expect_name("a loop variable"));
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name("a loop variable"));
      }
      if (paren) expect_op(")");
      if (!is_name("in")) fail(absl::StrCat("expected 'in', found ", describe(peek())));
      next();
      s->expr = parse_or();
      if (is_name("if")) {
        next();
        s->cond = parse_expr();
      }
      if (is_name("recursive")) fail("recursive loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->bodies.push_back(parse_body({"else", "endfor"}, &end));
      --loop_depth_;
      if (end == "else") {
        expect_block_end();
        s->bodies.push_back(parse_body({"endfor"}, &end));
      }
      expect_block_end();
    } else if (kw == "set") {
      s->targets.push_back(expect_name("a variable name"));
      if (is_op(".")) {
        next();
        s->text = expect_name("an attribute name");
      } else {
        while (is_op(",")) {
          next();
          s->targets.push_back(expect_name("a variable name"));
        }
      }
      if (is_op("=")) {
        next();
        s->kind = Stmt::Kind::kSet;
        s->expr = parse_tuple();
        expect_block_end();
      } else {
        if (s->targets.size() != 1 || !s->text.empty()) fail("a block set takes one plain name");
        s->kind = Stmt::Kind::kSetBlock;
        if (is_op("|")) fail("filters on a block set are not supported");
        expect_block_end();
        s->bodies.push_back(parse_body({"endset"}, &end));
        expect_block_end();
      }
    } else if (kw == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->text = expect_name("a macro name");
      expect_op("(");
      while (!is_op(")")) {
        s->targets.push_back(expect_name("a parameter name"));
        if (is_op("=")) {
          next();
          s->conds.push_back(parse_expr());
        } else {
          s->conds.push_back(nullptr);
        }
        if (!is_op(",")) break;
        next();
      }
      expect_op(")");
      expect_block_end();
      s->bodies.push_back(parse_body({"endmacro"}, &end));
      if (peek().type == T::kName) next();  // {% endmacro name %}
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      s->kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      if (loop_depth_ == 0) fail(absl::StrCat("'", kw, "' outside a loop"));
      expect_block_end();
    } else if (kw == "generation") {
      s->kind = Stmt::Kind::kBlock;
      expect_block_end();
      s->bodies.push_back(parse_body({"endgeneration"}, &end));
      expect_block_end();
    } else {
      lexer_.fail(toks_[i_ - 1].pos, absl::StrCat("unknown or unsupported statement '", kw, "'"));
    }
    return s;
  }

  // ---- expressions ----

  // expr [, expr ...]: a list (for `set a = 1, 2`).
  ExprPtr parse_tuple() {
    ExprPtr first = parse_expr();
    if (!is_op(",")) return first;
    auto list = node(Expr::Kind::kList, first->line);
    list->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      list->args.push_back(parse_expr());
    }
    return list;
  }

  ExprPtr parse_expr() {
    Nest nest(this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = node(Expr::Kind::kCond, line());
      next();
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        next();
        c->args.push_back(parse_expr());
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = node(Expr::Kind::kBinary, a->line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      next();
      e = binary("or", std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      next();
      e = binary("and", std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(this);
      auto e = node(Expr::Kind::kUnary, line());
      next();
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_add();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().type == T::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::kCompare, first->line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_add());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_add() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_mul();
    while (is_op("~")) {
      next();
      e = binary("~", std::move(e), parse_mul());
    }
    return e;
  }
  ExprPtr parse_mul() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      next();
      e = binary("**", std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Nest nest(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(Expr::Kind::kUnary, line());
      e->name = next().text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    const int ln = line();
    if (t.type == T::kName) {
      const std::string& n = t.text;
      auto lit = node(Expr::Kind::kLiteral, ln);
      if (n == "true" || n == "True") {
        next();
        lit->value = Value::of_bool(true);
        return lit;
      }
      if (n == "false" || n == "False") {
        next();
        lit->value = Value::of_bool(false);
        return lit;
      }
      if (n == "none" || n == "None") {
        next();
        lit->value = Value::none();
        return lit;
      }
      auto e = node(Expr::Kind::kName, ln);
      e->name = next().text;
      return e;
    }
    if (t.type == T::kString) {
      std::string s;
      while (peek().type == T::kString) s += next().text;  // adjacent literals concatenate
      auto e = node(Expr::Kind::kLiteral, ln);
      e->value = Value::of_string(std::move(s));
      return e;
    }
    if (t.type == T::kInt || t.type == T::kFloat) {
      auto e = node(Expr::Kind::kLiteral, ln);
      const std::string text = next().text;
      e->value = t.type == T::kInt ? Value::of_int(std::strtoll(text.c_str(), nullptr, 10))
                                   : Value::of_float(std::strtod(text.c_str(), nullptr));
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return node(Expr::Kind::kList, ln);
      }
      ExprPtr e = parse_expr();
      if (is_op(",")) {
        auto list = node(Expr::Kind::kList, ln);
        list->args.push_back(std::move(e));
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          list->args.push_back(parse_expr());
        }
        e = std::move(list);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto list = node(Expr::Kind::kList, ln);
      while (!is_op("]")) {
        list->args.push_back(parse_expr());
        if (!is_op(",")) break;
        next();
      }
      expect_op("]");
      return list;
    }
    if (is_op("{")) {
      next();
      auto dict = node(Expr::Kind::kDict, ln);
      while (!is_op("}")) {
        dict->args.push_back(parse_expr());
        expect_op(":");
        dict->args.push_back(parse_expr());
        if (!is_op(",")) break;
        next();
      }
      expect_op("}");
      return dict;
    }
    fail(absl::StrCat("expected an expression, found ", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        next();
        const Token& t = peek();
        if (t.type == T::kInt) {  // foo.0 is foo[0]
          auto item = node(Expr::Kind::kItem, e->line);
          item->args.push_back(std::move(e));
          auto idx = node(Expr::Kind::kLiteral, line());
          idx->value = Value::of_int(std::strtoll(next().text.c_str(), nullptr, 10));
          item->args.push_back(std::move(idx));
          e = std::move(item);
          continue;
        }
        auto attr = node(Expr::Kind::kAttr, e->line);
        attr->name = expect_name("an attribute name");
        attr->args.push_back(std::move(e));
        e = std::move(attr);
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(Expr::Kind::kCall, std::move(e), "");
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const int ln = obj->line;
    ExprPtr parts[3];
    int n_colons = 0;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
      if (k < 2 && is_op(":")) {
        next();
        ++n_colons;
        continue;
      }
      break;
    }
    expect_op("]");
    if (n_colons == 0) {
      if (!parts[0]) fail("empty subscript");
      auto item = node(Expr::Kind::kItem, ln);
      item->args.push_back(std::move(obj));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = node(Expr::Kind::kSlice, ln);
    slice->args.push_back(std::move(obj));
    for (auto& p : parts) {
      if (!p) {
        p = node(Expr::Kind::kLiteral, ln);
        p->value = Value::none();
      }
      slice->args.push_back(std::move(p));
    }
    return slice;
  }

  // (args, name=value, ...) after `callee` (kCall: args[0] is the callee; kFilter/kTest: the
  // operand, and `name` the filter or test).
  ExprPtr parse_call(Expr::Kind kind, ExprPtr first, const std::string& name) {
    auto call = node(kind, first->line);
    call->name = name;
    call->args.push_back(std::move(first));
    expect_op("(");
    while (!is_op(")")) {
      if (peek().type == T::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call->kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        if (!call->kwargs.empty()) fail("positional argument after a keyword argument");
        call->args.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    return call;
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        const std::string name = expect_name("a filter name");
        if (is_op("(")) {
          e = parse_call(Expr::Kind::kFilter, std::move(e), name);
        } else {
          auto f = node(Expr::Kind::kFilter, e->line);
          f->name = name;
          f->args.push_back(std::move(e));
          e = std::move(f);
        }
      } else if (is_name("is")) {
        next();
        bool negate = false;
        if (is_name("not")) {
          next();
          negate = true;
        }
        const std::string name = expect_name("a test name");
        ExprPtr t;
        if (is_op("(")) {
          t = parse_call(Expr::Kind::kTest, std::move(e), name);
        } else {
          t = node(Expr::Kind::kTest, e->line);
          t->name = name;
          t->args.push_back(std::move(e));
          const Token& a = peek();
          const bool bare_arg = a.type == T::kString || a.type == T::kInt || a.type == T::kFloat ||
                                (a.type == T::kName && a.text != "else" && a.text != "or" &&
                                 a.text != "and" && a.text != "is");
          if (bare_arg) t->args.push_back(parse_postfix(parse_primary()));
        }
        t->negate = negate;
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(Expr::Kind::kCall, std::move(e), "");
      } else {
        return e;
      }
    }
  }

  const Lexer& lexer_;
  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source) {
  Lexer lexer(source);
  std::vector<Token> tokens = lexer.run();
  Parser parser(lexer, std::move(tokens));
  return parser.run();
}

}  // namespace ltm::chat_detail
