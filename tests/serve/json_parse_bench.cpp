// Time to parse a POST /v1/completions body (parse_completion: common/json_parse.h, then the
// fields), by shape: N and 2N distinct extra keys and their ratio (~2 when the parse is linear
// in the body; ordered_json's key scan made it ~4), then about 1 MiB each of keys, of nesting
// (64 levels, repeated), of one long string and of numbers. For contrast, the parse the server
// used before (nlohmann::ordered_json::parse) on N_OLD and 2 N_OLD keys. Each time is the best of
// 3 runs. Not a ctest (tests/serve/CMakeLists.txt):
//   cmake --build build -j2 --target json_parse_bench
//   build/tests/json_parse_bench [N=75000] [ROUNDS=5] [N_OLD=16000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/serve/openai_api.h"
#include "runtime/text/tokenizer.h"
#include "tests/serve/toy_vocab.h"

namespace {

using Clock = std::chrono::steady_clock;

ltm::Tokenizer byte_tokenizer() {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(ltm::testing_vocab::byte_spelling(b), b);
  absl::StatusOr<ltm::Tokenizer> t = ltm::Tokenizer::from_tables(vocab, {}, "bench");
  if (!t.ok()) {
    std::fprintf(stderr, "tokenizer: %s\n", std::string(t.status().message()).c_str());
    std::exit(1);
  }
  return std::move(t).value();
}

// A valid request with `extra` appended inside the object (the server ignores unknown fields).
std::string body_with(const std::string& extra) {
  return absl::StrCat(R"({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0)", extra, "}");
}
std::string keys(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) absl::StrAppend(&s, ",\"key", i, "\":", i);
  return s;
}
std::string keys_of_bytes(size_t bytes) {
  std::string s;
  for (int i = 0; s.size() < bytes; ++i) absl::StrAppend(&s, ",\"key", i, "\":", i);
  return s;
}
std::string nesting_of_bytes(size_t bytes) {
  std::string s;
  const std::string one = std::string(63, '[') + "1" + std::string(63, ']');
  for (int i = 0; s.size() < bytes; ++i) absl::StrAppend(&s, ",\"n", i, "\":", one);
  return s;
}
std::string string_of_bytes(size_t bytes) { return ",\"s\":\"" + std::string(bytes, 'a') + "\""; }
std::string numbers_of_bytes(size_t bytes) {
  std::string s = ",\"v\":[0";
  for (int i = 1; s.size() < bytes; ++i) absl::StrAppend(&s, ",", i * 0.001);
  return s + "]";
}

double best_ms(int rounds, const std::function<void()>& f) {
  double best = 1e300;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 75000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const int n_old = argc > 3 ? std::atoi(argv[3]) : 16000;
  const ltm::Tokenizer tok = byte_tokenizer();
  ltm::CompletionContext ctx;
  ctx.tokenizer = &tok;
  ctx.limits.context_length = 1024;
  ctx.limits.vocab_size = tok.vocab_size();
  ctx.limits.max_prompt_bytes = 1 << 20;
  ctx.model_name = "bench";

  auto parse_ms = [&](const std::string& body) {
    return best_ms(3, [&] {
      ltm::ParsedCompletion out;
      if (std::optional<ltm::ApiError> e = ltm::parse_completion(body, ctx, &out)) {
        std::fprintf(stderr, "refused: %s\n", e->message.c_str());
        std::exit(1);
      }
    });
  };

  // N and 2N alternate within each round, and the ratio is taken per round (median over the
  // rounds), so a busy neighbour slows both sides of a ratio alike.
  const std::string b1 = body_with(keys(n)), b2 = body_with(keys(2 * n));
  std::vector<double> ratios;
  double t1 = 1e300, t2 = 1e300;
  for (int r = 0; r < rounds; ++r) {
    const double a = parse_ms(b1), b = parse_ms(b2);
    t1 = std::min(t1, a);
    t2 = std::min(t2, b);
    ratios.push_back(b / a);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("parse_completion, %d keys (%zu bytes): %.1f ms; %d keys (%zu bytes): %.1f ms; "
              "ratio %.2f (median of %d rounds; %.2f-%.2f)\n",
              n, b1.size(), t1, 2 * n, b2.size(), t2, ratios[ratios.size() / 2], rounds,
              ratios.front(), ratios.back());

  const size_t mib = size_t{1} << 20;
  const std::pair<const char*, std::string> shapes[] = {
      {"keys", keys_of_bytes(mib)},
      {"nesting (64 levels, repeated)", nesting_of_bytes(mib)},
      {"one long string", string_of_bytes(mib)},
      {"numbers", numbers_of_bytes(mib)},
  };
  for (const auto& [name, extra] : shapes) {
    const std::string body = body_with(extra);
    std::printf("parse_completion, 1 MiB of %s (%zu bytes): %.1f ms\n", name, body.size(),
                parse_ms(body));
  }

  if (n_old > 0) {
    auto old_ms = [&](const std::string& body) {
      return best_ms(std::min(rounds, 2), [&] {
        const nlohmann::ordered_json j = nlohmann::ordered_json::parse(body);
        if (!j.is_object()) std::exit(1);
      });
    };
    const std::string o1 = body_with(keys(n_old)), o2 = body_with(keys(2 * n_old));
    const double u1 = old_ms(o1), u2 = old_ms(o2);
    std::printf("before (ordered_json::parse), %d keys: %.1f ms; %d keys: %.1f ms; ratio %.2f\n",
                n_old, u1, 2 * n_old, u2, u2 / u1);
  }
  return 0;
}
