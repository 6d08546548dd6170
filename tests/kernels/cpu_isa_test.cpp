// The CPU kernel paths (kernels/cpu/cpu_isa.h): choosing one, and every kernel with
// ISA-specific code (GELU, LayerNorm, element-wise adds, paged attention) on each path the CPU
// supports, against plain double-precision loops; the 16-bit conversions (weight_type.h) against
// references computed from the formats' definitions, and each path's vector conversions
// bit-for-bit against the scalar ones; paged attention over bf16 / fp16 caches. packed_gemm:
// packed_gemm_test.cpp.
#include "kernels/cpu/cpu_isa.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_kernels.h"  // the paths' vector conversions, compared bit for bit
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/weight_type.h"
#include "tests/kernels/isa_param.h"

namespace ltm::kernels::cpu {
namespace {

std::vector<float> random_floats(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// The flags of /proc/cpuinfo's first "flags" line: independent of __builtin_cpu_supports.
std::vector<std::string> proc_cpu_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::vector<std::string> out;
      for (std::string w; words >> w;) out.push_back(w);
      return out;
    }
  return {};
}

TEST(IsaDispatch, NamesParseBack) {
  for (Isa i : {Isa::kAvx512, Isa::kAvx2, Isa::kPortable}) {
    ASSERT_TRUE(parse_isa(isa_name(i)).has_value());
    EXPECT_EQ(*parse_isa(isa_name(i)), i);
  }
  EXPECT_FALSE(parse_isa("AVX2").has_value());
  EXPECT_FALSE(parse_isa("sse").has_value());
  EXPECT_FALSE(parse_isa("").has_value());
}

TEST(IsaDispatch, SupportedIsasWidestFirstEndingWithPortable) {
  const std::vector<Isa> s = supported_isas();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.back(), Isa::kPortable);
  EXPECT_TRUE(std::is_sorted(s.begin(), s.end(), [](Isa a, Isa b) { return a > b; }));
  for (Isa i : s) EXPECT_TRUE(isa_supported(i));
}

TEST(IsaDispatch, SupportedMatchesProcCpuinfo) {
  const std::vector<std::string> flags = proc_cpu_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  auto has = [&](const char* f) { return std::find(flags.begin(), flags.end(), f) != flags.end(); };
  const bool avx2 = has("avx2") && has("fma") && has("f16c");
  const bool avx512 =
      avx2 && has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq");
  EXPECT_EQ(isa_supported(Isa::kAvx2), avx2);
  EXPECT_EQ(isa_supported(Isa::kAvx512), avx512);
  std::printf("cpu features: %s; default path: %s\n", cpu_feature_list().c_str(),
              isa_name(choose_isa(nullptr)));
}

TEST(IsaDispatch, ChooseIsaFromEnvironmentValue) {
  EXPECT_EQ(choose_isa(nullptr), supported_isas().front());
  EXPECT_EQ(choose_isa(""), supported_isas().front());
  for (Isa i : supported_isas()) EXPECT_EQ(choose_isa(isa_name(i)), i);
  try {
    choose_isa("avx1024");
    ADD_FAILURE() << "an unknown name was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown"), std::string::npos) << e.what();
  }
  for (Isa i : {Isa::kAvx512, Isa::kAvx2}) {
    if (isa_supported(i)) continue;
    EXPECT_FALSE(set_isa(i));
    try {
      choose_isa(isa_name(i));
      ADD_FAILURE() << isa_name(i) << " was accepted on a CPU without it";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot run"), std::string::npos) << e.what();
    }
  }
}

