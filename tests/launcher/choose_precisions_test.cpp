// The weights' and the KV cache's element types ltm-worker and ltm-bench choose from their flags
// and the checkpoint (launcher/model_setup.cpp, choose_precisions; the cache's default is
// runtime/backend/backend.h's default_kv_precision): the defaults with the CPU's activations
// (fp32) and CUDA's (device_activation_precision, what CudaBackend::activation_precision returns
// without LTM_CUDA_F32_ACT), what the flags override, and the errors for bad values.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "launcher/model_setup.h"
#include "launcher/worker_options.h"

namespace ltm {
namespace {

Precisions chosen(const std::string& device, const std::string& weights, const std::string& kv,
                  std::optional<DType> checkpoint = std::nullopt) {
  WorkerOptions o;
  o.device = device;
  o.weight_dtype = weights;
  o.kv_dtype = kv;
  absl::StatusOr<Precisions> p = choose_precisions(o, checkpoint, [&](Precision w) {
    return device == "cuda" ? device_activation_precision(w) : Precision::kF32;
  });
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : Precisions{};
}

TEST(ChoosePrecisions, DefaultCacheFollowsTheWeightsAndTheDevice) {
  EXPECT_EQ(chosen("cpu", "f32", "").kv, Precision::kF32);
  EXPECT_EQ(chosen("cuda", "f32", "").kv, Precision::kF32);
  // The CPU computes in f32 whatever the weights: fp16 keeps more of K and V than bf16.
  EXPECT_EQ(chosen("cpu", "bf16", "").kv, Precision::kF16);
  EXPECT_EQ(chosen("cpu", "fp16", "").kv, Precision::kF16);
  EXPECT_EQ(chosen("cpu", "int8", "").kv, Precision::kF16);
  // CUDA's activations are the 16-bit weights' type (int8: fp16): the cache takes that type; and
  // CUDA with fp32 activations (LTM_CUDA_F32_ACT=1) is the CPU's case.
  EXPECT_EQ(chosen("cuda", "bf16", "").kv, Precision::kBF16);
  EXPECT_EQ(chosen("cuda", "fp16", "").kv, Precision::kF16);
  EXPECT_EQ(chosen("cuda", "int8", "").kv, Precision::kF16);
  EXPECT_EQ(default_kv_precision(Precision::kBF16, Precision::kF32), Precision::kF16);
  // A bf16 checkpoint without --weight-dtype keeps bf16 weights, and so the bf16 cache on CUDA.
  const Precisions ckpt = chosen("cuda", "", "", DType::kBF16);
  EXPECT_EQ(ckpt.weights, Precision::kBF16);
  EXPECT_EQ(ckpt.kv, Precision::kBF16);
  EXPECT_EQ(chosen("cpu", "", "", DType::kBF16).kv, Precision::kF16);
}

TEST(ChoosePrecisions, FlagsOverrideTheDefaults) {
  EXPECT_EQ(chosen("cuda", "bf16", "fp16").kv, Precision::kF16);
  EXPECT_EQ(chosen("cpu", "bf16", "bf16").kv, Precision::kBF16);
  EXPECT_EQ(chosen("cuda", "f32", "bf16").kv, Precision::kBF16);
  EXPECT_EQ(chosen("cpu", "fp16", "f32").weights, Precision::kF16);
}

TEST(ChoosePrecisions, BadValuesNameTheFlag) {
  WorkerOptions o;
  o.kv_dtype = "int8";
  auto cpu = [](Precision) { return Precision::kF32; };
  absl::StatusOr<Precisions> p = choose_precisions(o, std::nullopt, cpu);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("--kv-dtype 'int8'"), std::string::npos);
  o.kv_dtype.clear();
  o.weight_dtype = "fp8";
  p = choose_precisions(o, std::nullopt, cpu);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("--weight-dtype 'fp8'"), std::string::npos);
}

}  // namespace
}  // namespace ltm
