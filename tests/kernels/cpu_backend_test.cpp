// The CPU backend's weights and caches in each precision (f32, bf16, fp16): matmul on weights
// written whole or by row ranges (streamed loading), the tied embedding's lookup and LM head,
// and K/V written to and read from 16-bit caches; against double-precision references computed on
// the same rounded values, so the tolerance is that of fp32 arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/weight_type.h"
#include "runtime/backend/backend.h"

namespace ltm {
namespace {

namespace kc = kernels::cpu;

kc::WeightType kernel_type(Precision p) {
  return p == Precision::kF32 ? kc::WeightType::kF32
         : p == Precision::kBF16 ? kc::WeightType::kBF16 : kc::WeightType::kF16;
}

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<float> rounded(const std::vector<float>& v, Precision p) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = kc::round_to(kernel_type(p), v[i]);
  return r;
}

class CpuBackendPrecision : public ::testing::TestWithParam<Precision> {};

TEST_P(CpuBackendPrecision, MatmulOnWeightsWrittenWholeOrByRowRanges) {
  const Precision p = GetParam();
  auto backend = make_cpu_backend(2);
  const int64_t m = 9, k = 200, n = 130;  // n: two panels and a ragged one
  const std::vector<float> a = random_vector(m * k, 1), w = random_vector(k * n, 2);
  const std::vector<float> wr = rounded(w, p);
  std::vector<double> ref(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t q = 0; q < k; ++q)
      for (int64_t j = 0; j < n; ++j) ref[i * n + j] += double(a[i * k + q]) * wr[q * n + j];

  DeviceBuffer whole = backend->upload_weight(w.data(), k, n, p);
  EXPECT_EQ(whole.precision(), p);
  DeviceBuffer pieces = backend->alloc_weight(k, n, p);
  for (int64_t r0 = 0; r0 < k; r0 += 37)  // ranges that do not line up with anything
    backend->write_weight_rows(pieces, w.data() + r0 * n, r0, std::min(k, r0 + 37), k, n);
  ASSERT_EQ(whole.bytes(), pieces.bytes());
  EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), whole.bytes()), 0);
  EXPECT_EQ(whole.bytes(), static_cast<size_t>(3 * 64 * k) * precision_size(p));

  std::vector<float> c(m * n, 0.5f);
  backend->matmul(a.data(), pieces, c.data(), m, n, k, 1.0f);
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i) worst = std::max(worst, std::fabs(c[i] - (ref[i] + 0.5)));
  std::printf("[ %s ] max |matmul - reference on rounded weights| = %.3g\n", precision_name(p), worst);
  EXPECT_LT(worst, 1e-4);
}

TEST_P(CpuBackendPrecision, EmbeddingLookupAndLmHead) {
  const Precision p = GetParam();
  auto backend = make_cpu_backend(2);
  const int64_t rows = 150, d = 40, m = 5;
  const std::vector<float> e = random_vector(rows * d, 3), x = random_vector(m * d, 4);
  const std::vector<float> er = rounded(e, p);
  DeviceBuffer table = backend->alloc_embedding(rows, d, p);
  for (int64_t r0 = 0; r0 < rows; r0 += 64)
    backend->write_embedding_rows(table, e.data() + r0 * d, r0, std::min(rows, r0 + 64), rows, d);
  const std::vector<int32_t> ids = {1000, 1149, 7, 1050};  // this rank holds [1000, 1150)
  std::vector<float> out(ids.size() * d, std::nanf(""));
  backend->embed(ids.data(), table, 1000, 1150, out.data(), static_cast<int64_t>(ids.size()), d);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t c = 0; c < d; ++c) {
      const bool mine = ids[t] >= 1000 && ids[t] < 1150;
      ASSERT_EQ(out[t * d + c], mine ? er[(ids[t] - 1000) * d + c] : 0.0f) << t << "," << c;
    }
  std::vector<float> logits(m * rows);
  backend->lm_head(x.data(), table, logits.data(), m, rows, d);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0;
      for (int64_t c = 0; c < d; ++c) ref += double(x[i * d + c]) * er[r * d + c];
      worst = std::max(worst, std::fabs(logits[i * rows + r] - ref));
    }
  EXPECT_LT(worst, 1e-4);
}