TEST(IsaDispatch, TuningChoiceFromEnvironment) {
  const char* name = "LTM_TEST_TUNING_CHOICE";
  unsetenv(name);
  TuningChoice t = tuning_choice(name, {512, 2048}, 512);
  EXPECT_EQ(t.value, 512);
  EXPECT_STREQ(t.source, "this CPU");
  setenv(name, "2048", 1);
  t = tuning_choice(name, {512, 2048}, 512);
  EXPECT_EQ(t.value, 2048);
  EXPECT_STREQ(t.source, name);
  for (const char* bad : {"1024", "2048x", " 2048", "-1", ""}) {  // not allowed: the default
    setenv(name, bad, 1);
    t = tuning_choice(name, {512, 2048}, 512);
    EXPECT_EQ(t.value, 512) << "'" << bad << "'";
    EXPECT_STREQ(t.source, "this CPU") << "'" << bad << "'";
  }
  setenv(name, "0", 1);
  EXPECT_EQ(tuning_choice(name, {0, 1}, 1).value, 0);
  unsetenv(name);
}

class CpuKernelsIsa : public IsaTest {};

double gelu_ref(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

TEST_P(CpuKernelsIsa, BiasGelu) {
  for (int64_t cols : {1, 7, 16, 100, 3072}) {
    const int64_t rows = 5;
    std::vector<float> x = random_floats(rows * cols, -9.0f, 9.0f, 1 + cols);
    const std::vector<float> bias = random_floats(cols, -1.0f, 1.0f, 2 + cols);
    for (bool with_bias : {false, true}) {
      std::vector<float> y = x;
      bias_gelu(y.data(), with_bias ? bias.data() : nullptr, rows, cols);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const double ref = gelu_ref(static_cast<double>(x[i]) + (with_bias ? bias[i % cols] : 0.0));
        ASSERT_NEAR(y[i], ref, 2e-6 * (1.0 + std::fabs(ref)))
            << "cols=" << cols << " i=" << i << " bias=" << with_bias;
      }
    }
  }
}

TEST_P(CpuKernelsIsa, LayerNorm) {
  for (int64_t cols : {1, 5, 64, 77, 768}) {
    const int64_t rows = 3;
    std::vector<float> x = random_floats(rows * cols, -3.0f, 5.0f, 3 + cols);
    const std::vector<float> g = random_floats(cols, 0.5f, 1.5f, 4 + cols);
    const std::vector<float> b = random_floats(cols, -1.0f, 1.0f, 5 + cols);
    std::vector<float> y(x.size(), std::nanf(""));
    layer_norm(x.data(), g.data(), b.data(), y.data(), rows, cols, 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0.0, var = 0.0;
      for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
      mean /= cols;
      for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
      const double rstd = 1.0 / std::sqrt(var / cols + 1e-5);
      for (int64_t c = 0; c < cols; ++c) {
        const double ref = (x[r * cols + c] - mean) * rstd * g[c] + b[c];
        ASSERT_NEAR(y[r * cols + c], ref, 1e-4) << "cols=" << cols << " r=" << r << " c=" << c;
      }
    }
    layer_norm(x.data(), g.data(), b.data(), x.data(), rows, cols, 1e-5f);  // in place
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]);
  }
}

TEST_P(CpuKernelsIsa, AddAndAddBias) {
  for (int64_t n : {1, 13, 4096, 40000}) {
    std::vector<float> x = random_floats(n, -1.0f, 1.0f, 6), y = random_floats(n, -1.0f, 1.0f, 7);
    std::vector<float> out = x;
    add(out.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] + y[i]) << i;
  }
  const int64_t rows = 9, cols = 2305;
  std::vector<float> x = random_floats(rows * cols, -1.0f, 1.0f, 8);
  const std::vector<float> bias = random_floats(cols, -1.0f, 1.0f, 9);
  std::vector<float> out = x;
  add_bias(out.data(), bias.data(), rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(out[i], x[i] + bias[i % cols]) << i;
}

