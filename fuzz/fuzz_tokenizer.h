// The real GPT-2 tokenizer for the fuzz targets that parse text (completion_json_fuzz,
// request_fuzz, tokenizer_fuzz): loaded once per process; a missing vocabulary aborts with a
// message rather than fuzzing nothing.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_util.h"
#include "runtime/text/tokenizer.h"

namespace ltm::fuzz {

inline const Tokenizer& gpt2_tokenizer() {
  static const Tokenizer* t = [] {
    absl::StatusOr<Tokenizer> loaded = Tokenizer::load(gpt2_dir());
    if (!loaded.ok()) {
      std::fprintf(stderr, "fuzz: %s (run scripts/setup)\n",
                   std::string(loaded.status().message()).c_str());
      std::abort();
    }
    return new Tokenizer(std::move(*loaded));
  }();
  return *t;
}

}  // namespace ltm::fuzz
