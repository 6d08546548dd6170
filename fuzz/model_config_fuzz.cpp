// config.json (runtime/model/model_config.h) on arbitrary text: a config that parses has every
// size positive, within ltm's limits, and a parameter count that does not overflow.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ltm::ModelConfig> c = ltm::parse_model_config(text, "fuzz/config.json");
  if (!c.ok()) return 0;
  if (c->vocab_size <= 0 || c->vocab_size > (int64_t{1} << 30) || c->n_embd <= 0 ||
      c->n_layer <= 0 || c->n_head <= 0 || c->n_positions <= 0 || c->n_inner <= 0)
    std::abort();
  if (c->n_embd % c->n_head != 0) std::abort();
  if (c->parameter_count() <= 0) std::abort();
  return 0;
}