// gemm_rows_nt (a LoRA adapter's down projection, C = A B^T for B [n, k]): against sums in
// double, and each row of C with the bits of the same row computed alone, at every row count and
// with 1 and 2 threads (what speculative decoding's verify rows rely on: model/verify_rows_test).
TEST_P(CpuKernelsIsa, GemmRowsNtAgainstDoubleAndRowAlone) {
  const int saved = omp_get_max_threads();
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {4, 7}, {8, 33}, {8, 768}, {64, 3072},
                      {16, 100}}) {
    constexpr int64_t kRows = 17;
    const std::vector<float> a = random_floats(kRows * k, -1.0f, 1.0f, 21);
    const std::vector<float> b = random_floats(n * k, -1.0f, 1.0f, 22);
    std::vector<float> alone(kRows * n);
    for (int64_t r = 0; r < kRows; ++r)
      gemm_rows_nt(a.data() + r * k, b.data(), alone.data() + r * n, 1, n, k);
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0.0, mag = 0.0;
        for (int64_t i = 0; i < k; ++i) {
          want += static_cast<double>(a[r * k + i]) * b[j * k + i];
          mag += std::fabs(static_cast<double>(a[r * k + i]) * b[j * k + i]);
        }
        ASSERT_NEAR(alone[r * n + j], want, 1e-6 * mag + 1e-30) << "n=" << n << " k=" << k;
      }
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      for (int64_t m : {2, 3, 7, 17}) {
        std::vector<float> c(m * n, std::nanf(""));
        gemm_rows_nt(a.data(), b.data(), c.data(), m, n, k);
        EXPECT_EQ(0, std::memcmp(c.data(), alone.data(), c.size() * sizeof(float)))
            << "m=" << m << " n=" << n << " k=" << k << " threads=" << threads;
      }
    }
  }
  omp_set_num_threads(saved);
}

// Paged attention over shuffled blocks: decode rows, short chunks (query tiles of 4 and a
// remainder) and a prefill chunk of 20 rows (the matrix form), against softmax in double. For a
// 16-bit kv_type the caches hold the rounded K and V (scalar conversion, weight_type.h) and the
// reference uses those rounded values: the kernel's only extra error is none (widening is exact).
// n_kv < n_head: grouped-query attention (query head h reads KV head h / (n_head / n_kv)).
// long_prefill: a chunk of 300 rows after 10 cached tokens, which the matrix form cuts into
// blocks of rows that each see only the keys up to their last row.
void check_attention(int head_dim, WeightType kv_type = WeightType::kF32, int block_size = 8,
                     int n_head = 3, int n_kv = 3, bool long_prefill = false) {
  const int max_blocks = (long_prefill ? 320 : 64) / block_size;
  const std::vector<int> n_new = long_prefill ? std::vector<int>{300, 1} : std::vector<int>{1, 3, 20, 6, 1};
  const std::vector<int32_t> ctx =
      long_prefill ? std::vector<int32_t>{310, 5} : std::vector<int32_t>{50, 20, 40, 6, 1};
  const int n_seqs = static_cast<int>(n_new.size());
  std::vector<int32_t> offsets(n_seqs + 1, 0);
  for (int s = 0; s < n_seqs; ++s) offsets[s + 1] = offsets[s] + n_new[s];
  const int n_blocks = n_seqs * max_blocks;
  std::vector<int32_t> blocks(n_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(11));
  const int64_t d = static_cast<int64_t>(n_head) * head_dim;
  const int64_t stride = static_cast<int64_t>(n_head + 2 * n_kv) * head_dim;  // a qkv row
  const size_t cache = static_cast<size_t>(n_blocks) * n_kv * block_size * head_dim;
  std::vector<float> kc = random_floats(cache, -1.0f, 1.0f, 12);
  std::vector<float> vc = random_floats(cache, -1.0f, 1.0f, 13);
  std::vector<uint16_t> k16(cache), v16(cache);
  if (kv_type != WeightType::kF32) {
    for (size_t i = 0; i < cache; ++i) {
      k16[i] = kv_type == WeightType::kBF16 ? f32_to_bf16(kc[i]) : f32_to_f16(kc[i]);
      v16[i] = kv_type == WeightType::kBF16 ? f32_to_bf16(vc[i]) : f32_to_f16(vc[i]);
      kc[i] = round_to(kv_type, kc[i]);  // the reference's values
      vc[i] = round_to(kv_type, vc[i]);
    }
  }
  const int n_tokens = offsets.back();
  // Large q: peaked softmaxes, so that a wrong exp or max shows.
  const std::vector<float> qkv =
      random_floats(static_cast<size_t>(n_tokens) * stride, -2.0f, 2.0f, 14);
  PagedAttentionShape shape{n_seqs,        n_head, head_dim, block_size, max_blocks,
                            offsets.data(), ctx.data(), blocks.data()};
  shape.kv_type = kv_type;
  shape.n_kv_head = n_kv;
  std::vector<float> out(static_cast<size_t>(n_tokens) * d, std::nanf(""));
  if (kv_type == WeightType::kF32)
    paged_attention(shape, qkv.data(), kc.data(), vc.data(), out.data());
  else
    paged_attention(shape, qkv.data(), static_cast<const void*>(k16.data()),
                    static_cast<const void*>(v16.data()), out.data());

  auto at = [&](const std::vector<float>& c, int s, int h, int p) {
    const int64_t block = blocks[s * max_blocks + p / block_size];
    const int64_t kv = h / (n_head / n_kv);
    return c.data() + ((block * n_kv + kv) * block_size + p % block_size) * head_dim;
  };
  for (int s = 0; s < n_seqs; ++s)
    for (int i = 0; i < n_new[s]; ++i) {
      const int row = offsets[s] + i, pos = ctx[s] - n_new[s] + i;
      for (int h = 0; h < n_head; ++h) {
        const float* q = qkv.data() + static_cast<int64_t>(row) * stride + h * head_dim;
        std::vector<double> w(pos + 1);
        for (int p = 0; p <= pos; ++p) {
          double dot = 0.0;
          for (int c = 0; c < head_dim; ++c) dot += static_cast<double>(q[c]) * at(kc, s, h, p)[c];
          w[p] = dot / std::sqrt(static_cast<double>(head_dim));
        }
        const double mx = *std::max_element(w.begin(), w.end());
        double sum = 0.0;
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int c = 0; c < head_dim; ++c) {
          double ref = 0.0;
          for (int p = 0; p <= pos; ++p) ref += w[p] / sum * at(vc, s, h, p)[c];
          ASSERT_NEAR(out[static_cast<int64_t>(row) * d + h * head_dim + c], ref, 2e-5)
              << "kv_type=" << weight_type_name(kv_type) << " head_dim=" << head_dim
              << " seq=" << s << " row=" << i << " head=" << h << " c=" << c;
        }
      }
    }
}

