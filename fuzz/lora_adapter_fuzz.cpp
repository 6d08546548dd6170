// The LoRA adapter loader (runtime/model/lora.h) on arbitrary folders. The input is split at its
// first NUL byte (JSON text has none): before it adapter_config.json, after it
// adapter_model.safetensors (an input without a NUL is a config with no weights file). Whatever
// LoraAdapter::open accepts must then read and merge without a fault: every slice a tp = 1 or
// tp = 2 rank cuts lies inside its tensors (ASan), holds only finite values, and merging it into
// a weight of ones either stays finite or says so.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "runtime/model/lora.h"

namespace {

// The base model the adapters are checked against: 2 layers, 2 heads of 4, FFN 16.
ltm::ModelConfig base() {
  ltm::ModelConfig c;
  c.vocab_size = 50;
  c.n_positions = 16;
  c.n_embd = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_inner = 16;
  return c;
}

void write(const std::string& path, const uint8_t* data, size_t size) {
  std::filesystem::remove_all(path);
  ltm::fuzz::write_file(path.substr(ltm::fuzz::scratch_dir().size() + 1), data, size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ltm::ModelConfig config = base();
  const std::string dir = ltm::fuzz::scratch_dir() + "/adapter";
  std::filesystem::create_directories(dir);
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_size = nul != nullptr ? static_cast<size_t>(nul - data) : size;
  write(dir + "/" + ltm::kLoraConfigFile, data, config_size);
  if (nul != nullptr) {
    write(dir + "/" + ltm::kLoraWeightsFile, nul + 1, size - config_size - 1);
  } else {
    std::filesystem::remove_all(dir + "/" + ltm::kLoraWeightsFile);
  }

  absl::StatusOr<ltm::LoraAdapter> adapter = ltm::LoraAdapter::open(dir, config, 16);
  if (!adapter.ok()) {
    if (adapter.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  if (adapter->rank() < 1 || adapter->rank() > 16 || !(adapter->scale() > 0) ||
      adapter->scale() > ltm::kMaxLoraScale)
    std::abort();
  const ltm::LoraShardRanges whole = ltm::lora_shard_ranges(config, {0, 2}, {0, 16});
  const ltm::LoraShardRanges half = ltm::lora_shard_ranges(config, {1, 2}, {8, 16});
  for (int64_t l = 0; l < config.n_layer; ++l) {
    for (int m = 0; m < ltm::kLoraModules; ++m) {
      const auto mod = static_cast<ltm::LoraModule>(m);
      for (const ltm::LoraShardRanges* ranges : {&whole, &half}) {
        const ltm::LoraSlice s = ltm::read_lora_slice(*adapter, *ranges, l, mod);
        if (s.empty() != !adapter->has(l, mod)) std::abort();
        for (float v : s.a)
          if (!std::isfinite(v)) std::abort();
        for (float v : s.b)
          if (!std::isfinite(v)) std::abort();
        if (s.empty()) continue;
        std::vector<float> w(static_cast<size_t>(s.in * s.out), 1.0f);
        const absl::Status merged = ltm::merge_lora_rows(s, w.data(), 0, s.in);
        bool finite = true;
        for (float v : w) finite = finite && std::isfinite(v);
        if (merged.ok() != finite) std::abort();  // an overflow is reported, and only then
      }
    }
  }
  return 0;
}
