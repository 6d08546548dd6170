// LoRA adapters: reading PEFT folders (runtime/model/lora.h), every defect by its message, the
// slices a tensor-parallel rank cuts, and merging into a weight. Numerics of the whole model with
// adapters are checked against the PyTorch reference in tests/python/test_mpi_lora.py.
#include "runtime/model/lora.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 50;
  c.n_positions = 16;
  c.n_embd = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_inner = 32;
  return c;
}

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/ltm_lora_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  struct T {
    std::string name;
    std::vector<int64_t> shape;
  };
  struct Poison {
    std::string tensor;
    int64_t at;
    float value;
  };
  // Writes an adapter: config `cfg` and tensors whose element i is value(i) (f32), but for the
  // elements `poison` names.
  void write(const json& cfg, const std::vector<T>& tensors, const std::vector<Poison>& poison = {}) {
    std::ofstream(dir_ + "/adapter_config.json") << cfg.dump();
    std::vector<std::string> data;
    std::vector<SafetensorsWriteTensor> w;
    for (const T& t : tensors) {
      int64_t n = 1;
      for (int64_t s : t.shape) n *= s;
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
      for (const Poison& p : poison)
        if (t.name == p.tensor) v[p.at] = p.value;
      data.emplace_back(reinterpret_cast<const char*>(v.data()), n * sizeof(float));
    }
    for (size_t i = 0; i < tensors.size(); ++i)
      w.push_back({tensors[i].name, "F32", tensors[i].shape, data[i]});
    ASSERT_TRUE(write_safetensors(dir_ + "/adapter_model.safetensors", w).ok());
  }
  static std::string name(int layer, const std::string& module, char ab) {
    return "base_model.model.transformer.h." + std::to_string(layer) + "." + module + ".lora_" +
           std::string(1, ab) + ".weight";
  }
  json config(int r = 2, json targets = json::array({"c_attn", "c_proj", "c_fc"})) {
    return {{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", 4}, {"target_modules", targets},
            {"fan_in_fan_out", true}, {"bias", "none"}};
  }
  std::vector<T> all_modules(int r = 2) {
    std::vector<T> t;
    for (int l = 0; l < 2; ++l) {
      t.push_back({name(l, "attn.c_attn", 'A'), {r, 8}});
      t.push_back({name(l, "attn.c_attn", 'B'), {24, r}});
      t.push_back({name(l, "attn.c_proj", 'A'), {r, 8}});
      t.push_back({name(l, "attn.c_proj", 'B'), {8, r}});
      t.push_back({name(l, "mlp.c_fc", 'A'), {r, 8}});
      t.push_back({name(l, "mlp.c_fc", 'B'), {32, r}});
      t.push_back({name(l, "mlp.c_proj", 'A'), {r, 32}});
      t.push_back({name(l, "mlp.c_proj", 'B'), {8, r}});
    }
    return t;
  }
  absl::StatusOr<LoraAdapter> open(int max_rank = 16) {
    return LoraAdapter::open(dir_, tiny(), max_rank);
  }
  void expect_error(absl::StatusCode code, const std::string& text, int max_rank = 16) {
    absl::StatusOr<LoraAdapter> a = open(max_rank);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), code) << a.status();
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(text));
  }
  std::string dir_;
};

