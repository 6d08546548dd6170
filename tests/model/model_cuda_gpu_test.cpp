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
// Head dims 64 and 128 (d 256 with 4 and 2 heads). The Llama family the same way
// (greedy::margin_llama_config: RMSNorm, RoPE, SwiGLU, grouped-query attention, Qwen2's q/k/v
// biases), in bf16, fp16 and int8, as activation16_test emulates it on the CPU. Skipped without a
// CUDA device.
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

class ModelCuda : public ::testing::TestWithParam<std::tuple<Precision, int>> {};

TEST_P(ModelCuda, Greedy16BitOnGpuMatchesCpuFp32) {
  const auto [p, n_head] = GetParam();
  const ModelConfig c = greedy::margin_config(n_head);
  std::string error;
  std::unique_ptr<Backend> gpu = make_cuda_backend(0, &error);
  ASSERT_NE(gpu, nullptr) << error;
  greedy::ModelRun cpu_run(make_cpu_backend(0), c, Precision::kF32);
  greedy::ModelRun gpu_run(std::move(gpu), c, p);
  if (std::getenv("LTM_CUDA_F32_ACT") == nullptr) {
    EXPECT_EQ(gpu_run.model->activation_precision(),
              p == Precision::kInt8 ? Precision::kF16 : p);
  }
  greedy::expect_greedy_agree(cpu_run, gpu_run, kSteps, kTolRel, false,
                              std::string(precision_name(p)) + " on cuda vs f32 on cpu, head_dim " +
                                  std::to_string(c.n_embd / c.n_head));
}

class LlamaCuda : public ::testing::TestWithParam<std::tuple<Precision, int>> {};

TEST_P(LlamaCuda, GreedyOnGpuMatchesCpuFp32) {
  const auto [p, shape] = GetParam();
  const greedy::LlamaShape& sh = greedy::kLlamaShapes[shape];
  const ModelConfig c = greedy::margin_llama_config(sh);
  std::string error;
  std::unique_ptr<Backend> gpu = make_cuda_backend(0, &error);
  ASSERT_NE(gpu, nullptr) << error;
  ASSERT_TRUE(gpu->supports_llama());
  greedy::ModelRun cpu_run(make_cpu_backend(0), c, Precision::kF32);
  greedy::ModelRun gpu_run(std::move(gpu), c, p);
  greedy::expect_greedy_agree(
      cpu_run, gpu_run, kSteps, kTolRel, false,
      std::string(sh.type) + " " + precision_name(p) + " on cuda vs f32 on cpu (" +
          std::to_string(sh.n_head) + " heads of " + std::to_string(sh.head_dim) + " over " +
          std::to_string(sh.n_kv_head) + " KV heads)");
}

INSTANTIATE_TEST_SUITE_P(
    Types, LlamaCuda,
    ::testing::Combine(::testing::Values(Precision::kBF16, Precision::kF16, Precision::kInt8),
                       ::testing::Values(0, 1)),
    [](const ::testing::TestParamInfo<std::tuple<Precision, int>>& info) {
      return std::string(greedy::kLlamaShapes[std::get<1>(info.param)].type) + "_" +
             precision_name(std::get<0>(info.param));
    });

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
