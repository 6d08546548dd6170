// Checkpoint: opening HF GPT-2 folders (single file or sharded, F32/F16/BF16), validation
// messages for every defect, slice reads and the bytes_read accounting, robustness against
// corrupt files. (dtype conversions: dtype_test.cpp.) Checkpoints are written from C++ here; one test
// cross-checks against the Python generator (tests/python/ltm_testing) when torch is available.
#include "runtime/model/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/dtype.h"
#include "runtime/model/safetensors.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Writing checkpoints from C++

struct FakeModel {
  int64_t vocab_size = 40, n_positions = 12, n_embd = 8, n_layer = 2, n_head = 2, n_inner = 0;
  std::string dtype = "F32";
  int shards = 1;
  std::string prefix = "transformer.";
  bool sinusoidal = false;

  int64_t d_ff() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

struct FakeTensor {
  std::string name;  // as stored
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  std::vector<float> values;  // what a reader must return (after dtype rounding)
};

std::vector<std::pair<std::string, std::vector<int64_t>>> gpt2_shapes(const FakeModel& m) {
  const int64_t d = m.n_embd, ff = m.d_ff();
  std::vector<std::pair<std::string, std::vector<int64_t>>> s;
  s.push_back({"wte.weight", {m.vocab_size, d}});
  if (!m.sinusoidal) s.push_back({"wpe.weight", {m.n_positions, d}});
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    s.push_back({h + "ln_1.weight", {d}});
    s.push_back({h + "ln_1.bias", {d}});
    s.push_back({h + "attn.c_attn.weight", {d, 3 * d}});
    s.push_back({h + "attn.c_attn.bias", {3 * d}});
    s.push_back({h + "attn.c_proj.weight", {d, d}});
    s.push_back({h + "attn.c_proj.bias", {d}});
    s.push_back({h + "ln_2.weight", {d}});
    s.push_back({h + "ln_2.bias", {d}});
    s.push_back({h + "mlp.c_fc.weight", {d, ff}});
    s.push_back({h + "mlp.c_fc.bias", {ff}});
    s.push_back({h + "mlp.c_proj.weight", {ff, d}});
    s.push_back({h + "mlp.c_proj.bias", {d}});
  }
  s.push_back({"ln_f.weight", {d}});
  s.push_back({"ln_f.bias", {d}});
  return s;
}

FakeTensor make_tensor(const std::string& name, const std::string& dtype,
                       std::vector<int64_t> shape, int seed) {
  FakeTensor t{name, dtype, std::move(shape), {}, {}};
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  const int64_t size = safetensors_dtype_size(dtype);
  t.bytes.resize(static_cast<size_t>(numel * size));
  for (int64_t k = 0; k < numel; ++k) {
    const float v = std::sin(0.37f * static_cast<float>(k) + 1.3f * static_cast<float>(seed)) *
                    (1.0f + static_cast<float>(k % 7));
    char* dst = t.bytes.data() + k * size;
    if (dtype == "F32") {
      std::memcpy(dst, &v, 4);
      t.values.push_back(v);
    } else if (dtype == "F16") {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(dst, &h, 2);
      t.values.push_back(f16_to_f32(h));
    } else if (dtype == "BF16") {
      const uint16_t b = f32_to_bf16(v);
      std::memcpy(dst, &b, 2);
      t.values.push_back(bf16_to_f32(b));
    } else {
      std::memset(dst, 0x11, static_cast<size_t>(size));  // other dtypes: content irrelevant
    }
  }
  return t;
}

std::vector<FakeTensor> make_tensors(const FakeModel& m) {
  std::vector<FakeTensor> tensors;
  int seed = 0;
  for (auto& [name, shape] : gpt2_shapes(m)) {
    tensors.push_back(make_tensor(m.prefix + name, m.dtype, shape, seed++));
  }
  return tensors;
}

