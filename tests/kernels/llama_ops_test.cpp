// The Llama family's CPU kernels (kernels/cpu/llama_ops.h) on every ISA path this CPU has,
// against plain references in double written from HF's equations: RMSNorm (x * rsqrt(mean(x^2)
// + eps) * w), the fused residual + RMSNorm, rotate-half RoPE, silu(gate) * up; and
// kv_cache_write with grouped-query attention's narrower K and V.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/llama_ops.h"
#include "tests/kernels/isa_param.h"

namespace ltm::kernels::cpu {
namespace {

std::vector<float> random_floats(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class LlamaOpsIsa : public IsaTest {};

std::vector<double> rms_ref(const float* x, const float* w, int64_t cols, double eps) {
  double sq = 0;
  for (int64_t c = 0; c < cols; ++c) sq += static_cast<double>(x[c]) * x[c];
  const double r = 1.0 / std::sqrt(sq / cols + eps);
  std::vector<double> y(cols);
  for (int64_t c = 0; c < cols; ++c) y[c] = x[c] * r * w[c];
  return y;
}

TEST_P(LlamaOpsIsa, RmsNorm) {
  for (int64_t cols : {896, 37, 4096}) {
    const int64_t rows = 11;
    const auto x = random_floats(rows * cols, -3.0f, 3.0f, 1);
    const auto w = random_floats(cols, 0.5f, 1.5f, 2);
    std::vector<float> y(rows * cols);
    rms_norm(x.data(), w.data(), y.data(), rows, cols, 1e-6f);
    for (int64_t r = 0; r < rows; ++r) {
      const auto ref = rms_ref(x.data() + r * cols, w.data(), cols, 1e-6);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_NEAR(y[r * cols + c], ref[c], 2e-5 * (1 + std::fabs(ref[c]))) << cols << " " << r;
    }
    // In place (x and y alias).
    std::vector<float> z = x;
    rms_norm(z.data(), w.data(), z.data(), rows, cols, 1e-6f);
    EXPECT_EQ(z, y);
  }
}

TEST_P(LlamaOpsIsa, AddResidualRmsNorm) {
  const int64_t rows = 9, cols = 300;
  const auto x0 = random_floats(rows * cols, -2.0f, 2.0f, 3);
  const auto res = random_floats(rows * cols, -2.0f, 2.0f, 4);
  const auto bias = random_floats(cols, -1.0f, 1.0f, 5);
  const auto w = random_floats(cols, 0.5f, 1.5f, 6);
  for (int variant = 0; variant < 4; ++variant) {
    const bool with_res = variant & 1, with_bias = variant & 2;
    std::vector<float> x = x0, y(rows * cols);
    add_residual_rms_norm(x.data(), with_res ? res.data() : nullptr,
                          with_bias ? bias.data() : nullptr, w.data(), y.data(), rows, cols, 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> want(cols);
      for (int64_t c = 0; c < cols; ++c)
        want[c] = x0[r * cols + c] + (with_res ? res[r * cols + c] : 0.0f) +
                  (with_bias ? bias[c] : 0.0f);
      for (int64_t c = 0; c < cols; ++c) ASSERT_NEAR(x[r * cols + c], want[c], 1e-5);
      const auto ref = rms_ref(want.data(), w.data(), cols, 1e-5);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_NEAR(y[r * cols + c], ref[c], 2e-5 * (1 + std::fabs(ref[c]))) << variant;
    }
  }
}

TEST_P(LlamaOpsIsa, RopeRotateHalf) {
  // Rows of 3 Q heads, 1 K head and 1 V head (the V head must stay untouched), head_dim 64 and
  // 10; positions up to 5000 with theta 500000's frequencies.
  for (int64_t hd : {64, 10}) {
    const int64_t n_tokens = 7, n_rot = 4, stride = 5 * hd, half = hd / 2;
    const auto x0 = random_floats(n_tokens * stride, -1.0f, 1.0f, 7);
    const std::vector<int32_t> pos = {0, 1, 2, 17, 300, 4095, 5000};
    std::vector<float> inv(half);
    for (int64_t i = 0; i < half; ++i)
      inv[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / hd));
    std::vector<float> x = x0;
    rope(x.data(), pos.data(), inv.data(), n_tokens, n_rot, stride, hd);
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t h = 0; h < 5; ++h)
        for (int64_t i = 0; i < hd; ++i) {
          const int64_t at = t * stride + h * hd + i;
          if (h == n_rot) {
            ASSERT_EQ(x[at], x0[at]);
            continue;
          }
          const int64_t f = i % half;
          const double angle = static_cast<double>(static_cast<float>(pos[t]) * inv[f]);
          const double c = std::cos(angle), s = std::sin(angle);
          const double a = x0[t * stride + h * hd + f], b = x0[t * stride + h * hd + f + half];
          // x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
          const double want = i < half ? a * c - b * s : b * c + a * s;
          ASSERT_NEAR(x[at], want, 1e-6) << "hd " << hd << " t " << t << " h " << h << " i " << i;
        }
  }
}

TEST_P(LlamaOpsIsa, SiluMul) {
  const int64_t rows = 5, cols = 4864 / 4 + 3;
  const auto gu = random_floats(rows * 2 * cols, -12.0f, 12.0f, 8);
  std::vector<float> out(rows * cols);
  silu_mul(gu.data(), out.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double g = gu[r * 2 * cols + c], u = gu[r * 2 * cols + cols + c];
      const double want = g / (1.0 + std::exp(-g)) * u;
      ASSERT_NEAR(out[r * cols + c], want, 1e-5 * (1 + std::fabs(want))) << r << " " << c;
    }
}

// kv_cache_write with 4 query heads over 2 KV heads: row = Q (4 heads) | K (2) | V (2); the cache
// gets the K and V heads, nothing of Q.
TEST(LlamaOps, KvCacheWriteGroupedQuery) {
  const int n_head = 4, n_kv = 2, hd = 8, block = 4, n_blocks = 3;
  const int64_t stride = (n_head + 2 * n_kv) * hd;
  const std::vector<int32_t> slots = {5, 0, 11, -1};
  const auto qkv = random_floats(slots.size() * stride, -1.0f, 1.0f, 9);
  const size_t cache = static_cast<size_t>(n_blocks) * n_kv * block * hd;
  std::vector<float> kc(cache, -7.0f), vc(cache, -7.0f);
  kv_cache_write(qkv.data(), slots.data(), slots.size(), n_head, hd, block, kc.data(), vc.data(),
                 n_kv);
  std::vector<uint16_t> kb(cache), vb(cache);
  kv_cache_write(qkv.data(), slots.data(), slots.size(), n_head, hd, block, WeightType::kBF16,
                 kb.data(), vb.data(), n_kv);
  size_t written = 0;
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    for (int h = 0; h < n_kv; ++h)
      for (int c = 0; c < hd; ++c) {
        const int64_t idx = ((slots[t] / block * n_kv + h) * block + slots[t] % block) * hd + c;
        const float k = qkv[t * stride + n_head * hd + h * hd + c];
        const float v = qkv[t * stride + (n_head + n_kv) * hd + h * hd + c];
        ASSERT_EQ(kc[idx], k);
        ASSERT_EQ(vc[idx], v);
        ASSERT_EQ(kb[idx], f32_to_bf16(k));
        ASSERT_EQ(vb[idx], f32_to_bf16(v));
        ++written;
      }
  }
  size_t untouched = 0;
  for (size_t i = 0; i < cache; ++i) untouched += kc[i] == -7.0f && vc[i] == -7.0f;
  EXPECT_EQ(untouched + written, cache);
}

LTM_INSTANTIATE_ISA_TESTS(LlamaOpsIsa);

}  // namespace
}  // namespace ltm::kernels::cpu