TEST_P(CpuKernelsIsa, PagedAttention) {
  // 40, 37: dot tails. Blocks of 16 and 32: the decode rows' scores 16 keys at a time (AVX-512),
  // with the keys of a block's partial group one by one.
  for (int block_size : {8, 16, 32})
    for (int head_dim : {64, 40, 37, 128, 96, 16}) check_attention(head_dim, WeightType::kF32, block_size);
}

// Grouped-query attention: 6 query heads over 2 KV heads, and 4 over 1 (multi-query), on every
// path (decode rows, tiles, the matrix form) and cache type.
TEST_P(CpuKernelsIsa, PagedAttentionGroupedQuery) {
  for (WeightType t : {WeightType::kF32, WeightType::kBF16})
    for (int head_dim : {64, 40}) {
      check_attention(head_dim, t, 16, 6, 2);
      check_attention(head_dim, t, 8, 4, 1);
    }
  check_attention(64, WeightType::kF32, 16, 6, 2, true);
  check_attention(40, WeightType::kF16, 16, 3, 3, true);
}

TEST_P(CpuKernelsIsa, PagedAttention16BitCaches) {
  for (WeightType t : {WeightType::kBF16, WeightType::kF16})
    for (int block_size : {8, 16})
      for (int head_dim : {64, 40, 37, 128, 80}) check_attention(head_dim, t, block_size);
}