json config_json(const FakeModel& m) {
  json c = {{"model_type", "gpt2"},           {"vocab_size", m.vocab_size},
            {"n_positions", m.n_positions},   {"n_embd", m.n_embd},
            {"n_layer", m.n_layer},           {"n_head", m.n_head},
            {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
            {"eos_token_id", m.vocab_size - 1}};
  if (m.n_inner > 0) c["n_inner"] = m.n_inner;
  if (m.sinusoidal) c["position_embedding_type"] = "sinusoidal";
  return c;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string shard_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k + 1, n);
  return buf;
}

// Writes config.json and the tensors (one file, or `shards` contiguous groups + index).
void write_checkpoint(const std::string& dir, const FakeModel& m,
                      const std::vector<FakeTensor>& tensors, const json& config) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", config.dump(2));
  auto to_write = [](const std::vector<const FakeTensor*>& group) {
    std::vector<SafetensorsWriteTensor> w;
    for (const FakeTensor* t : group) w.push_back({t->name, t->dtype, t->shape, t->bytes});
    return w;
  };
  if (m.shards == 1) {
    std::vector<const FakeTensor*> all;
    for (const FakeTensor& t : tensors) all.push_back(&t);
    ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", to_write(all)).ok());
    return;
  }
  json weight_map = json::object();
  const size_t per_shard = (tensors.size() + m.shards - 1) / m.shards;
  for (int k = 0; k < m.shards; ++k) {
    std::vector<const FakeTensor*> group;
    for (size_t i = k * per_shard; i < std::min(tensors.size(), (k + 1) * per_shard); ++i) {
      group.push_back(&tensors[i]);
      weight_map[tensors[i].name] = shard_name(k, m.shards);
    }
    ASSERT_TRUE(write_safetensors(dir + "/" + shard_name(k, m.shards), to_write(group)).ok());
  }
  write_text(dir + "/model.safetensors.index.json",
             json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2));
}

std::string strip(const std::string& name) {
  return name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/ltm_checkpoint_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A fresh folder with a checkpoint for `m`; `edit` may change the tensors and the config.
  std::string make(const FakeModel& m,
                   const std::function<void(std::vector<FakeTensor>&, json&)>& edit = nullptr) {
    const std::string dir = root_ + "/ckpt" + std::to_string(count_++);
    tensors_ = make_tensors(m);
    json config = config_json(m);
    if (edit) edit(tensors_, config);
    write_checkpoint(dir, m, tensors_, config);
    return dir;
  }

  absl::Status open_status(const std::string& dir) { return Checkpoint::open(dir).status(); }

  // Every tensor read whole equals what was written; F32 tensors also come in place.
  void expect_contents(const Checkpoint& ckpt, bool expect_in_place) {
    for (const FakeTensor& t : tensors_) {
      const std::string name = strip(t.name);
      const bool ignored = name == "lm_head.weight" || name.ends_with(".attn.bias") ||
                           name.ends_with(".attn.masked_bias");
      if (ignored || t.values.empty()) continue;
      ASSERT_EQ(ckpt.shape(name), t.shape) << name;
      EXPECT_EQ(dtype_name(ckpt.dtype(name)), t.dtype) << name;
      const int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
      std::vector<float> out(t.values.size(), -999.0f);
      ckpt.read_f32(name, {0, rows, 0, cols}, out.data());
      ASSERT_EQ(out, t.values) << name;
      const float* in_place = ckpt.f32_in_place(name);
      if (t.dtype == "F32" && expect_in_place) {
        ASSERT_NE(in_place, nullptr) << name;
        EXPECT_EQ(std::memcmp(in_place, t.values.data(), t.values.size() * 4), 0) << name;
      } else if (t.dtype != "F32") {
        EXPECT_EQ(in_place, nullptr) << name;
      }
    }
  }

  std::string root_;
  int count_ = 0;
  std::vector<FakeTensor> tensors_;
};