TEST_F(LoraTest, OpensAPeftFolder) {
  write(config(), all_modules());
  absl::StatusOr<LoraAdapter> a = open();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank(), 2);
  EXPECT_FLOAT_EQ(a->scale(), 2.0f);
  EXPECT_EQ(a->modules(), (std::vector<std::string>{"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
  EXPECT_TRUE(a->has(1, LoraModule::kMlpProj));
}

TEST_F(LoraTest, UseRsloraScalesBySqrtR) {
  json c = config(4);
  c["use_rslora"] = true;
  c["lora_alpha"] = 8;
  write(c, all_modules(4));
  absl::StatusOr<LoraAdapter> a = open();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FLOAT_EQ(a->scale(), 4.0f);
}

TEST_F(LoraTest, MissingFolderAndFilesAreNotFound) {
  EXPECT_EQ(LoraAdapter::open(dir_ + "/nope", tiny(), 16).status().code(), absl::StatusCode::kNotFound);
  expect_error(absl::StatusCode::kNotFound, "adapter_config.json: missing");
  std::ofstream(dir_ + "/adapter_config.json") << config().dump();
  expect_error(absl::StatusCode::kNotFound, "adapter_model.safetensors: missing");
  std::ofstream(dir_ + "/adapter_model.bin") << "x";
  expect_error(absl::StatusCode::kNotFound, "safe_serialization");
}

TEST_F(LoraTest, RankOverTheMaximumIsRefused) {
  write(config(), all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "rank r = 2 is over the maximum of 1", 1);
}

TEST_F(LoraTest, UnknownModulesAndLayersAreRefused) {
  std::vector<T> t = all_modules();
  t.push_back({name(0, "attn.q_proj", 'A'), {2, 8}});
  write(config(), t);
  expect_error(absl::StatusCode::kInvalidArgument, "names module \"attn.q_proj\", which the base model does not have");
  t.pop_back();
  t.push_back({name(5, "attn.c_attn", 'A'), {2, 8}});
  write(config(), t);
  expect_error(absl::StatusCode::kInvalidArgument, "names layer 5, which the base model does not have (n_layer = 2)");
  t.pop_back();
  t.push_back({"base_model.model.lm_head.weight", {2, 8}});
  write(config(), t);
  expect_error(absl::StatusCode::kInvalidArgument, "is not a LoRA weight of a GPT-2 module");
  write(config(2, json::array({"q_proj", "v_proj"})), all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "target module \"q_proj\" is not a module of the base model");
  write(config(2, json::array({"c_attn"})), all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "which target_modules (c_attn) does not name");
}

TEST_F(LoraTest, ShapesThatDoNotFitAreRefused) {
  std::vector<T> t = all_modules();
  t[1].shape = {23, 2};  // c_attn B: out is 3 n_embd = 24
  write(config(), t);
  expect_error(absl::StatusCode::kInvalidArgument, "has shape [23, 2], expected [24, 2] = [out, r] for attn.c_attn");
  write(config(3), all_modules(2));  // r in the config disagrees with the tensors
  expect_error(absl::StatusCode::kInvalidArgument, "expected [3, 8] = [r, in]");
  t = all_modules();
  t.erase(t.begin() + 1);  // h.0 c_attn A without B
  write(config(), t);
  expect_error(absl::StatusCode::kInvalidArgument, "h.0.attn.c_attn has lora_A but no lora_B");
}

TEST_F(LoraTest, ConfigDefectsAreNamed) {
  json c = config();
  c.erase("r");
  write(c, all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "\"r\" (the rank) is missing");
  c = config();
  c["use_dora"] = true;
  write(c, all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "\"use_dora\"");
  c = config();
  c["peft_type"] = "IA3";
  write(c, all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "only LORA");
  std::ofstream(dir_ + "/adapter_config.json") << "{not json";
  expect_error(absl::StatusCode::kInvalidArgument, "invalid JSON");
}

// adapter_config.json through common/json_parse.h: a duplicate key (which r?) and nesting past
// the depth limit are refused, naming the key; "rank_pattern" 64 levels deep is still described.
TEST_F(LoraTest, ConfigDuplicatesAndDepthAreRefused) {
  write(config(), all_modules());
  std::string text = config().dump();
  text.back() = ',';
  text += "\"r\": 64}";
  std::ofstream(dir_ + "/adapter_config.json", std::ios::trunc) << text;
  expect_error(absl::StatusCode::kInvalidArgument, "invalid JSON: r: duplicate key");
  text = config().dump();
  text.back() = ',';
  text += "\"rank_pattern\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::ofstream(dir_ + "/adapter_config.json", std::ios::trunc) << text;
  expect_error(absl::StatusCode::kInvalidArgument, "nests deeper than 64 levels");
}

// A tp = 2 rank's slices are exactly the columns / rows of the full A and B that the base
// weight's slices take: per head group for the fused QKV (Q, K and V parts), FFN columns for
// c_fc, rows of the input for the two c_proj.
TEST_F(LoraTest, SlicesFollowTheBaseWeightsCut) {
  write(config(), all_modules());
  absl::StatusOr<LoraAdapter> a = open();
  ASSERT_TRUE(a.ok()) << a.status();
  const ModelConfig c = tiny();
  const LoraShardRanges whole = lora_shard_ranges(c, {0, 2}, {0, 32});
  const LoraShardRanges half = lora_shard_ranges(c, {1, 2}, {16, 32});  // tp_rank 1 of 2
  for (int m = 0; m < kLoraModules; ++m) {
    const LoraModule mod = static_cast<LoraModule>(m);
    const LoraSlice full = read_lora_slice(*a, whole, 1, mod);
    const LoraSlice part = read_lora_slice(*a, half, 1, mod);
    ASSERT_EQ(part.rank, 2);
    // Which full input columns and output rows the part holds.
    std::vector<int64_t> in_cols, out_rows;
    for (const parallel::Range& r : half.in[m])
      for (int64_t i = r.begin; i < r.end; ++i) in_cols.push_back(i);
    for (const parallel::Range& r : half.out[m])
      for (int64_t i = r.begin; i < r.end; ++i) out_rows.push_back(i);
    ASSERT_EQ(part.in, static_cast<int64_t>(in_cols.size()));
    ASSERT_EQ(part.out, static_cast<int64_t>(out_rows.size()));
    for (int k = 0; k < 2; ++k)
      for (size_t i = 0; i < in_cols.size(); ++i)
        EXPECT_EQ(part.a[k * part.in + i], full.a[k * full.in + in_cols[i]]) << m;
    for (size_t j = 0; j < out_rows.size(); ++j)
      for (int k = 0; k < 2; ++k)
        EXPECT_EQ(part.b[j * 2 + k], full.b[out_rows[j] * 2 + k]) << m;
  }
  // The fused QKV: head 1 of 2 (d_k 4) holds columns 4..8 of each of Q, K and V.
  EXPECT_EQ(half.out[0], (std::vector<parallel::Range>{{4, 8}, {12, 16}, {20, 24}}));
  EXPECT_EQ(half.in[1], (std::vector<parallel::Range>{{4, 8}}));
}

TEST_F(LoraTest, MergeAddsScaledATransposeBTranspose) {
  write(config(), all_modules());
  absl::StatusOr<LoraAdapter> a = open();
  ASSERT_TRUE(a.ok()) << a.status();
  const LoraSlice s = read_lora_slice(*a, lora_shard_ranges(tiny(), {0, 2}, {0, 32}), 0,
                                      LoraModule::kMlpFc);
  std::vector<float> w(8 * 32, 1.0f);
  ASSERT_TRUE(merge_lora_rows(s, w.data() + 3 * 32, 3, 5).ok());  // rows 3 and 4 only
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 32; ++j) {
      double want = 1.0;
      if (i == 3 || i == 4)
        for (int k = 0; k < 2; ++k) want += double{s.a[k * 8 + i]} * s.b[j * 2 + k];
      EXPECT_NEAR(w[i * 32 + j], want, 1e-6) << i << "," << j;
    }
}

// Every value of A and B is checked at open, wherever it lies: a NaN in A, an Inf in B, and a B
// that the scale takes out of float's range are each refused, naming the file, the tensor and the
// element. The poisoned element of c_attn's B is in the rows of the second head group, i.e. in
// what only tp rank 1 of 2 would hold: rank 0's open refuses it all the same.
TEST_F(LoraTest, NonFiniteValuesAreRefusedNamingTheElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  write(config(), all_modules(), {{name(1, "mlp.c_fc", 'A'), 9, nan}});
  expect_error(absl::StatusCode::kInvalidArgument,
               "adapter_model.safetensors: tensor \"" + name(1, "mlp.c_fc", 'A') +
                   "\": element 9 [1, 1] is nan: LoRA values must be finite");
  write(config(), all_modules(), {{name(0, "attn.c_attn", 'B'), 23 * 2 + 1, -inf}});
  expect_error(absl::StatusCode::kInvalidArgument,
               name(0, "attn.c_attn", 'B') + "\": element 47 [23, 1] is -inf");
  write(config(), all_modules(), {{name(0, "attn.c_proj", 'B'), 3, 3e38f}});  // scale 2
  expect_error(absl::StatusCode::kInvalidArgument, "which times the scale 2 overflows float");
  write(config(), all_modules(), {{name(0, "attn.c_proj", 'B'), 3, 1e38f}});  // 2e38 still fits
  EXPECT_TRUE(open().ok());
}

TEST_F(LoraTest, AlphaAndScaleAreBounded) {
  json c = config();  // r = 2
  c["lora_alpha"] = 2048;
  write(c, all_modules());
  EXPECT_TRUE(open().ok());  // scale 1024: the limit
  c["lora_alpha"] = 2050;
  write(c, all_modules());
  expect_error(absl::StatusCode::kInvalidArgument,
               "lora_alpha / r = 1025 (lora_alpha = 2050, r = 2) is over ltm's limit of 1024");
  c["use_rslora"] = true;  // 2050 / sqrt(2) = 1449.6
  write(c, all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "lora_alpha / sqrt(r) = 1449.");
  c = config();
  for (const json& alpha : {json(0), json(-4), json(-0.0)}) {
    c["lora_alpha"] = alpha;
    write(c, all_modules());
    expect_error(absl::StatusCode::kInvalidArgument, "must be a finite number > 0");
  }
  std::ofstream(dir_ + "/adapter_config.json")
      << R"({"r": 2, "lora_alpha": 1e400, "target_modules": ["c_attn", "c_proj", "c_fc"]})";
  expect_error(absl::StatusCode::kInvalidArgument, "adapter_config.json");  // out of range
  c = config();
  c["r"] = 0;
  write(c, all_modules());
  expect_error(absl::StatusCode::kInvalidArgument, "r = 0 must be >= 1");
}

// A max_rank above kMaxLoraRank (no flag allows one) is capped: merge_lora_rows' per-row buffer
// holds kMaxLoraRank values.
TEST_F(LoraTest, RankIsCappedAtTheLargestSupported) {
  write(config(kMaxLoraRank + 1), all_modules(kMaxLoraRank + 1));
  expect_error(absl::StatusCode::kInvalidArgument, "rank r = 257 is over the maximum of 256",
               1 << 20);
}

// An adapter folder is DIR inside a parent P (for adapters loaded by name, P is --lora-dir).
// Links among P's files are followed; a file that resolves outside P, or that is not a regular
// file, fails the load with its name.
class LoraFilesTest : public LoraTest {
 protected:
  void SetUp() override {
    LoraTest::SetUp();
    parent_ = dir_;
    dir_ = parent_ + "/adapter";
    std::filesystem::create_directory(dir_);
    std::string out = ::testing::TempDir() + "/ltm_lora_out_XXXXXX";
    ASSERT_NE(::mkdtemp(out.data()), nullptr);
    outside_ = out;
  }
  void TearDown() override {
    dir_ = parent_;
    LoraTest::TearDown();
    std::filesystem::remove_all(outside_);
  }
  // Moves the adapter's `file` to `to` and puts a link to it in its place.
  void move_and_link(const std::string& file, const std::string& to) {
    std::filesystem::rename(dir_ + "/" + file, to);
    std::filesystem::create_symlink(to, dir_ + "/" + file);
  }
  std::string parent_, outside_;
};

TEST_F(LoraFilesTest, LinksOutsideTheParentFolderAreRefused) {
  write(config(), all_modules());
  move_and_link("adapter_model.safetensors", outside_ + "/w.safetensors");
  expect_error(absl::StatusCode::kInvalidArgument,
               "adapter/adapter_model.safetensors: resolves to " +
                   std::filesystem::canonical(outside_ + "/w.safetensors").string() + ", outside ");
  write(config(), all_modules());  // replaces the link by a file
  move_and_link("adapter_config.json", outside_ + "/c.json");
  expect_error(absl::StatusCode::kInvalidArgument, "adapter_config.json: resolves to ");
  // The content of what a link points at never shows in a message (here: not JSON at all).
  std::ofstream(outside_ + "/c.json") << "secret-text";
  absl::StatusOr<LoraAdapter> a = open();
  EXPECT_THAT(std::string(a.status().message()), ::testing::Not(HasSubstr("secret")));
}

TEST_F(LoraFilesTest, LinksInsideTheParentFolderAreFollowed) {
  write(config(), all_modules());
  std::filesystem::create_directory(parent_ + "/shared");
  move_and_link("adapter_model.safetensors", parent_ + "/shared/w.safetensors");
  std::filesystem::create_directory_symlink(dir_, parent_ + "/alias");
  absl::StatusOr<LoraAdapter> a = LoraAdapter::open(parent_ + "/alias", tiny(), 16);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank(), 2);
}