// Random K and V caches of `elems` values in [-1, 1), and their 16-bit forms for kv_type t.
struct TestCaches {
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;
  TestCaches(size_t elems, WeightType t, unsigned seed)
      : k(random_floats(elems, -1.0f, 1.0f, seed)), v(random_floats(elems, -1.0f, 1.0f, seed + 1)),
        k16(elems), v16(elems) {
    for (size_t i = 0; i < elems; ++i) {
      k16[i] = t == WeightType::kBF16 ? f32_to_bf16(k[i]) : f32_to_f16(k[i]);
      v16[i] = t == WeightType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    }
  }
  // paged_attention over these caches, as shape.kv_type says.
  void attend(const PagedAttentionShape& shape, const float* qkv, float* out) const {
    if (shape.kv_type == WeightType::kF32)
      paged_attention(shape, qkv, k.data(), v.data(), out);
    else
      paged_attention(shape, qkv, static_cast<const void*>(k16.data()),
                      static_cast<const void*>(v16.data()), out);
  }
};

// A decode row (one new row) gives bit for bit what the same row gives inside a chunk of 2..7 rows
// (a speculative verify step: query tiles of 4, AVX-512 runs each row as a decode): a sequence's
// tokens must not depend on how the scheduler cut its rows into steps, nor speculative greedy
// output on how many drafts were checked.
TEST_P(CpuKernelsIsa, DecodeRowEqualsTheSameRowInAChunk) {
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16})
    for (int head_dim : {64, 128, 80})
      for (int ctx : {50, 64, 7}) {
        const int n_head = 2, block_size = 16, max_blocks = 4;
        std::vector<int32_t> blocks = {3, 0, 2, 1};
        const int64_t d = static_cast<int64_t>(n_head) * head_dim;
        const size_t cache = static_cast<size_t>(max_blocks) * n_head * block_size * head_dim;
        const TestCaches caches(cache, t, 21);
        const std::vector<float> qkv = random_floats(static_cast<size_t>(7) * 3 * d, -2.0f, 2.0f, 23);
        auto run = [&](int n_new, const float* q, int ctx_len) {  // every row's output
          const std::vector<int32_t> offsets = {0, n_new}, lens = {ctx_len};
          PagedAttentionShape shape{1, n_head, head_dim, block_size, max_blocks,
                                    offsets.data(), lens.data(), blocks.data()};
          shape.kv_type = t;
          std::vector<float> out(static_cast<size_t>(n_new) * d, std::nanf(""));
          caches.attend(shape, q, out.data());
          return out;
        };
        for (int n_new : {2, 5, 7}) {
          if (n_new > ctx) continue;
          const std::vector<float> chunk = run(n_new, qkv.data(), ctx);
          for (int r = 0; r < n_new; ++r) {  // row r sees the keys up to its own position
            const std::vector<float> decode = run(1, qkv.data() + 3 * d * r, ctx - n_new + r + 1);
            for (int64_t i = 0; i < d; ++i)
              ASSERT_EQ(decode[i], chunk[r * d + i])
                  << weight_type_name(t) << " head_dim=" << head_dim << " ctx=" << ctx
                  << " rows=" << n_new << " row=" << r << " i=" << i;
          }
        }
      }
}