TEST_F(CheckpointTest, OpensEveryLayoutAndDType) {
  for (const char* dtype : {"F32", "F16", "BF16"}) {
    for (int shards : {1, 3}) {
      for (const char* prefix : {"transformer.", ""}) {
        FakeModel m;
        m.dtype = dtype;
        m.shards = shards;
        m.prefix = prefix;
        SCOPED_TRACE(std::string(dtype) + " shards=" + std::to_string(shards) + " prefix=" + prefix);
        auto ckpt = Checkpoint::open(make(m));
        ASSERT_TRUE(ckpt.ok()) << ckpt.status();
        EXPECT_EQ(ckpt->config().n_layer, 2);
        EXPECT_EQ(ckpt->config().vocab_size, 40);
        const std::vector<std::string> names = ckpt->tensor_names();
        ASSERT_EQ(names.size(), 2 + 12 * 2 + 2u);
        EXPECT_EQ(names.front(), "wte.weight");
        EXPECT_EQ(names[2], "h.0.ln_1.weight");
        EXPECT_EQ(names.back(), "ln_f.bias");
        expect_contents(*ckpt, /*expect_in_place=*/true);
        // Names with the prefix are accepted too.
        EXPECT_EQ(ckpt->shape("transformer.h.1.mlp.c_fc.weight"), (std::vector<int64_t>{8, 32}));
      }
    }
  }
}

TEST_F(CheckpointTest, TensorSpecsMatchConfig) {
  ModelConfig c;
  c.vocab_size = 10;
  c.n_positions = 4;
  c.n_embd = 6;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_inner = 5;
  std::vector<TensorSpec> specs = gpt2_tensor_specs(c);
  ASSERT_EQ(specs.size(), 16u);
  EXPECT_EQ(specs[1].name, "wpe.weight");
  EXPECT_EQ(specs[10].name, "h.0.mlp.c_fc.weight");
  EXPECT_EQ(specs[10].shape, (std::vector<int64_t>{6, 5}));
  int64_t total = 0;
  for (const TensorSpec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    total += n;
  }
  EXPECT_EQ(total, c.parameter_count());
  c.position_embedding = PositionEmbedding::kSinusoidal;
  specs = gpt2_tensor_specs(c);
  EXPECT_EQ(specs.size(), 15u);
  EXPECT_EQ(specs[1].name, "h.0.ln_1.weight");
}

TEST_F(CheckpointTest, SlicesReadOnlyTheirBytes) {
  for (const char* dtype : {"F32", "BF16"}) {
    FakeModel m;
    m.dtype = dtype;
    auto ckpt = Checkpoint::open(make(m));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    const int64_t es = std::string(dtype) == "F32" ? 4 : 2;
    EXPECT_EQ(ckpt->bytes_read(), 0u);

    // Column slice of c_attn [8, 24]: the K block of head 1 of 2 (cols 12..16).
    const FakeTensor& c_attn = tensors_[2 + 2];
    ASSERT_EQ(strip(c_attn.name), "h.0.attn.c_attn.weight");
    std::vector<float> cols(8 * 4);
    ckpt->read_f32("h.0.attn.c_attn.weight", {0, 8, 12, 16}, cols.data());
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 4; ++c) ASSERT_EQ(cols[r * 4 + c], c_attn.values[r * 24 + 12 + c]);
    }
    EXPECT_EQ(ckpt->bytes_read(), static_cast<uint64_t>(8 * 4 * es));

    // Row slice of the MLP projection [32, 8]: rows 16..32.
    const FakeTensor& proj = tensors_[2 + 10];
    ASSERT_EQ(strip(proj.name), "h.0.mlp.c_proj.weight");
    std::vector<float> rows(16 * 8);
    ckpt->read_f32("h.0.mlp.c_proj.weight", {16, 32, 0, 8}, rows.data());
    for (int k = 0; k < 16 * 8; ++k) ASSERT_EQ(rows[k], proj.values[16 * 8 + k]);
    EXPECT_EQ(ckpt->bytes_read(), static_cast<uint64_t>((8 * 4 + 16 * 8) * es));

    // Rectangle of wte and a 1-D slice.
    std::vector<float> rect(3 * 2);
    ckpt->read_f32("wte.weight", {5, 8, 3, 5}, rect.data());
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 2; ++c) ASSERT_EQ(rect[r * 2 + c], tensors_[0].values[(5 + r) * 8 + 3 + c]);
    }
    std::vector<float> bias(8);
    ckpt->read_f32("h.1.attn.c_attn.bias", {8, 16, 0, 1}, bias.data());
    for (int k = 0; k < 8; ++k) ASSERT_EQ(bias[k], tensors_[2 + 12 + 3].values[8 + k]);
    ckpt->read_f32("h.1.attn.c_attn.bias", {3, 3, 0, 1}, bias.data());  // empty slice
    EXPECT_EQ(ckpt->bytes_read(), static_cast<uint64_t>((8 * 4 + 16 * 8 + 6 + 8) * es));

    // In place: the whole tensor's bytes count when handed out.
    const uint64_t before = ckpt->bytes_read();
    const float* ln = ckpt->f32_in_place("ln_f.weight");
    EXPECT_EQ(ckpt->bytes_read(), before + (ln != nullptr ? 8 * 4 : 0));
    EXPECT_EQ(ln != nullptr, std::string(dtype) == "F32");
  }
}

