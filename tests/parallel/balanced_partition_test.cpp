// Pipeline stages balanced for the LM head on the last stage.
#include <gtest/gtest.h>

#include "parallel/partition.h"

namespace ltm::parallel {
namespace {

TEST(BalancedLayerRange, TilesTheLayersAndKeepsOnePerStage) {
  for (int64_t n = 1; n <= 40; ++n) {
    for (int pp = 1; pp <= n && pp <= 8; ++pp) {
      for (double head : {0.0, 0.34, 1.0, 5.45, 30.0}) {
        int64_t next = 0;
        for (int r = 0; r < pp; ++r) {
          const Range got = balanced_layer_range(n, pp, r, head);
          EXPECT_EQ(got.begin, next) << n << " " << pp << " " << r << " " << head;
          EXPECT_GE(got.size(), 1) << n << " " << pp << " " << r << " " << head;
          next = got.end;
        }
        EXPECT_EQ(next, n);
      }
    }
  }
}

TEST(BalancedLayerRange, NoHeadIsTheEvenSplit) {
  for (int64_t n = 1; n <= 20; ++n)
    for (int pp = 1; pp <= n; ++pp)
      for (int r = 0; r < pp; ++r) EXPECT_EQ(balanced_layer_range(n, pp, r, 0.0), layer_range(n, pp, r));
}

TEST(BalancedLayerRange, Gpt2SmallGivesTheHeadStageFewerLayers) {
  // GPT-2-124M: the head is worth 50257 / (12 * 768) = 5.45 layers; (12 + 5.45) / 2 = 8.7 per
  // stage, so the head stage takes 3.27, rounded down to 3, layers.
  const double head = 50257.0 / (12.0 * 768.0);
  EXPECT_EQ(balanced_layer_range(12, 2, 0, head), (Range{0, 9}));
  EXPECT_EQ(balanced_layer_range(12, 2, 1, head), (Range{9, 12}));
  // GPT-3-175B: 96 layers, head 0.34 layers: 4 stages of 24.
  const double head175 = 50257.0 / (12.0 * 12288.0);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(balanced_layer_range(96, 4, r, head175).size(), 24);
}

TEST(StageLayers, Gpt2SmallSplitsEightAndFour) {
  // The head of GPT-2-124M counts as 50257 / (12 * 768) / (1.3 / 1.07) = 4.49 layers once a
  // layer's attention and norms are counted: (12 + 4.49) / 2 = 8.2 per stage, 4 for the head's.
  EXPECT_NEAR(lm_head_layers(50257, 768), 4.49, 0.01);
  EXPECT_EQ(stage_layers(12, 50257, 768, 2, 0), (Range{0, 8}));
  EXPECT_EQ(stage_layers(12, 50257, 768, 2, 1), (Range{8, 12}));
  EXPECT_EQ(max_stage_layers(12, 50257, 768, 2), 8);
  EXPECT_EQ(max_stage_layers(12, 50257, 768, 1), 12);
  // GPT-3-175B: the head is worth 0.28 layers, too little to move one: 4 stages of 24.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(stage_layers(96, 50257, 12288, 4, r).size(), 24);
}

}  // namespace
}  // namespace ltm::parallel