// A batch of decode rows, one per sequence, with more sequences than twice the threads (each
// sequence's heads on one thread; an fp32 cache's rows each read a cache block's runs of all the
// heads before the next block, attend_heads_t) gives bit for bit what each row gives alone (its
// heads dealt out one by one, attend_decode_t): a sequence's tokens must not depend on the batch.
TEST_P(CpuKernelsIsa, DecodeBatchRowEqualsTheRowAlone) {
  const int n_seqs = 2 * omp_get_max_threads() + 3;
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16})
    for (int head_dim : {64, 128, 40})
      for (int n_kv : {4, 2}) {
        const int n_head = 4, block_size = 16, max_blocks = 5;
        const int64_t d = static_cast<int64_t>(n_head) * head_dim;
        const int64_t stride = static_cast<int64_t>(n_head + 2 * n_kv) * head_dim;
        const int n_blocks = n_seqs * max_blocks;
        std::vector<int32_t> blocks(n_blocks);
        std::iota(blocks.begin(), blocks.end(), 0);
        std::shuffle(blocks.begin(), blocks.end(), std::mt19937(31));
        const size_t cache = static_cast<size_t>(n_blocks) * n_kv * block_size * head_dim;
        const TestCaches caches(cache, t, 32);
        const std::vector<float> qkv =
            random_floats(static_cast<size_t>(n_seqs) * stride, -2.0f, 2.0f, 34);
        std::vector<int32_t> lens(n_seqs);
        for (int s = 0; s < n_seqs; ++s) lens[s] = 1 + (s * 23) % (max_blocks * block_size);
        // seqs sequences from `first`, one new row each: their outputs
        auto run = [&](int first, int seqs) {
          std::vector<int32_t> offsets(seqs + 1);
          std::iota(offsets.begin(), offsets.end(), 0);
          PagedAttentionShape shape{seqs, n_head, head_dim, block_size, max_blocks,
                                    offsets.data(), lens.data() + first,
                                    blocks.data() + first * max_blocks};
          shape.kv_type = t;
          shape.n_kv_head = n_kv;
          std::vector<float> out(static_cast<size_t>(seqs) * d, std::nanf(""));
          caches.attend(shape, qkv.data() + first * stride, out.data());
          return out;
        };
        const std::vector<float> batch = run(0, n_seqs);
        for (int s = 0; s < n_seqs; ++s) {
          const std::vector<float> alone = run(s, 1);
          for (int64_t i = 0; i < d; ++i)
            ASSERT_EQ(alone[i], batch[s * d + i])
                << weight_type_name(t) << " head_dim=" << head_dim << " n_kv=" << n_kv
                << " seq=" << s << " ctx=" << lens[s] << " i=" << i;
        }
      }
}

TEST(PagedAttentionKvType, Fp32PointersRefuse16BitType) {
  const int32_t offsets[2] = {0, 1}, ctx[1] = {1}, table[1] = {0};
  PagedAttentionShape shape{1, 1, 8, 4, 1, offsets, ctx, table};
  shape.kv_type = WeightType::kBF16;
  std::vector<float> qkv(24, 0.5f), cache(32, 0.0f), out(8);
  EXPECT_THROW(paged_attention(shape, qkv.data(), cache.data(), cache.data(), out.data()),
               std::invalid_argument);
}

TEST_P(CpuKernelsIsa, KvCacheWrite16Bit) {
  // Each token's K and V land in their slot as the scalar conversion of the fp32 values (the
  // path's vector conversion, tails included: head_dim 37); other slots stay untouched.
  const int n_head = 2, head_dim = 37, block_size = 4, n_blocks = 3;
  const int64_t d = static_cast<int64_t>(n_head) * head_dim;
  const std::vector<int32_t> slots = {5, 0, 11, 6};
  const int64_t n_tokens = static_cast<int64_t>(slots.size());
  const std::vector<float> qkv = random_floats(n_tokens * 3 * d, -70000.0f, 70000.0f, 21);
  for (WeightType t : {WeightType::kF32, WeightType::kBF16, WeightType::kF16}) {
    const size_t es = weight_type_size(t);
    const size_t cache_bytes = static_cast<size_t>(n_blocks) * n_head * block_size * head_dim * es;
    std::vector<unsigned char> kb(cache_bytes, 0xAB), vb(cache_bytes, 0xAB);
    kv_cache_write(qkv.data(), slots.data(), n_tokens, n_head, head_dim, block_size, t, kb.data(),
                   vb.data());
    std::vector<bool> written(cache_bytes / es, false);
    for (int64_t tok = 0; tok < n_tokens; ++tok)
      for (int h = 0; h < n_head; ++h)
        for (int c = 0; c < head_dim; ++c) {
          const int64_t slot = slots[tok];
          const int64_t idx =
              ((slot / block_size * n_head + h) * block_size + slot % block_size) * head_dim + c;
          written[idx] = true;
          for (int which = 0; which < 2; ++which) {  // K, V
            const float x = qkv[tok * 3 * d + (1 + which) * d + h * head_dim + c];
            const unsigned char* got = (which == 0 ? kb : vb).data() + idx * es;
            if (t == WeightType::kF32) {
              float g;
              std::memcpy(&g, got, 4);
              ASSERT_EQ(g, x);
            } else {
              uint16_t g;
              std::memcpy(&g, got, 2);
              ASSERT_EQ(g, t == WeightType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x))
                  << weight_type_name(t) << " token " << tok << " c " << c << " x " << x;
            }
          }
        }
    for (size_t i = 0; i < written.size(); ++i) {
      if (written[i]) continue;
      for (size_t b = 0; b < es; ++b) ASSERT_EQ(kb[i * es + b], 0xAB) << "slot element " << i;
    }
  }
}