TEST_F(CheckpointTest, MisalignedF32IsCopiedNotReadInPlace) {
  FakeModel m;
  auto dir = make(m, [&](std::vector<FakeTensor>& t, json&) {
    // An ignored 3-byte buffer first shifts every F32 tensor off 4-byte alignment.
    t.insert(t.begin(), make_tensor("transformer.h.0.attn.bias", "U8", {1, 1, 1, 3}, 0));
  });
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->f32_in_place("wte.weight"), nullptr);
  expect_contents(*ckpt, /*expect_in_place=*/false);
}

TEST_F(CheckpointTest, IgnoresMaskBuffersAndTiedLmHead) {
  FakeModel m;
  m.shards = 2;
  auto dir = make(m, [&](std::vector<FakeTensor>& t, json& config) {
    t.push_back(make_tensor("lm_head.weight", "F32", {40, 8}, 99));  // values differ: ignored
    t.push_back(make_tensor("transformer.h.0.attn.masked_bias", "F32", {}, 0));
    t.push_back(make_tensor("transformer.h.1.attn.masked_bias", "F64", {}, 0));
    t.push_back(make_tensor("transformer.h.0.attn.bias", "BOOL", {1, 1, 12, 12}, 0));
    t.push_back(make_tensor("transformer.h.1.attn.bias", "U8", {1, 1, 12, 12}, 0));
    config["tie_word_embeddings"] = true;
  });
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->tensor_names().size(), 28u);
  expect_contents(*ckpt, true);
}

TEST_F(CheckpointTest, LmHeadWithWrongShape) {
  FakeModel m;
  auto dir = make(m, [&](std::vector<FakeTensor>& t, json&) {
    t.push_back(make_tensor("lm_head.weight", "F32", {41, 8}, 0));
  });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.safetensors: tensor \"lm_head.weight\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("has shape [41, 8], expected [40, 8]"));
}

TEST_F(CheckpointTest, SinusoidalHasNoWpe) {
  FakeModel m;
  m.sinusoidal = true;
  auto ckpt = Checkpoint::open(make(m));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->config().position_embedding, PositionEmbedding::kSinusoidal);
  EXPECT_EQ(ckpt->tensor_names()[1], "h.0.ln_1.weight");
  expect_contents(*ckpt, true);

  // A learned wpe in a checkpoint whose config says sinusoidal is an error.
  auto dir = make(FakeModel{}, [](std::vector<FakeTensor>&, json& config) {
    config["position_embedding_type"] = "sinusoidal";
  });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor \"transformer.wpe.weight\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("sinusoidal"));
}

TEST_F(CheckpointTest, MixedDTypesAreRead) {
  FakeModel m;
  auto dir = make(m, [](std::vector<FakeTensor>& t, json&) {
    t[3] = make_tensor(t[3].name, "BF16", t[3].shape, 3);   // h.0.ln_1.bias
    t[10] = make_tensor(t[10].name, "F16", t[10].shape, 10);
    std::stable_sort(t.begin(), t.end(), [](const FakeTensor& a, const FakeTensor& b) {
      return safetensors_dtype_size(a.dtype) > safetensors_dtype_size(b.dtype);
    });
  });
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->dtype("h.0.ln_1.bias"), DType::kBF16);
  EXPECT_EQ(ckpt->dtype("h.0.ln_1.weight"), DType::kF32);
  expect_contents(*ckpt, true);
}

