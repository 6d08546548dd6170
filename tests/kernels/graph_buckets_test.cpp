// The bucket arithmetic of captured decode steps (runtime/backend/graph_buckets.h).
#include "runtime/backend/graph_buckets.h"

#include <gtest/gtest.h>

#include <vector>

namespace ltm {
namespace {

TEST(GraphBuckets, SizesCoverEveryBatchWithFewPaddedRows) {
  EXPECT_TRUE(graph_bucket_sizes(0).empty());
  EXPECT_EQ(graph_bucket_sizes(1), (std::vector<int>{1}));
  EXPECT_EQ(graph_bucket_sizes(3), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(graph_bucket_sizes(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(graph_bucket_sizes(9), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(graph_bucket_sizes(24), (std::vector<int>{1, 2, 4, 8, 16, 24}));
  for (int max_batch = 1; max_batch <= 300; ++max_batch) {
    const std::vector<int> sizes = graph_bucket_sizes(max_batch);
    ASSERT_FALSE(sizes.empty());
    EXPECT_GE(sizes.back(), max_batch);
    EXPECT_LT(sizes.back(), max_batch + 8);
    EXPECT_LE(static_cast<int>(sizes.size()), max_batch / 8 + 4);
    for (size_t i = 1; i < sizes.size(); ++i) EXPECT_LT(sizes[i - 1], sizes[i]);
    for (int batch = 1; batch <= max_batch; ++batch) {
      const int bucket = graph_bucket_for(batch, sizes);
      ASSERT_GE(bucket, batch) << "max_batch " << max_batch << " batch " << batch;
      // The smallest bucket that fits: padding stays below 8 rows, and below the batch itself.
      EXPECT_LT(bucket - batch, 8);
      EXPECT_LT(bucket - batch, batch);
      for (int s : sizes)
        if (s >= batch) {
          EXPECT_EQ(bucket, s);
          break;
        }
    }
  }
}

TEST(GraphBuckets, OversizedOrEmptyBatchesRunEagerly) {
  const std::vector<int> sizes = graph_bucket_sizes(16);
  EXPECT_EQ(graph_bucket_for(17, sizes), 0);
  EXPECT_EQ(graph_bucket_for(0, sizes), 0);
  EXPECT_EQ(graph_bucket_for(5, std::vector<int>{}), 0);
}

TEST(GraphBuckets, AttentionWorkspaceIsSizedForTheLongestContext) {
  // One partition: no workspace.
  EXPECT_EQ(graph_attention_workspace_bytes(8, 12, 64, 512, 512), 0u);
  // 2048 tokens in 512-token partitions: 4 per (row, head), each 64 + 2 floats.
  EXPECT_EQ(graph_attention_workspace_bytes(8, 12, 64, 2048, 512), 8u * 12 * 4 * 66 * 4);
  EXPECT_EQ(graph_attention_workspace_bytes(1, 1, 128, 513, 512), 2u * 130 * 4);
}

}  // namespace
}  // namespace ltm