// ---- 16-bit conversions ----

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// f16 value of a finite encoding, from the format's definition.
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Nearest f16 by search over the ordered positive encodings 0x0000 .. 0x7bff, ties to the even
// encoding; 0x7c00 stands for 65536 (the next value the exponent range would have), so that
// anything rounding to it is an overflow to inf.
uint16_t f16_reference(float x) {
  const double a = std::fabs(static_cast<double>(x));
  auto val = [](uint32_t h) { return h == 0x7c00 ? 65536.0 : f16_value(static_cast<uint16_t>(h)); };
  uint32_t lo = 0, hi = 0x7c00;  // val(lo) <= a < val(hi), or a >= 65536
  if (a >= 65536.0) {
    lo = 0x7c00;
  } else {
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      (val(mid) <= a ? lo : hi) = mid;
    }
    const double dl = a - val(lo), dh = val(hi) - a;
    if (dh < dl || (dh == dl && (hi & 1) == 0)) lo = hi;
  }
  return static_cast<uint16_t>(lo | (std::signbit(x) ? 0x8000 : 0));
}

// Nearest bf16: the two encodings around x (truncated and the next one up in magnitude), ties
// to the even one.
uint16_t bf16_reference(float x) {
  const uint32_t b = bits(x);
  const uint32_t lo = b & 0xffff0000u, hi = lo + 0x10000u;
  const double a = std::fabs(static_cast<double>(x));
  const double vl = std::fabs(static_cast<double>(from_bits(lo)));
  const double vh = hi == 0x7f800000u || hi == 0xff800000u
                        ? std::ldexp(1.0, 128)  // past the largest finite: inf
                        : std::fabs(static_cast<double>(from_bits(hi)));
  const double dl = a - vl, dh = vh - a;
  const bool up = dh < dl || (dh == dl && ((hi >> 16) & 1) == 0);
  return static_cast<uint16_t>((up ? hi : lo) >> 16);
}

TEST(WeightType, SizesAndNames) {
  EXPECT_EQ(weight_type_size(WeightType::kF32), 4u);
  EXPECT_EQ(weight_type_size(WeightType::kBF16), 2u);
  EXPECT_EQ(weight_type_size(WeightType::kF16), 2u);
  EXPECT_STREQ(weight_type_name(WeightType::kF32), "f32");
  EXPECT_STREQ(weight_type_name(WeightType::kBF16), "bf16");
  EXPECT_STREQ(weight_type_name(WeightType::kF16), "f16");
}

TEST(WeightType, Bf16Cases) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just past the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // largest float rounds to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001u)), 0x0000);  // f32 subnormal
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie to even
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const uint16_t h = f32_to_bf16(from_bits(nan));
    EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << nan;  // payload in low bits: still NaN
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000);
  }
  for (uint32_t h = 0; h < 65536; ++h)  // widening is the 16-bit shift
    ASSERT_EQ(bits(bf16_to_f32(static_cast<uint16_t>(h))), h << 16);
}

TEST(WeightType, Bf16RoundsToNearestEven) {
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t b = rng();
    if (i % 4 == 0) b = (b & 0xffff0000u) | 0x8000u;  // many exact ties
    const float x = from_bits(b);
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(f32_to_bf16(x), bf16_reference(x)) << std::hex << b;
  }
}

