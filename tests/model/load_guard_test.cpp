// Checkpoints that lie (runtime/model/load_guard.h): a checkpoint truncated while mapped cannot
// SIGBUS a loaded model, NaN/Inf weights are named by --check-weights, a file changed during load
// is named, and a model too large for memory is refused with the numbers before allocation.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/load_guard.h"
#include "runtime/model/model.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_source.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;

std::string source_dir() {
  const char* env = std::getenv("LTM_SOURCE_DIR");  // set by ctest
  return env != nullptr ? env : ".";
}

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 61;
  c.n_positions = 32;
  c.n_embd = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_inner = 64;
  return c;
}

// Writes DIR/config.json and DIR/model.safetensors (F32) with the random source's weights;
// `poison` names a tensor whose element 3 becomes `value`.
std::string write_checkpoint(const std::string& name, const ModelConfig& c,
                             const std::string& poison = "", float value = 0) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("ltm-load-guard-" + name + "-" +
                                                 std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  nlohmann::json j = {{"model_type", "gpt2"}, {"vocab_size", c.vocab_size},
                      {"n_positions", c.n_positions}, {"n_embd", c.n_embd},
                      {"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_inner", c.n_inner},
                      {"eos_token_id", c.vocab_size - 1}};
  std::ofstream(dir + "/config.json") << j.dump();
  std::unique_ptr<WeightSource> random = make_random_source(c, 3, 0.2f);
  std::vector<TensorSpec> specs = gpt2_tensor_specs(c);
  std::vector<std::vector<float>> data(specs.size());
  std::vector<SafetensorsWriteTensor> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<int64_t>& shape = specs[i].shape;
    const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
    data[i].resize(static_cast<size_t>(rows * cols));
    random->read_f32(specs[i].name, SliceSpec{0, rows, 0, cols}, data[i].data());
    if (specs[i].name == poison) data[i][3] = value;
    tensors.push_back({specs[i].name, "F32", shape,
                       std::string_view(reinterpret_cast<const char*>(data[i].data()),
                                        data[i].size() * sizeof(float))});
  }
  EXPECT_TRUE(write_safetensors(dir + "/model.safetensors", tensors).ok());
  return dir;
}

struct Loaded {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<GuardedSource> source;
  std::unique_ptr<Model> model;
};

absl::Status load(const std::string& dir, bool check, Loaded& out) {
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::open(dir);
  if (!ckpt.ok()) return ckpt.status();
  out.source = make_guarded_source(
      make_checkpoint_source(std::make_shared<const Checkpoint>(std::move(*ckpt)), dir), check);
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::load(*out.source, *out.backend, ShardSpec{}, out.tp);
  if (!m.ok()) return m.status();
  out.model = std::move(*m);
  return out.source->status();
}

// Logits of the last position of a short prompt, computed from scratch.
std::vector<float> logits(Loaded& l, const ModelConfig& c) {
  KvCache cache(*l.backend, c.n_layer, c.n_head, c.head_dim(), 4, 8);
  StepInput in;
  const std::vector<int32_t> prompt = {5, 17, 42, 8, 1};
  in.max_blocks_per_seq = 2;
  in.token_offsets = {0, static_cast<int32_t>(prompt.size())};
  for (size_t p = 0; p < prompt.size(); ++p) {
    in.token_ids.push_back(prompt[p]);
    in.positions.push_back(static_cast<int32_t>(p));
    in.slot_mapping.push_back(static_cast<int32_t>(p));
  }
  in.context_lens = {static_cast<int32_t>(prompt.size())};
  in.block_tables = {0, 1};
  in.logit_rows = {static_cast<int32_t>(prompt.size()) - 1};
  std::vector<float> hidden(prompt.size() * c.n_embd);
  l.model->run_stage(in, hidden.data(), cache);
  std::vector<float> out(l.model->vocab_local());
  l.model->compute_logits(in, hidden.data(), out.data());
  return out;
}

TEST(LoadGuard, CheckpointTruncatedAfterLoadDoesNotReachTheModel) {
  const ModelConfig c = small_config();
  const std::string dir = write_checkpoint("truncated", c);
  Loaded l;
  ASSERT_TRUE(load(dir, false, l).ok());
  const std::vector<float> before = logits(l, c);
  // The file is cut to its header while the checkpoint (and its mapping) is still alive.
  ASSERT_EQ(::truncate((dir + "/model.safetensors").c_str(), 8), 0);
  const std::vector<float> after = logits(l, c);  // would SIGBUS if a weight were still mapped
  EXPECT_EQ(before, after);
  std::filesystem::remove_all(dir);
}