TEST_F(CheckpointTest, MovedCheckpointKeepsWorking) {
  auto ckpt = Checkpoint::open(make(FakeModel{}));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const float* before = ckpt->f32_in_place("wte.weight");
  Checkpoint moved = std::move(*ckpt);
  EXPECT_EQ(moved.f32_in_place("wte.weight"), before);
  Checkpoint assigned = std::move(moved);
  expect_contents(assigned, true);
  EXPECT_GT(assigned.bytes_read(), 0u);
  EXPECT_EQ(assigned.file_of("h.0.ln_1.weight"), assigned.dir() + "/model.safetensors");
}

// --- every defect: error code, file, tensor, what was expected --------------------------------

TEST_F(CheckpointTest, MissingTensor) {
  auto dir = make(FakeModel{}, [](std::vector<FakeTensor>& t, json&) {
    t.erase(t.begin() + 2 + 12 + 8);  // h.1.mlp.c_fc.weight
  });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir + "/model.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor \"h.1.mlp.c_fc.weight\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("is missing; expected shape [8, 32] = [n_embd, n_inner]"));

  FakeModel sharded;
  sharded.shards = 2;
  dir = make(sharded, [](std::vector<FakeTensor>& t, json&) { t.pop_back(); });
  const absl::Status s2 = open_status(dir);
  EXPECT_EQ(s2.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s2.message()), HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(std::string(s2.message()), HasSubstr("\"ln_f.bias\""));
}

TEST_F(CheckpointTest, ExtraTensor) {
  auto dir = make(FakeModel{}, [](std::vector<FakeTensor>& t, json&) {
    t.push_back(make_tensor("transformer.h.0.attn.q_proj.weight", "F32", {8, 8}, 0));
  });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.safetensors: tensor \"transformer.h.0.attn.q_proj.weight\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("is unexpected: not a GPT-2 tensor"));
}

TEST_F(CheckpointTest, MoreLayersThanConfig) {
  FakeModel m;
  m.n_layer = 3;
  auto dir = make(m, [](std::vector<FakeTensor>&, json& config) { config["n_layer"] = 2; });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor \"transformer.h.2."));
  EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to layer 2, but config.json has n_layer=2"));
}

TEST_F(CheckpointTest, FewerLayersThanConfig) {
  auto dir = make(FakeModel{}, [](std::vector<FakeTensor>&, json& config) { config["n_layer"] = 3; });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"h.2.ln_1.weight\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("n_layer=3"));
}

TEST_F(CheckpointTest, WrongShape) {
  auto dir = make(FakeModel{}, [](std::vector<FakeTensor>& t, json&) {
    t[2 + 2] = make_tensor(t[2 + 2].name, "F32", {8, 23}, 0);
  });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.safetensors: tensor \"transformer.h.0.attn.c_attn.weight\""));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("has shape [8, 23], expected [8, 24] = [n_embd, 3*n_embd]"));
}

TEST_F(CheckpointTest, ConfigDisagreesWithTensors) {
  const std::pair<const char*, std::string> cases[] = {
      {"vocab_size", "\"transformer.wte.weight\" has shape [40, 8], expected [50, 8] = [vocab_size, n_embd]"},
      {"n_positions", "\"transformer.wpe.weight\" has shape [12, 8], expected [50, 8]"},
      {"n_inner", "\"transformer.h.0.mlp.c_fc.weight\" has shape [8, 32], expected [8, 50]"},
  };
  for (const auto& [key, expected] : cases) {
    auto dir = make(FakeModel{}, [&](std::vector<FakeTensor>&, json& config) { config[key] = 50; });
    const absl::Status s = open_status(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(std::string(s.message()), HasSubstr(expected)) << key;
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(key) + "=50")) << key;
  }
  auto dir = make(FakeModel{}, [&](std::vector<FakeTensor>&, json& config) {
    config["n_embd"] = 16;
    config["n_head"] = 2;
  });
  EXPECT_THAT(std::string(open_status(dir).message()), HasSubstr("expected [40, 16]"));
}

