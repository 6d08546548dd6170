// The whole model in 16 bits on the GPU (bf16 or fp16 weights, activations and KV cache, fp32
// accumulation and residual stream; or int8 weights with fp16 activations and cache) against the
// CPU backend in fp32 on the same checkpoint
// (tests/model/greedy_run.h: random weights, non-zero biases, the token embedding scaled so each
// step's top token has a large margin). Two sequences, one prefilling (19 tokens, off the block
// size) beside the other's decode, then both decoding: greedy tokens identical for 32 steps, and
// each step's logits within kTolRel of that step's largest |logit| (the tolerance of
// scripts/gpu_check's model step, scripts/lib/gpu_check_model.py). The checkpoint's smallest top-2
// margin must be above twice that, else it could not tell a wrong token from rounding.
// Also: with LTM_CUDA_F32_ACT unset the model really keeps 16-bit activations.
// Head dims 64 and 128 (d 256 with 4 and 2 heads). Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>

#include "parallel/communicator.h"
#include "tests/model/greedy_run.h"

namespace ltm {
namespace {

constexpr double kTolRel = 0.03;
constexpr int kSteps = 32;

struct ModelRun {
  std::unique_ptr<Backend> backend;
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  // p: the weights; the cache is p's type too, fp16 for int8 weights (a cache is never int8).
  ModelRun(std::unique_ptr<Backend> b, const ModelConfig& c, Precision p) : backend(std::move(b)) {
    std::unique_ptr<WeightSource> source = greedy::margin_source(c);
    ModelOptions options;
    options.weights = p;
    auto m = Model::load(*source, *backend, ShardSpec{}, tp, options);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(*m);
    cache = std::make_unique<KvCache>(*backend, c.n_layer, c.n_head, c.n_embd / c.n_head, 16, 64,
                                      p == Precision::kInt8 ? Precision::kF16 : p);
  }
};

class ModelCuda : public ::testing::TestWithParam<std::tuple<Precision, int>> {};

TEST_P(ModelCuda, Greedy16BitOnGpuMatchesCpuFp32) {
  const auto [p, n_head] = GetParam();
  const ModelConfig c = greedy::margin_config(n_head);
  std::string error;
  std::unique_ptr<Backend> gpu = make_cuda_backend(0, &error);
  ASSERT_NE(gpu, nullptr) << error;
  ModelRun cpu_run(make_cpu_backend(0), c, Precision::kF32);
  ModelRun gpu_run(std::move(gpu), c, p);
  if (std::getenv("LTM_CUDA_F32_ACT") == nullptr) {
    EXPECT_EQ(gpu_run.model->activation_precision(),
              p == Precision::kInt8 ? Precision::kF16 : p);
  }
  auto [ca, cb] = greedy::greedy_pair(*cpu_run.model, *cpu_run.backend, *cpu_run.cache, kSteps);
  auto [ga, gb] = greedy::greedy_pair(*gpu_run.model, *gpu_run.backend, *gpu_run.cache, kSteps);
  EXPECT_EQ(ca.generated, ga.generated);
  EXPECT_EQ(cb.generated, gb.generated);
  for (const auto& [r, g] : {std::pair{&ca, &ga}, std::pair{&cb, &gb}}) {
    const greedy::LogitGap gap = greedy::logit_gap(r->logits, g->logits);
    std::printf("result: %s on cuda vs f32 on cpu, head_dim %lld: %d greedy tokens %s; max "
                "|logit diff| %.4f of row max (tolerance %.2f); smallest top-2 margin %.3f\n",
                precision_name(p), static_cast<long long>(c.n_embd / c.n_head), kSteps,
                r->generated == g->generated ? "identical" : "DIFFERENT", gap.worst_rel, kTolRel,
                gap.min_margin_rel);
    EXPECT_LT(gap.worst_rel, kTolRel);
    EXPECT_GT(gap.min_margin_rel, 2 * kTolRel) << "the checkpoint's margins are too small";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, ModelCuda,
    ::testing::Combine(::testing::Values(Precision::kBF16, Precision::kF16, Precision::kInt8),
                       ::testing::Values(4, 2)),
    [](const ::testing::TestParamInfo<std::tuple<Precision, int>>& info) {
      return std::string(precision_name(std::get<0>(info.param))) + "_head_dim_" +
             std::to_string(256 / std::get<1>(info.param));
    });

}  // namespace
}  // namespace ltm
