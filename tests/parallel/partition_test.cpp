// Partition arithmetic, exhaustively over small shapes: ranges tile their whole exactly, uneven
// layer splits put the extra layers first, padded vocab rows are counted right, and refused
// layouts name their numbers.
#include "parallel/partition.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace ltm::parallel {
namespace {

using ::testing::HasSubstr;

std::string message_of(const absl::Status& status) { return std::string(status.message()); }

TEST(LayerRange, TilesEveryLayerCountAndStageCount) {
  for (int64_t n_layer = 1; n_layer <= 48; ++n_layer) {
    for (int pp = 1; pp <= n_layer; ++pp) {
      int64_t next = 0;
      for (int stage = 0; stage < pp; ++stage) {
        const Range r = layer_range(n_layer, pp, stage);
        ASSERT_EQ(r.begin, next) << "n_layer " << n_layer << " pp " << pp << " stage " << stage;
        const int64_t expected = n_layer / pp + (stage < n_layer % pp ? 1 : 0);
        ASSERT_EQ(r.size(), expected)
            << "n_layer " << n_layer << " pp " << pp << " stage " << stage;
        ASSERT_GE(r.size(), 1);
        next = r.end;
      }
      ASSERT_EQ(next, n_layer) << "n_layer " << n_layer << " pp " << pp;
    }
  }
}

TEST(LayerRange, UnevenSplitsGiveTheFirstStagesOneMore) {
  EXPECT_EQ(layer_range(12, 5, 0), (Range{0, 3}));
  EXPECT_EQ(layer_range(12, 5, 1), (Range{3, 6}));
  EXPECT_EQ(layer_range(12, 5, 2), (Range{6, 8}));
  EXPECT_EQ(layer_range(12, 5, 3), (Range{8, 10}));
  EXPECT_EQ(layer_range(12, 5, 4), (Range{10, 12}));
  EXPECT_EQ(layer_range(96, 8, 7), (Range{84, 96}));  // GPT-3 175B on 8 stages: even
  EXPECT_EQ(layer_range(1, 1, 0), (Range{0, 1}));
}

TEST(HeadRange, TilesForEveryDivisor) {
  for (int64_t n_head = 1; n_head <= 96; ++n_head) {
    for (int tp = 1; tp <= n_head; ++tp) {
      if (n_head % tp != 0) continue;
      int64_t next = 0;
      for (int r = 0; r < tp; ++r) {
        const Range heads = head_range(n_head, tp, r);
        ASSERT_EQ(heads.begin, next);
        ASSERT_EQ(heads.size(), n_head / tp);
        next = heads.end;
      }
      ASSERT_EQ(next, n_head);
    }
  }
  EXPECT_EQ(head_range(12, 4, 2), (Range{6, 9}));  // GPT-2 small, tp 4
}

TEST(FfnRange, TilesForEveryDivisor) {
  for (int64_t d_ff = 4; d_ff <= 512; d_ff += 4) {
    for (int tp = 1; tp <= 16; ++tp) {
      if (d_ff % tp != 0) continue;
      int64_t next = 0;
      for (int r = 0; r < tp; ++r) {
        const Range cols = ffn_range(d_ff, tp, r);
        ASSERT_EQ(cols.begin, next);
        ASSERT_EQ(cols.size(), d_ff / tp);
        next = cols.end;
      }
      ASSERT_EQ(next, d_ff);
    }
  }
  EXPECT_EQ(ffn_range(3072, 4, 3), (Range{2304, 3072}));
}

TEST(VocabRange, PaddedRowsTileAndValidRowsCountTheRealVocab) {
  for (int64_t vocab = 0; vocab <= 200; ++vocab) {
    for (int tp = 1; tp <= 16; ++tp) {
      const int64_t padded = padded_vocab(vocab, tp);
      ASSERT_EQ(padded % tp, 0);
      ASSERT_GE(padded, vocab);
      ASSERT_LT(padded, vocab + tp);
      int64_t next = 0, valid = 0;
      for (int r = 0; r < tp; ++r) {
        const Range rows = vocab_range(vocab, tp, r);
        ASSERT_EQ(rows.begin, next);
        ASSERT_EQ(rows.size(), padded / tp);
        const int64_t v = valid_rows(rows, vocab);
        int64_t expected = 0;  // count by brute force
        for (int64_t i = rows.begin; i < rows.end; ++i) expected += i < vocab ? 1 : 0;
        ASSERT_EQ(v, expected) << "vocab " << vocab << " tp " << tp << " rank " << r;
        valid += v;
        next = rows.end;
      }
      ASSERT_EQ(next, padded);
      ASSERT_EQ(valid, vocab);
    }
  }
}

TEST(VocabRange, Gpt2Vocab) {
  constexpr int64_t kVocab = 50257;
  EXPECT_EQ(padded_vocab(kVocab, 1), 50257);
  EXPECT_EQ(padded_vocab(kVocab, 2), 50258);
  EXPECT_EQ(padded_vocab(kVocab, 4), 50260);
  EXPECT_EQ(padded_vocab(kVocab, 8), 50264);
  const Range last = vocab_range(kVocab, 8, 7);
  EXPECT_EQ(last, (Range{43981, 50264}));
  EXPECT_EQ(valid_rows(last, kVocab), 6276);  // 7 padding rows
  EXPECT_EQ(valid_rows(vocab_range(kVocab, 8, 0), kVocab), 6283);
}

TEST(ValidateLayout, AcceptsGoodLayouts) {
  EXPECT_TRUE(validate_layout(1, 1, 1, 12, 12, 3072).ok());
  EXPECT_TRUE(validate_layout(4, 2, 2, 12, 12, 3072).ok());
  EXPECT_TRUE(validate_layout(16, 4, 4, 12, 12, 3072).ok());
  EXPECT_TRUE(validate_layout(12, 1, 12, 12, 12, 3072).ok());
  EXPECT_TRUE(validate_layout(5, 1, 5, 12, 12, 3072).ok());  // uneven stages are fine
  EXPECT_TRUE(validate_layout(64, 8, 8, 96, 96, 4 * 12288).ok());
}

TEST(ValidateLayout, WorldSizeMismatchNamesTheNumbers) {
  const absl::Status s = validate_layout(3, 2, 2, 12, 12, 3072);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(message_of(s), "mpirun started 3 ranks but --tp 2 x --pp 2 needs 4");
  EXPECT_EQ(message_of(validate_world(1, 2, 1)),
            "mpirun started 1 rank but --tp 2 x --pp 1 needs 2");
  EXPECT_TRUE(validate_world(8, 4, 2).ok());
}

TEST(ValidateLayout, HeadsNotDivisible) {
  const absl::Status s = validate_layout(5, 5, 1, 12, 12, 3060);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message_of(s), HasSubstr("--tp 5 does not divide the model's 12 attention heads"));
  EXPECT_THAT(message_of(s), HasSubstr("--tp values that fit: 1, 2, 3, 4, 6, 12"));
}

