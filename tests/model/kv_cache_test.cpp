// The KV sizing policy (plan_kv_blocks) and a rank's KV storage.
#include "runtime/model/kv_cache.h"

#include <gtest/gtest.h>

#include "runtime/backend/backend.h"

namespace ltm {
namespace {

KvSizing gpt2_small(int64_t kv_memory_mb, bool serving) {
  KvSizing z;
  z.n_layers_local = 12;
  z.n_head_local = 12;
  z.head_dim = 64;
  z.n_positions = 1024;
  z.block_size = 16;
  z.kv_memory_mb = kv_memory_mb;
  z.serving = serving;
  return z;
}

TEST(KvCache, BlockBytesCountKAndVOfEveryLayer) {
  // 2 (K, V) x 12 layers x 12 heads x 16 slots x 64 elements x 4 bytes (2 for a 16-bit cache).
  EXPECT_EQ(KvCache::block_bytes(12, 12, 64, 16), 2 * 12 * 12 * 16 * 64 * 4);
  EXPECT_EQ(KvCache::block_bytes(12, 12, 64, 16, Precision::kF16), 2 * 12 * 12 * 16 * 64 * 2);
}

TEST(PlanKvBlocks, ASixteenBitCacheHoldsTwiceTheBlocks) {
  KvSizing z = gpt2_small(0, true);
  auto f32 = plan_kv_blocks(z);
  z.precision = Precision::kBF16;
  auto bf16 = plan_kv_blocks(z);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  EXPECT_EQ(*bf16, 2 * *f32);
}

TEST(PlanKvBlocks, ServingDefaultsToOneGibibyte) {
  const int64_t per_block = KvCache::block_bytes(12, 12, 64, 16);  // 1.5 MB
  auto n = plan_kv_blocks(gpt2_small(0, true));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, (int64_t{1024} << 20) / per_block);
}

TEST(PlanKvBlocks, OneShotDefaultsToOneContext) {
  auto n = plan_kv_blocks(gpt2_small(0, false));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, blocks_for(1024, 16));
}

TEST(PlanKvBlocks, AGivenBudgetIsHonouredEvenBelowOneContext) {
  auto n = plan_kv_blocks(gpt2_small(3, true));  // 3 MB: two 1.5 MB blocks
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
}

TEST(PlanKvBlocks, ABudgetBelowOneBlockIsRefusedWithTheNumbers) {
  KvSizing z = gpt2_small(1, true);
  z.n_layers_local = 96;  // 12 MB a block
  auto n = plan_kv_blocks(z);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("--kv-memory-mb 1 holds no KV block"), std::string::npos)
      << n.status();
}

// GPT-2 small on a 24 GiB GPU: 0.9 x (24 GiB - weights - activations - graphs - runtime).
KvSizing gpt2_small_on_gpu(int64_t device_memory, double fraction) {
  KvSizing z = gpt2_small(0, true);
  z.device_memory_bytes = device_memory;
  z.gpu_memory_fraction = fraction;
  z.weight_bytes = 500 << 20;
  z.activation_bytes = gpu_activation_bytes(768, 3072, 50304, 1, 512, 64);
  z.graph_bytes = kGpuGraphBytes;
  z.overhead_bytes = kGpuRuntimeBytes;
  return z;
}

TEST(PlanKvBlocks, ServingOnAGpuTakesTheFractionOfWhatIsLeft) {
  const int64_t per_block = KvCache::block_bytes(12, 12, 64, 16);
  const KvSizing z = gpt2_small_on_gpu(int64_t{24} << 30, 0.9);
  // Activations: 2 x (512 rows x (2 d + 3 d + d + 4 d) + 64 rows x 50304) x 4 bytes.
  EXPECT_EQ(z.activation_bytes, 2 * (512 * (10 * 768) + 64 * 50304) * 4);
  const int64_t left = (int64_t{24} << 30) - (500 << 20) - z.activation_bytes -
                       (int64_t{256} << 20) - (int64_t{2} << 30);
  EXPECT_EQ(gpu_kv_budget_bytes(z), static_cast<int64_t>(left * 0.9));
  auto n = plan_kv_blocks(z);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(left * 0.9) / per_block);
  // Half the fraction, half the blocks (to one block); a given budget still wins; one-shot
  // still sizes for one context.
  auto half = plan_kv_blocks(gpt2_small_on_gpu(int64_t{24} << 30, 0.45));
  ASSERT_TRUE(half.ok());
  EXPECT_NEAR(*half, *n / 2, 1);
  KvSizing given = z;
  given.kv_memory_mb = 3;
  EXPECT_EQ(*plan_kv_blocks(given), 2);
  KvSizing one_shot = z;
  one_shot.serving = false;
  EXPECT_EQ(*plan_kv_blocks(one_shot), blocks_for(1024, 16));
}

TEST(PlanKvBlocks, AGpuWithoutRoomForOneContextIsRefusedWithTheNumbers) {
  // 2.8 GiB: the 2 GiB runtime, 256 MiB of graphs, 500 MiB of weights and 33 MiB of activations
  // leave ~30 MiB, less than one 1024-token context (64 blocks of 1.5 MB).
  auto n = plan_kv_blocks(gpt2_small_on_gpu(int64_t{2867} << 20, 0.9));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(n.status().message().find("no room for one context"), std::string::npos)
      << n.status();
  EXPECT_NE(n.status().message().find("weights 500 MiB"), std::string::npos) << n.status();
}

// --draft-device device: rank 0's draft model on the GPU comes off the budget (of every rank:
// they hold the same blocks), and a draft that leaves no room for one context is named.
TEST(PlanKvBlocks, ADraftOnTheGpuIsTakenOffTheBudget) {
  const KvSizing z = gpt2_small_on_gpu(int64_t{24} << 30, 0.9);
  KvSizing with = z;
  with.draft_bytes = int64_t{1} << 30;
  EXPECT_NEAR(static_cast<double>(gpu_kv_budget_bytes(z) - gpu_kv_budget_bytes(with)),
              0.9 * (int64_t{1} << 30), 1.0);
  EXPECT_LT(*plan_kv_blocks(with), *plan_kv_blocks(z));
  // 4 GiB: ~1.2 GiB left for the cache without the draft; a 1.2 GiB draft leaves no context.
  KvSizing small = gpt2_small_on_gpu(int64_t{4} << 30, 0.9);
  ASSERT_TRUE(plan_kv_blocks(small).ok());
  small.draft_bytes = int64_t{1200} << 20;
  auto n = plan_kv_blocks(small);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(n.status().message().find("the draft model 1200 MiB"), std::string::npos)
      << n.status();
}

TEST(KvCache, StorageStartsZeroed) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, 2, 3, 8, 4, 5);
  EXPECT_EQ(cache.precision(), Precision::kF32);
  EXPECT_EQ(cache.n_blocks(), 5);
  EXPECT_EQ(cache.block_size(), 4);
  for (int l = 0; l < 2; ++l)
    for (int i = 0; i < 5 * 3 * 4 * 8; ++i) {
      ASSERT_EQ(static_cast<const float*>(cache.k(l))[i], 0.0f);
      ASSERT_EQ(static_cast<const float*>(cache.v(l))[i], 0.0f);
    }
}

}  // namespace
}  // namespace ltm
