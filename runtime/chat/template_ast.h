// The chat template interpreter's insides (runtime/chat/chat_template.h is the API): values, the
// syntax tree the parser builds and the renderer walks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ltm::chat_detail {

struct Value;
struct Stmt;
using ValueList = std::vector<Value>;
// Insertion-ordered, like a Python dict; chat template dicts are small, lookups are linear.
using ValueDict = std::vector<std::pair<std::string, Value>>;

// A builtin function, a bound method (`self` + name) or a macro.
struct Callable {
  enum class Kind : uint8_t { kBuiltin, kMethod, kMacro };
  Kind kind = Kind::kBuiltin;
  std::string name;
  std::shared_ptr<const Value> self;  // kMethod
  const Stmt* macro = nullptr;        // kMacro
};

// How deep lists and dicts may nest (JSON from a request: from_json's own 128). Past it a render
// fails: every walk over a value (repr, ==, <, tojson, and the destructor of a chain of lists)
// recurses once a level, and a template that builds `{% set ns.x = [ns.x] %}` in a loop would
// otherwise overflow the stack of the thread that renders it.
constexpr uint32_t kMaxValueDepth = 256;
[[noreturn]] void value_too_deep();  // throws TemplateError kLimit (template_values.cpp)

// A Jinja value. Strings, lists and dicts are shared and immutable (transformers renders in an
// immutable sandbox); a namespace() is shared and mutable.
struct Value {
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  // Lists and dicts: 1 + their deepest element's depth (<= kMaxValueDepth). A namespace counts
  // 0: it is mutable, and the renderer holds every namespace to the render's end (so a chain of
  // them is never destroyed recursively); repr() bounds its own walk through them.
  uint32_t depth = 0;
  int64_t integer = 0;
  double number = 0;
  std::shared_ptr<const std::string> str;  // kString; kUndefined: the name, for messages
  std::shared_ptr<const ValueList> list;   // kList
  std::shared_ptr<const ValueDict> dict;   // kDict
  std::shared_ptr<ValueDict> ns;           // kNamespace
  std::shared_ptr<const Callable> fn;      // kCallable

  static Value undefined(std::string name = "") {
    Value v;
    v.str = std::make_shared<const std::string>(std::move(name));
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value of_bool(bool b) {
    Value v;
    v.kind = Kind::kBool;
    v.boolean = b;
    return v;
  }
  static Value of_int(int64_t i) {
    Value v;
    v.kind = Kind::kInt;
    v.integer = i;
    return v;
  }
  static Value of_float(double f) {
    Value v;
    v.kind = Kind::kFloat;
    v.number = f;
    return v;
  }
  static Value of_string(std::string s) {
    Value v;
    v.kind = Kind::kString;
    v.str = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  static Value of_list(ValueList l) {
    Value v;
    v.kind = Kind::kList;
    for (const Value& e : l) v.depth = std::max(v.depth, e.depth);
    if (++v.depth > kMaxValueDepth) value_too_deep();
    v.list = std::make_shared<const ValueList>(std::move(l));
    return v;
  }
  static Value of_dict(ValueDict d) {
    Value v;
    v.kind = Kind::kDict;
    for (const auto& kv : d) v.depth = std::max(v.depth, kv.second.depth);
    if (++v.depth > kMaxValueDepth) value_too_deep();
    v.dict = std::make_shared<const ValueDict>(std::move(d));
    return v;
  }
  bool is(Kind k) const { return kind == k; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  const std::string& s() const { return *str; }
};

// ---- expressions --------------------------------------------------------------------------------

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // value
    kName,     // name
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (a kLiteral undefined where omitted)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])   (negate)
    kUnary,    // op args[0]: "-", "+", "not"
    kBinary,   // args[0] op args[1]: + - * / // % ** ~ and or
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... : == != < <= > >= in notin
    kCond,     // args[1] if args[0] else args[2] (args.size() == 2: no else)
    kList,     // [args...]   (tuples too)
    kDict,     // {args[0]: args[1], ...}
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  std::string name;              // kName, kAttr, kFilter, kTest; the operator of kUnary/kBinary
  std::vector<std::string> ops;  // kCompare
  bool negate = false;           // kTest
  Value value;                   // kLiteral
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};

// ---- statements ---------------------------------------------------------------------------------

struct Stmt {
  enum class Kind : uint8_t {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[i] -> bodies[i]; bodies.size() == conds.size() + 1: the else
    kFor,       // for targets in expr [if cond] body [else else_body]
    kSet,       // set targets = expr   |  set name.attr = expr (attr non-empty)
    kSetBlock,  // set targets[0] %} body {% endset
    kMacro,     // macro name(params = defaults) body
    kBreak,
    kContinue,
    kBlock,  // a body rendered as is (generation blocks)
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;                          // kText; kMacro: name; kSet: the attribute (ns.attr)
  std::vector<std::string> targets;          // kFor, kSet, kSetBlock: names; kMacro: parameters
  std::unique_ptr<Expr> expr;                // kOutput, kFor (iterable), kSet
  std::unique_ptr<Expr> cond;                // kFor: the loop filter
  std::vector<std::unique_ptr<Expr>> conds;  // kIf; kMacro: defaults (nullptr: none)
  std::vector<std::vector<std::unique_ptr<Stmt>>> bodies;  // kIf; others: bodies[0] (+ else)
};

using Body = std::vector<std::unique_ptr<Stmt>>;

struct Program {
  Body body;
};

// A parse or render error on its way to the API, which turns it into an absl::Status.
struct TemplateError : std::runtime_error {
  enum class Kind : uint8_t { kSyntax, kRender, kRaised, kLimit };
  TemplateError(Kind k, std::string msg) : std::runtime_error(std::move(msg)), kind(k) {}
  Kind kind;
};

// Parses `source` (throws TemplateError kSyntax with "line L, column C: ...").
std::unique_ptr<Program> parse_program(std::string_view source);

}  // namespace ltm::chat_detail