TEST_F(CheckpointTest, UnsupportedDType) {
  for (const char* dtype : {"F64", "I8"}) {
    auto dir = make(FakeModel{}, [&](std::vector<FakeTensor>& t, json&) {
      t.back() = make_tensor(t.back().name, dtype, t.back().shape, 0);
    });
    const absl::Status s = open_status(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << dtype;
    EXPECT_THAT(std::string(s.message()), HasSubstr("model.safetensors: tensor \"transformer.ln_f.bias\""));
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::string("has dtype ") + dtype +
                                       "; ltm reads only F32, F16 and BF16"));
  }
}

TEST_F(CheckpointTest, DuplicateWithAndWithoutPrefix) {
  auto dir = make(FakeModel{}, [](std::vector<FakeTensor>& t, json&) {
    FakeTensor copy = t.back();
    copy.name = "ln_f.bias";
    t.push_back(copy);
  });
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"transformer.ln_f.bias\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("duplicates"));
}

TEST_F(CheckpointTest, MissingFolderConfigOrWeights) {
  const absl::Status no_dir = open_status(root_ + "/nowhere");
  EXPECT_EQ(no_dir.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_dir.message()), HasSubstr("nowhere"));

  const std::string dir = make(FakeModel{});
  std::filesystem::remove(dir + "/config.json");
  const absl::Status no_config = open_status(dir);
  EXPECT_EQ(no_config.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_config.message()), HasSubstr(dir + "/config.json"));

  write_text(dir + "/config.json", "{\"vocab_size\": ");
  const absl::Status bad_config = open_status(dir);
  EXPECT_EQ(bad_config.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_config.message()), HasSubstr(dir + "/config.json: invalid JSON"));

  write_text(dir + "/config.json", config_json(FakeModel{}).dump());
  std::filesystem::remove(dir + "/model.safetensors");
  const absl::Status no_weights = open_status(dir);
  EXPECT_EQ(no_weights.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_weights.message()), HasSubstr("neither model.safetensors nor"));
}