TEST_F(LoraFilesTest, FifosAndFoldersInPlaceOfAFileAreRefused) {
  write(config(), all_modules());
  std::filesystem::remove(dir_ + "/adapter_model.safetensors");
  ASSERT_EQ(::mkfifo((dir_ + "/adapter_model.safetensors").c_str(), 0600), 0);
  // Before: the load waited for a writer to open the FIFO (forever).
  expect_error(absl::StatusCode::kInvalidArgument,
               "adapter_model.safetensors is a FIFO: an adapter's files must be regular files");
  std::filesystem::remove(dir_ + "/adapter_model.safetensors");
  std::filesystem::create_directory(dir_ + "/adapter_model.safetensors");
  expect_error(absl::StatusCode::kInvalidArgument, "adapter_model.safetensors is a directory");
  std::filesystem::remove(dir_ + "/adapter_model.safetensors");
  write(config(), all_modules());
  std::filesystem::remove(dir_ + "/adapter_config.json");
  std::filesystem::create_directory(dir_ + "/adapter_config.json");
  expect_error(absl::StatusCode::kInvalidArgument, "adapter_config.json is a directory");
  std::filesystem::remove(dir_ + "/adapter_config.json");
  std::filesystem::create_symlink(outside_ + "/gone", dir_ + "/adapter_config.json");
  expect_error(absl::StatusCode::kNotFound, "adapter_config.json: missing");  // dangling link
}

