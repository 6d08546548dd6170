// A sharded checkpoint's model.safetensors.index.json (runtime/model/checkpoint.h) on arbitrary
// bytes, beside a fixed config.json and one valid shard: Checkpoint::open must answer a status,
// never crash, whatever the index names.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/safetensors.h"

namespace {

const std::string& model_dir() {
  static const std::string dir = [] {
    const std::string d = ltm::fuzz::scratch_dir() + "/ckpt";
    std::filesystem::create_directories(d);
    std::ofstream(d + "/config.json")
        << R"({"model_type": "gpt2", "vocab_size": 5, "n_positions": 4, "n_embd": 4,
               "n_layer": 1, "n_head": 1, "eos_token_id": 4})";
    ltm::ModelConfig c;
    c.vocab_size = 5;
    c.n_positions = 4;
    c.n_embd = 4;
    c.n_layer = 1;
    c.n_head = 1;
    c.n_inner = 16;
    std::vector<std::vector<float>> data;
    std::vector<ltm::SafetensorsWriteTensor> tensors;
    const std::vector<ltm::TensorSpec> specs = ltm::gpt2_tensor_specs(c);
    data.reserve(specs.size());
    for (const ltm::TensorSpec& s : specs) {
      int64_t n = 1;
      for (int64_t x : s.shape) n *= x;
      data.emplace_back(static_cast<size_t>(n), 0.5f);
      tensors.push_back({s.name, "F32", s.shape,
                         std::string_view(reinterpret_cast<const char*>(data.back().data()),
                                          data.back().size() * sizeof(float))});
    }
    if (!ltm::write_safetensors(d + "/model-00001-of-00001.safetensors", tensors).ok()) std::abort();
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = model_dir();
  {
    std::ofstream out(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  absl::StatusOr<ltm::Checkpoint> c = ltm::Checkpoint::open(dir);
  if (c.ok()) {
    std::vector<float> out(4);
    c->read_f32("ln_f.weight", ltm::SliceSpec{0, 4, 0, 1}, out.data());
  }
  return 0;
}
