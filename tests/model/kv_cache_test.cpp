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