TEST(ValidateLayout, FfnNotDivisible) {
  const absl::Status s = validate_layout(4, 4, 1, 12, 12, 3070);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message_of(s), HasSubstr("--tp 4 does not divide the model's FFN width d_ff 3070"));
}

TEST(ValidateLayout, MoreStagesThanLayers) {
  const absl::Status s = validate_layout(13, 1, 13, 12, 12, 3072);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message_of(s), HasSubstr("--pp 13 is more than the model's 12 layers"));
  EXPECT_THAT(message_of(s), HasSubstr("use --pp 12 or less"));
}

TEST(ValidateLayout, NonPositiveTpOrPp) {
  EXPECT_EQ(message_of(validate_layout(0, 0, 1, 12, 12, 3072)), "--tp must be at least 1 (got 0)");
  EXPECT_EQ(message_of(validate_layout(2, 2, -1, 12, 12, 3072)),
            "--pp must be at least 1 (got -1)");
}

TEST(ValidateLayout, BrokenModelShapes) {
  EXPECT_THAT(message_of(validate_layout(1, 1, 1, 0, 12, 3072)), HasSubstr("n_head 0"));
  EXPECT_THAT(message_of(validate_layout(1, 1, 1, 12, 0, 3072)), HasSubstr("n_layer 0"));
}

TEST(PartitionDeathTest, RangesAssertOnRefusedLayouts) {
  EXPECT_DEATH(layer_range(4, 5, 0), "pp 5 n_layer 4");
  EXPECT_DEATH(head_range(12, 5, 0), "n_head 12 tp 5");
  EXPECT_DEATH(ffn_range(3072, 4, 4), "tp_rank 4 of 4");
}

}  // namespace
}  // namespace ltm::parallel
