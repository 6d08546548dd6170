// The chat template lexer, class Lexer: internal to runtime/chat (chat_template.h is the API).
// It cuts the source into text and tags the way jinja2 does with transformers' settings
// (trim_blocks, lstrip_blocks, one trailing newline dropped) and tokenizes inside the tags, for
// the parser (template_parse.cpp), which also asks it for the line and column of an offset (the
// tree's line numbers, syntax errors). Its tokenizing members are in template_lex.cpp; those two,
// line_of and fail, are here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/chat/template_ast.h"

namespace ltm::chat_detail {

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

class Lexer {
 public:
  explicit Lexer(std::string_view source);

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

  std::vector<Token> run();

 private:
  size_t lex_tag(size_t pos, char close, char* end_mod);
  size_t lex_number(size_t pos);
  size_t lex_string(size_t pos);

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

}  // namespace ltm::chat_detail
