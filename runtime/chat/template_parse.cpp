// The chat template parser: source text -> Program (runtime/chat/template_ast.h), over the tokens
// of the lexer (template_lex.h).
//
// The parser is a recursive descent over jinja2's expression grammar, lowest precedence first:
//   cond (a if c else b) < or < and < not < compare (== != < <= > >= in, not in)
//   < + - < ~ < * / // % < ** < unary - + < postfix (.a [i] [a:b:c] (call)) | filter, is test
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/chat/template_ast.h"
#include "runtime/chat/template_lex.h"

namespace ltm::chat_detail {
namespace {

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