TEST_P(CpuBackendPrecision, AttentionOverACacheOfThisPrecision) {
  const Precision p = GetParam();
  auto backend = make_cpu_backend(2);
  // One sequence, 3 cached tokens + 2 new ones, 2 heads of 8, blocks of 4 tokens.
  const int n_head = 2, hd = 8, bs = 4, n_blocks = 3, n_new = 2, ctx = 5;
  const int64_t row = 3 * n_head * hd;
  const std::vector<float> qkv_all = random_vector(ctx * row, 5);
  const std::vector<int32_t> offsets = {0, n_new}, lens = {ctx}, table = {2, 0, 1};
  std::vector<int32_t> slots_all(ctx);
  for (int pos = 0; pos < ctx; ++pos) slots_all[pos] = table[pos / bs] * bs + pos % bs;
  const size_t cache_elems = static_cast<size_t>(n_blocks) * n_head * bs * hd;
  DeviceBuffer kc_buf = backend->alloc_zeroed(cache_elems * precision_size(p));
  DeviceBuffer vc_buf = backend->alloc_zeroed(cache_elems * precision_size(p));
  AttentionArgs args;
  args.n_seqs = 1;
  args.n_head = n_head;
  args.head_dim = hd;
  args.block_size = bs;
  args.max_blocks_per_seq = 3;
  args.kv = p;
  // Earlier steps wrote positions 0..2; this step writes 3..4 and attends.
  const std::vector<int32_t> off0 = {0, ctx - n_new}, len0 = {ctx - n_new};
  args.n_tokens = ctx - n_new;
  args.token_offsets = off0.data();
  args.context_lens = len0.data();
  args.block_tables = table.data();
  args.slot_mapping = slots_all.data();
  backend->kv_cache_write(args, qkv_all.data(), kc_buf.data(), vc_buf.data());
  args.n_tokens = n_new;
  args.token_offsets = offsets.data();
  args.context_lens = lens.data();
  args.slot_mapping = slots_all.data() + (ctx - n_new);
  args.max_context_len = ctx;
  args.max_new_tokens = n_new;
  const float* qkv = qkv_all.data() + (ctx - n_new) * row;
  backend->kv_cache_write(args, qkv, kc_buf.data(), vc_buf.data());
  std::vector<float> out(n_new * n_head * hd);
  backend->paged_attention(args, qkv, kc_buf.data(), vc_buf.data(), out.data());

  double worst = 0;
  for (int i = 0; i < n_new; ++i)
    for (int h = 0; h < n_head; ++h) {
      const int pos = ctx - n_new + i;
      std::vector<double> s(pos + 1);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= pos; ++j) {
        double dot = 0;
        for (int c = 0; c < hd; ++c)
          dot += double(qkv_all[pos * row + h * hd + c]) *
                 kc::round_to(kernel_type(p), qkv_all[j * row + n_head * hd + h * hd + c]);
        s[j] = dot / std::sqrt(double(hd));
        mx = std::max(mx, s[j]);
      }
      for (int j = 0; j <= pos; ++j) sum += s[j] = std::exp(s[j] - mx);
      for (int c = 0; c < hd; ++c) {
        double o = 0;
        for (int j = 0; j <= pos; ++j)
          o += s[j] / sum *
               kc::round_to(kernel_type(p), qkv_all[j * row + 2 * n_head * hd + h * hd + c]);
        worst = std::max(worst, std::fabs(out[(i * n_head + h) * hd + c] - o));
      }
    }
  std::printf("[ %s ] max |attention - reference on rounded K, V| = %.3g\n", precision_name(p), worst);
  EXPECT_LT(worst, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(All, CpuBackendPrecision,
                         ::testing::Values(Precision::kF32, Precision::kBF16, Precision::kF16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(CpuBackendLimits, HeadDimUpTo512) {
  auto backend = make_cpu_backend(1);
  int64_t max_dim = 0;
  EXPECT_TRUE(backend->supports_head_dim(512, &max_dim));
  EXPECT_FALSE(backend->supports_head_dim(513, &max_dim));
  EXPECT_EQ(max_dim, 512);
}

TEST(Precision, NamesParse) {
  Precision p;
  EXPECT_TRUE(parse_precision("bf16", &p));
  EXPECT_EQ(p, Precision::kBF16);
  EXPECT_TRUE(parse_precision("f16", &p));
  EXPECT_EQ(p, Precision::kF16);
  EXPECT_TRUE(parse_precision("fp32", &p));
  EXPECT_EQ(p, Precision::kF32);
  EXPECT_TRUE(parse_precision("int8", &p));  // weights only (--weight-dtype int8)
  EXPECT_EQ(p, Precision::kInt8);
  EXPECT_STREQ(precision_name(Precision::kInt8), "int8");
  EXPECT_FALSE(parse_precision("int4", &p));
  EXPECT_FALSE(parse_precision("q8_0", &p));
  EXPECT_EQ(precision_size(Precision::kBF16), 2u);
  EXPECT_EQ(precision_size(Precision::kInt8), 1u);
  EXPECT_DOUBLE_EQ(weight_element_bytes(Precision::kInt8), 1.0625);  // 32 bytes + an fp16 scale
}

}  // namespace
}  // namespace ltm
