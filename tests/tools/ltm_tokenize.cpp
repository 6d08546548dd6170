// ltm-tokenize: encodes text with runtime/tokenizer for tests and scripts.
//
//   ltm-tokenize VOCAB_DIR            reads one JSON string per line on stdin, writes one JSON
//                                     array of token ids per line on stdout
//   ltm-tokenize VOCAB_DIR --prompt   the same with what the tokenizer adds to a prompt
//                                     (Tokenizer::encode_prompt: bos/eos)
//   ltm-tokenize VOCAB_DIR --decode   reads one JSON array of ids per line, writes the decoded
//                                     bytes as a JSON array of byte values per line
// VOCAB_DIR holds tokenizer.json, or vocab.json and merges.txt (e.g. $LTM_GPT2_DIR), as
// Tokenizer::load reads them. Exits 1 with a message on a load error or a malformed input line.
#include <cstdio>
#include <iostream>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/text/tokenizer.h"

int main(int argc, char** argv) {
  const bool decode = argc == 3 && std::string(argv[2]) == "--decode";
  const bool prompt = argc == 3 && std::string(argv[2]) == "--prompt";
  if (argc != 2 && !decode && !prompt) {
    std::fprintf(stderr,
                 "usage: %s VOCAB_DIR [--decode|--prompt]  (stdin: one JSON value per line)\n",
                 argv[0]);
    return 2;
  }
  absl::StatusOr<ltm::Tokenizer> tok = ltm::Tokenizer::load(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "ltm-tokenize: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  std::string line;
  for (int line_no = 1; std::getline(std::cin, line); ++line_no) {
    nlohmann::json in = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    nlohmann::json out;
    if (!decode && in.is_string()) {
      const std::string text = in.get<std::string>();
      out = prompt ? tok->encode_prompt(text) : tok->encode(text);
    } else if (decode && in.is_array()) {
      std::vector<int32_t> ids;
      for (const auto& v : in) {
        if (!v.is_number_integer() || !tok->valid_id(v.get<int32_t>())) {
          std::fprintf(stderr, "ltm-tokenize: stdin:%d: %s is not a token id\n", line_no,
                       v.dump().c_str());
          return 1;
        }
        ids.push_back(v.get<int32_t>());
      }
      const std::string bytes = tok->decode(ids);
      out = nlohmann::json::array();
      for (const unsigned char b : bytes) out.push_back(b);
    } else {
      std::fprintf(stderr, "ltm-tokenize: stdin:%d: expected a JSON %s\n", line_no,
                   decode ? "array of ids" : "string");
      return 1;
    }
    std::cout << out.dump() << '\n';
  }
  std::cout.flush();
  return std::cout ? 0 : 1;
}