TEST_F(CheckpointTest, IndexProblems) {
  FakeModel m;
  m.shards = 2;
  const std::string dir = make(m);
  const std::string index_path = dir + "/model.safetensors.index.json";
  const json index = json::parse(read_bytes(index_path));
  ASSERT_TRUE(Checkpoint::open(dir).ok());

  // Invalid JSON.
  write_text(index_path, "{\"weight_map\": {");
  absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(index_path + ": invalid JSON"));

  // A tensor named twice (which shard holds it?), and nesting past the limit.
  {
    std::string text = index.dump();
    const std::string first = index["weight_map"].begin().key();
    text.insert(text.find("\"weight_map\":{") + 14,
                "\"" + first + "\":\"" + index["weight_map"].begin()->get<std::string>() + "\",");
    write_text(index_path, text);
    EXPECT_THAT(std::string(open_status(dir).message()),
                HasSubstr(index_path + ": invalid JSON: weight_map." + first + ": duplicate key"));
    write_text(index_path, "{\"metadata\": " + std::string(1000, '[') + "}");
    EXPECT_THAT(std::string(open_status(dir).message()), HasSubstr("nests deeper than 64 levels"));
  }

  // A weight_map entry that is not a file name is described by its size, not dumped whole.
  {
    json big = index;
    big["weight_map"].begin().value() = json::array();
    for (int i = 0; i < 100000; ++i) big["weight_map"].begin().value().push_back(i);
    write_text(index_path, big.dump());
    const std::string msg(open_status(dir).message());
    EXPECT_THAT(msg, HasSubstr("must be a shard file name (string), found a list of 100000 elements"));
    EXPECT_LT(msg.size(), 1000u);
  }

  // No weight_map.
  write_text(index_path, "{\"metadata\": {}}");
  EXPECT_THAT(std::string(open_status(dir).message()), HasSubstr("\"weight_map\""));

  // A shard that is not there.
  json missing_shard = index;
  missing_shard["weight_map"]["transformer.ln_f.bias"] = "model-00009-of-00009.safetensors";
  write_text(index_path, missing_shard.dump());
  s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr(index_path));
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard \"model-00009-of-00009.safetensors\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"transformer.ln_f.bias\""));

  // A shard name outside the folder.
  json escape = index;
  escape["weight_map"]["transformer.ln_f.bias"] = "../model.safetensors";
  write_text(index_path, escape.dump());
  EXPECT_THAT(std::string(open_status(dir).message()), HasSubstr("inside the checkpoint folder"));

  // A tensor the index lists in a shard that does not hold it.
  json wrong_shard = index;
  wrong_shard["weight_map"]["transformer.ln_f.bias"] = shard_name(0, 2);
  write_text(index_path, wrong_shard.dump());
  s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(shard_name(1, 2) + ": tensor \"transformer.ln_f.bias\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("is listed in"));

  // A tensor listed but absent from every shard.
  json phantom = index;
  phantom["weight_map"]["transformer.h.9.ln_1.weight"] = shard_name(0, 2);
  write_text(index_path, phantom.dump());
  s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"transformer.h.9.ln_1.weight\" is listed in shard"));

  // A tensor in a shard that the index does not list.
  json unlisted = index;
  unlisted["weight_map"].erase("transformer.wte.weight");
  write_text(index_path, unlisted.dump());
  s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor \"transformer.wte.weight\" is not listed in"));

  // Non-string shard name.
  json non_string = index;
  non_string["weight_map"]["transformer.wte.weight"] = 3;
  write_text(index_path, non_string.dump());
  EXPECT_THAT(std::string(open_status(dir).message()), HasSubstr("must be a shard file name"));
}

TEST_F(CheckpointTest, TruncatedShard) {
  FakeModel m;
  m.shards = 2;
  const std::string dir = make(m);
  const std::string shard = dir + "/" + shard_name(1, 2);
  const std::string bytes = read_bytes(shard);
  write_text(shard, bytes.substr(0, bytes.size() - 5));
  const absl::Status s = open_status(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr(shard + ": tensor \"transformer.ln_f.bias\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("truncated"));
}

// --- robustness: never crash, never a silent garbage model -----------------------------------

TEST_F(CheckpointTest, FuzzTruncatedAndFlippedFiles) {
  FakeModel m;
  m.dtype = "F16";
  m.n_layer = 1;
  const std::string dir = make(m);
  const std::string path = dir + "/model.safetensors";
  const std::string valid = read_bytes(path);
  auto good = Checkpoint::open(dir);
  ASSERT_TRUE(good.ok()) << good.status();
  const uint64_t header_end = SafetensorsFile::open(path)->data_offset();

  // Byte edits in place (pwrite), so that each try costs one open.
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  int opened = 0;
  for (uint64_t pos = 0; pos < header_end; ++pos) {
    for (unsigned char x : {0x01, 0x40}) {
      const char flipped = static_cast<char>(valid[pos] ^ x);
      ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(pos)), 1);
      auto ckpt = Checkpoint::open(dir);
      if (!ckpt.ok()) {
        EXPECT_THAT(std::string(ckpt.status().message()), HasSubstr("model.safetensors"));
        continue;
      }
      // Whatever still opens must be a complete, readable model.
      ++opened;
      for (const std::string& name : ckpt->tensor_names()) {
        const std::vector<int64_t> shape = ckpt->shape(name);
        const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
        std::vector<float> out(rows * cols);
        ckpt->read_f32(name, {0, rows, 0, cols}, out.data());
      }
    }
    ASSERT_EQ(::pwrite(fd, &valid[pos], 1, static_cast<off_t>(pos)), 1);
  }
  ASSERT_TRUE(Checkpoint::open(dir).ok());

  // Truncation at every length in the header and around the data start, then coarser.
  for (int64_t len = static_cast<int64_t>(valid.size()) - 1; len >= 0;
       len -= (len <= static_cast<int64_t>(header_end) + 64 ? 1 : 37)) {
    ASSERT_EQ(::ftruncate(fd, len), 0);
    const absl::Status s = open_status(dir);
    ASSERT_FALSE(s.ok()) << "truncated at " << len;
    EXPECT_THAT(std::string(s.message()), HasSubstr("model.safetensors")) << len;
  }
  ::close(fd);
  std::printf("header byte flips that still open: %d\n", opened);
}