TEST(WeightType, F16Cases) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);             // largest finite
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);           // below the midpoint
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);             // midpoint, ties away to inf
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00);                // overflow
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);   // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);   // tie with zero: even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);   // tie between 1 and 2: even
  EXPECT_EQ(f32_to_f16(std::ldexp(5.0f, -25)), 0x0002);   // tie between 2 and 3: even
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400); // top subnormal rounds to normal
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, even below
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, even above
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t h = f32_to_f16(from_bits(nan));
    EXPECT_EQ(h & 0x7e00, 0x7e00) << std::hex << nan;  // quiet NaN
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000);
  }
  // Widening, every encoding: the value the format defines; inf; NaN stays NaN (made quiet).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if ((h & 0x7c00) == 0x7c00) {
      if ((h & 0x3ff) == 0) {
        ASSERT_TRUE(std::isinf(f)) << h;
      } else {
        ASSERT_TRUE(std::isnan(f)) << h;
        ASSERT_EQ(bits(f) & 0x7fc00000u, 0x7fc00000u) << h;
      }
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0);
    } else {
      ASSERT_EQ(static_cast<double>(f), f16_value(static_cast<uint16_t>(h))) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
      ASSERT_EQ(f32_to_f16(f), h) << "round trip " << h;
    }
  }
}

TEST(WeightType, F16RoundsToNearestEven) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> e(-30.0f, 17.0f);
  for (int i = 0; i < 1000000; ++i) {
    float x = std::exp2(e(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    if (i % 3 == 0) {  // an exact tie between two f16 neighbours
      const uint16_t h = static_cast<uint16_t>(rng() % 0x7bff);
      x = static_cast<float>((f16_value(h) + f16_value(static_cast<uint16_t>(h + 1))) / 2);
    }
    ASSERT_EQ(f32_to_f16(x), f16_reference(x)) << x << " bits " << std::hex << bits(x);
  }
}

// Values that exercise every branch of the conversions: NaNs, infs, zeros, f32 subnormals,
// f16 overflow and subnormal range, ties, random bit patterns.
std::vector<float> conversion_inputs() {
  std::vector<float> v;
  for (uint32_t b : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f800000u, 0xff800000u,
                     0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x477fe000u, 0x477ff000u,
                     0x477fefffu, 0x7f7fffffu, 0x33000000u, 0x33000001u, 0x38800000u, 0x387fffffu,
                     0x3f808000u, 0x3f818000u})
    v.push_back(from_bits(b));
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) v.push_back(from_bits(rng()));
  std::uniform_real_distribution<float> e(-27.0f, 17.0f);
  for (int i = 0; i < 20000; ++i) v.push_back(std::exp2(e(rng)) * (i & 1 ? -1.0f : 1.0f));
  return v;
}

TEST_P(CpuKernelsIsa, VectorConversionsMatchScalar) {
  const KernelTable& kt = kernel_table();
  const std::vector<float> x = conversion_inputs();
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{33},
                    static_cast<int64_t>(x.size())}) {
    std::vector<uint16_t> h(n + 1, 0x5555);
    kt.f32_to_bf16_n(x.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(h[i], f32_to_bf16(x[i])) << "bf16 n=" << n << " bits " << std::hex << bits(x[i]);
    ASSERT_EQ(h[n], 0x5555) << "wrote past n";
    kt.f32_to_f16_n(x.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(h[i], f32_to_f16(x[i])) << "f16 n=" << n << " bits " << std::hex << bits(x[i]);
    ASSERT_EQ(h[n], 0x5555) << "wrote past n";
  }
  for (int64_t n : {1, 9, 17, 31, 65536}) {
    std::vector<float> f(n + 1, 1234.5f);
    for (int64_t off : {int64_t{0}, 65536 - n}) {
      kt.bf16_to_f32_n(all.data() + off, f.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits(f[i]), bits(bf16_to_f32(all[off + i]))) << "bf16 " << off + i;
      kt.f16_to_f32_n(all.data() + off, f.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits(f[i]), bits(f16_to_f32(all[off + i]))) << "f16 " << std::hex << off + i;
      ASSERT_EQ(f[n], 1234.5f) << "wrote past n";
    }
  }
}

LTM_INSTANTIATE_ISA_TESTS(CpuKernelsIsa);

}  // namespace
}  // namespace ltm::kernels::cpu