TEST_F(LoraFilesTest, FilesLargerThanAnyAdapterAreNotRead) {
  write(config(), all_modules());
  {
    std::ofstream f(dir_ + "/adapter_config.json", std::ios::app);
    f << std::string(kMaxLoraConfigBytes, ' ');
  }
  expect_error(absl::StatusCode::kInvalidArgument,
               "bytes, over the limit of 1048576 (a PEFT adapter_config.json");
  write(config(), all_modules());
  // tiny(): 2 layers, r = 2: (8+24 + 8+8 + 8+32 + 32+8) * 2 * 4 * 2 = 2048 bytes of data at most.
  ASSERT_EQ(::truncate((dir_ + "/adapter_model.safetensors").c_str(),
                       static_cast<off_t>(2048 + kLoraHeaderSlackBytes + 1)), 0);
  expect_error(absl::StatusCode::kInvalidArgument,
               "16779265 bytes, over the limit of 16779264 (every module of every layer at rank 2 "
               "in F32, plus 16 MiB for the header)");
}

// --lora-merge of such an update fails the model's load, naming the adapter and the tensor.
TEST_F(LoraTest, MergedLoadThatOverflowsFails) {
  write(config(), all_modules(), {{name(1, "mlp.c_fc", 'A'), 2, 1e30f},
                                  {name(1, "mlp.c_fc", 'B'), 5 * 2, 1e38f}});
  absl::StatusOr<LoraAdapter> a = open();
  ASSERT_TRUE(a.ok()) << a.status();
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<WeightSource> source = make_random_source(tiny(), 1, 0.02f);
  ModelOptions options;
  options.merge = &*a;
  auto m = Model::load(*source, *backend, ShardSpec{}, tp, options);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("--lora-merge of " + dir_ + " into h.1.mlp.c_fc.weight: merging the LoRA "
                        "update makes element [2, 5] of the weight non-finite"));
  write(config(), all_modules());
  a = open();
  ASSERT_TRUE(a.ok()) << a.status();
  options.merge = &*a;
  EXPECT_TRUE(Model::load(*source, *backend, ShardSpec{}, tp, options).ok());
}

// Merging an update that takes a weight out of float's range fails (the load), naming the element.
TEST_F(LoraTest, MergeThatOverflowsIsAnError) {
  write(config(), all_modules(), {{name(0, "mlp.c_fc", 'B'), 5 * 2, 1e38f}});  // B[5, 0], times 2
  absl::StatusOr<LoraAdapter> a = open();
  ASSERT_TRUE(a.ok()) << a.status();
  const LoraSlice s = read_lora_slice(*a, lora_shard_ranges(tiny(), {0, 2}, {0, 32}), 0,
                                      LoraModule::kMlpFc);
  ASSERT_FLOAT_EQ(s.a[0 * 8 + 2], -0.28f);  // A[0, 2]: the update of [2, 5] is about -5.6e37
  std::vector<float> w(8 * 32, 1.0f);
  w[2 * 32 + 5] = -3.4e38f;
  absl::Status st = merge_lora_rows(s, w.data(), 0, 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("element [2, 5] of the weight non-finite"));
  w.assign(8 * 32, 1.0f);  // the same update on ordinary weights stays finite
  EXPECT_TRUE(merge_lora_rows(s, w.data(), 0, 8).ok());
}

}  // namespace
}  // namespace ltm