// --- cross-check with the Python generator ----------------------------------------------------

std::string source_dir() {
  if (const char* env = std::getenv("LTM_SOURCE_DIR")) return env;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

TEST_F(CheckpointTest, ReadsPythonGeneratedCheckpoints) {
  const std::string python = "/usr/bin/python3";
  const std::string py_dir = source_dir() + "/tests/python";
  // torch and numpy are declared dependencies (scripts/setup installs them): missing, the test
  // fails, so that a broken install step cannot hide behind a skip.
  ASSERT_TRUE(std::filesystem::exists(python) &&
              std::filesystem::exists(py_dir + "/ltm_testing/checkpoint.py") &&
              std::system((python + " -c 'import torch, numpy' >/dev/null 2>&1").c_str()) == 0)
      << "needs /usr/bin/python3 with torch and numpy, and " << py_dir;
  struct Case {
    std::string args;
    std::string dtype;
  };
  const std::vector<Case> cases = {
      {"dtype='BF16', shards=3", "BF16"},
      {"dtype='F16', prefix='', lm_head=True, mask_buffers=True", "F16"},
      {"dtype='F32', shards=2, sinusoidal=True, n_inner=48, mask_buffers=True", "F32"},
  };
  // One Python process writes every case (importing torch is the slow part).
  std::string script =
      "import sys, numpy as np\n"
      "sys.path.insert(0, '" + py_dir + "')\n"
      "from ltm_testing.checkpoint import make_checkpoint, load_checkpoint\n"
      "def case(i, d, **kw):\n"
      "    w = make_checkpoint(d, n_layer=2, n_embd=16, n_head=4, vocab_size=50, n_positions=20,\n"
      "                        std=0.5, seed=i, **kw)\n"
      "    assert sorted(w) == sorted(load_checkpoint(d))\n"
      "    with open(d + '/expected.bin', 'wb') as f:\n"
      "        for name in w:\n"
      "            f.write(w[name].numpy().astype('<f4').tobytes())\n";
  for (size_t i = 0; i < cases.size(); ++i) {
    script += "case(" + std::to_string(i) + ", '" + root_ + "/py" + std::to_string(i) + "', " +
              cases[i].args + ")\n";
  }
  write_text(root_ + "/gen.py", script);
  ASSERT_EQ(std::system((python + " " + root_ + "/gen.py").c_str()), 0) << script;

  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string dir = root_ + "/py" + std::to_string(i);
    auto ckpt = Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    const std::string expected = read_bytes(dir + "/expected.bin");
    size_t offset = 0;
    double max_diff = 0;
    for (const std::string& name : ckpt->tensor_names()) {
      EXPECT_EQ(dtype_name(ckpt->dtype(name)), cases[i].dtype);
      const std::vector<int64_t> shape = ckpt->shape(name);
      const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
      std::vector<float> out(rows * cols), want(rows * cols);
      ckpt->read_f32(name, {0, rows, 0, cols}, out.data());
      ASSERT_LE(offset + out.size() * 4, expected.size());
      std::memcpy(want.data(), expected.data() + offset, out.size() * 4);
      offset += out.size() * 4;
      for (size_t k = 0; k < out.size(); ++k) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(out[k] - want[k])));
      }
    }
    EXPECT_EQ(offset, expected.size());
    std::printf("python checkpoint %s: max |ltm - torch| = %g\n", cases[i].args.c_str(), max_diff);
    EXPECT_EQ(max_diff, 0.0);
  }
}

}  // namespace
}  // namespace ltm