// The same truncation reached through an in-place pointer kills the process: what the guard is for.
TEST(LoadGuardDeathTest, InPlaceMappingOfATruncatedFileFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ModelConfig c = small_config();
  const std::string dir = write_checkpoint("inplace", c);
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  const float* p = ckpt->f32_in_place("h.1.mlp.c_proj.weight");
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(::truncate((dir + "/model.safetensors").c_str(), 8), 0);
  EXPECT_DEATH({ volatile float x = p[c.n_inner * c.n_embd - 1]; (void)x; }, "");
  std::filesystem::remove_all(dir);
}

TEST(LoadGuard, CheckWeightsNamesNaNAndInf) {
  const ModelConfig c = small_config();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const std::string dir = write_checkpoint("nan", c, "h.1.attn.c_proj.weight", bad);
    Loaded unchecked;
    EXPECT_TRUE(load(dir, false, unchecked).ok());  // off by default
    Loaded checked;
    const absl::Status s = load(dir, true, checked);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("h.1.attn.c_proj.weight [0, 3]"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::isnan(bad) ? "nan" : "inf"));
    std::filesystem::remove_all(dir);
  }
  const std::string dir = write_checkpoint("clean", c);
  Loaded clean;
  EXPECT_TRUE(load(dir, true, clean).ok());
  std::filesystem::remove_all(dir);
}

TEST(LoadGuard, FileChangedDuringLoadIsNamed) {
  const ModelConfig c = small_config();
  const std::string dir = write_checkpoint("changed", c);
  const std::vector<FileStamp> stamps = stamp_checkpoint_files(dir);
  ASSERT_EQ(stamps.size(), 1u);
  EXPECT_TRUE(verify_unchanged(stamps).ok());
  ASSERT_EQ(::truncate((dir + "/model.safetensors").c_str(), 100), 0);
  const absl::Status s = verify_unchanged(stamps);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("changed while the weights were loaded"));
  std::filesystem::remove_all(dir);
  EXPECT_THAT(std::string(verify_unchanged(stamps).message()), HasSubstr("removed"));
}

TEST(LoadGuard, WeightBytesPerRank) {
  ModelConfig gpt2;
  gpt2.vocab_size = 50257;
  gpt2.n_positions = 1024;
  gpt2.n_embd = 768;
  gpt2.n_layer = 12;
  gpt2.n_head = 12;
  gpt2.n_inner = 3072;
  EXPECT_EQ(weight_bytes_per_rank(gpt2, ShardSpec{}), gpt2.parameter_count() * 4);
  // tp 2: about half on each rank (the replicated norms and biases are a rounding error).
  const int64_t half = weight_bytes_per_rank(gpt2, ShardSpec{2, 0, 1, 0});
  EXPECT_NEAR(static_cast<double>(half) / (gpt2.parameter_count() * 4), 0.5, 0.01);
}

TEST(LoadGuard, TooLargeForMemoryIsRefusedWithTheNumbers) {
  absl::StatusOr<ModelConfig> c =
      load_model_config(source_dir() + "/configs/gpt3-175b.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const int64_t bytes = weight_bytes_per_rank(*c, ShardSpec{});
  EXPECT_GT(bytes, int64_t{600} << 30);  // 175 G parameters in fp32
  const absl::Status s = check_host_memory(bytes, 1, int64_t{24} << 30);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the model's weights need "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("GiB per rank"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("24.00 GiB of memory is available"));
  EXPECT_TRUE(check_host_memory(1 << 20, 2, int64_t{24} << 30).ok());
  EXPECT_TRUE(check_host_memory(bytes, 1, -1).ok());  // unknown: not refused
  EXPECT_GT(available_host_memory(), 0);
}

// ltm-worker --kv-resident: the KV caches of the host's ranks against what is left.
TEST(LoadGuard, AResidentKvCacheThatDoesNotFitIsRefusedWithTheNumbers) {
  const int64_t gib1 = int64_t{1} << 30;
  const absl::Status s = check_resident_kv_memory(3 * gib1, 4, 10 * gib1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--kv-resident: the KV cache needs "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("3.00 GiB per rank"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("4 rank(s) on this host = 12.00 GiB"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("10.00 GiB of memory is available"));
  EXPECT_TRUE(check_resident_kv_memory(3 * gib1, 3, 10 * gib1).ok());
  EXPECT_TRUE(check_resident_kv_memory(3 * gib1, 4, -1).ok());  // unknown: not refused
}

}  // namespace
}  // namespace ltm
