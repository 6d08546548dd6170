// The counter-based random initialisation: a value depends only on (seed, tensor, element index),
// so any slice, read in any order or by any thread count, equals the same part of the whole
// tensor; and the values look like N(0, std).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "runtime/model/weight_source.h"

namespace ltm {
namespace {

ModelConfig config(int64_t vocab, int64_t d) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.n_positions = 64;
  c.n_embd = d;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_inner = 4 * d;
  return c;
}

TEST(RandomSource, ValuesLookNormalWithTheGivenStd) {
  const ModelConfig c = config(1000, 512);
  auto src = make_random_source(c, 11, 0.5f);
  std::vector<float> w(1000 * 512);
  src->read_f32("wte.weight", {0, 1000, 0, 512}, w.data());
  double sum = 0, sq = 0, max_abs = 0;
  for (float v : w) {
    sum += v;
    sq += double(v) * v;
    max_abs = std::max(max_abs, double(std::fabs(v)));
  }
  const double mean = sum / w.size(), sd = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(sd, 0.5, 0.005);
  EXPECT_GT(max_abs, 1.5);   // tails past 3 sigma exist ...
  EXPECT_LE(max_abs, 1.75);  // ... and end at 3.46 sigma
  // Neighbours are not correlated.
  double lag = 0;
  for (size_t i = 1; i < w.size(); ++i) lag += double(w[i]) * w[i - 1];
  EXPECT_NEAR(lag / (w.size() - 1) / 0.25, 0.0, 0.01);
}

TEST(RandomSource, DependsOnSeedTensorAndIndexOnly) {
  const ModelConfig c = config(100, 64);
  auto a = make_random_source(c, 1, 0.02f), b = make_random_source(c, 2, 0.02f);
  std::vector<float> x(64 * 256), y(64 * 256), z(64 * 256), fc(64 * 256);
  a->read_f32("h.0.mlp.c_fc.weight", {0, 64, 0, 256}, x.data());
  b->read_f32("h.0.mlp.c_fc.weight", {0, 64, 0, 256}, y.data());
  a->read_f32("h.1.mlp.c_fc.weight", {0, 64, 0, 256}, z.data());
  int same_seed = 0, same_tensor = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    same_seed += x[i] == y[i];
    same_tensor += x[i] == z[i];
  }
  EXPECT_LT(same_seed, 40);  // a few equal by chance among 16384 values of 2^18 levels
  EXPECT_LT(same_tensor, 40);
  // The same tensor read again, by one thread and by slices, is the same.
  omp_set_num_threads(1);
  a->read_f32("h.0.mlp.c_fc.weight", {0, 64, 0, 256}, fc.data());
  omp_set_num_threads(2);
  EXPECT_EQ(fc, x);
  std::vector<float> part(10 * 37);
  a->read_f32("h.0.mlp.c_fc.weight", {20, 30, 100, 137}, part.data());
  for (int r = 0; r < 10; ++r)
    for (int k = 0; k < 37; ++k) ASSERT_EQ(part[r * 37 + k], x[(20 + r) * 256 + 100 + k]);
}

TEST(RandomSource, ARowAcrossTheLowWordsWrapIsContinuous) {
  // wte of 2^20 + 2 rows of 4096: row 2^20 starts at element 2^32, where the generator's low
  // index word wraps. A row straddling it (the slice starts mid-row) equals two reads.
  const int64_t d = 4096, row = int64_t{1} << 20;
  const ModelConfig c = config(row + 2, d);
  auto src = make_random_source(c, 5, 1.0f);
  std::vector<float> two_rows(2 * d), before(d), after(d);
  src->read_f32("wte.weight", {row - 1, row + 1, 0, d}, two_rows.data());
  src->read_f32("wte.weight", {row - 1, row, 0, d}, before.data());
  src->read_f32("wte.weight", {row, row + 1, 0, d}, after.data());
  for (int64_t k = 0; k < d; ++k) {
    ASSERT_EQ(two_rows[k], before[k]);
    ASSERT_EQ(two_rows[d + k], after[k]);
  }
  // The rows on either side of the wrap differ (the high word enters the hash).
  std::vector<float> first_row(d);
  src->read_f32("wte.weight", {0, 1, 0, d}, first_row.data());
  EXPECT_NE(first_row, after);
}

}  // namespace
}  // namespace ltm
