// The CPU kernel paths (kernels/cpu/cpu_isa.h): choosing one, and every kernel with
// ISA-specific code (GELU, LayerNorm, element-wise adds, paged attention) on each path the CPU
// supports, against plain double-precision loops. packed_gemm: packed_gemm_test.cpp.
#include "kernels/cpu/cpu_isa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
#include "kernels/cpu/layer_norm.h"
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

// Paged attention over shuffled blocks: decode rows, short chunks (query tiles of 4 and a
// remainder) and a prefill chunk of 20 rows (the matrix form), against softmax in double.
void check_attention(int head_dim) {
  const int n_head = 3, block_size = 8, max_blocks = 8;
  const std::vector<int> n_new = {1, 3, 20, 6, 1};
  const std::vector<int32_t> ctx = {50, 20, 40, 6, 1};
  const int n_seqs = static_cast<int>(n_new.size());
  std::vector<int32_t> offsets(n_seqs + 1, 0);
  for (int s = 0; s < n_seqs; ++s) offsets[s + 1] = offsets[s] + n_new[s];
  const int n_blocks = n_seqs * max_blocks;
  std::vector<int32_t> blocks(n_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(11));
  const int64_t d = static_cast<int64_t>(n_head) * head_dim;
  const size_t cache = static_cast<size_t>(n_blocks) * n_head * block_size * head_dim;
  const std::vector<float> kc = random_floats(cache, -1.0f, 1.0f, 12);
  const std::vector<float> vc = random_floats(cache, -1.0f, 1.0f, 13);
  const int n_tokens = offsets.back();
  // Large q: peaked softmaxes, so that a wrong exp or max shows.
  const std::vector<float> qkv =
      random_floats(static_cast<size_t>(n_tokens) * 3 * d, -2.0f, 2.0f, 14);
  const PagedAttentionShape shape{n_seqs,        n_head, head_dim, block_size, max_blocks,
                                  offsets.data(), ctx.data(), blocks.data()};
  std::vector<float> out(static_cast<size_t>(n_tokens) * d, std::nanf(""));
  paged_attention(shape, qkv.data(), kc.data(), vc.data(), out.data());

  auto at = [&](const std::vector<float>& c, int s, int h, int p) {
    const int64_t block = blocks[s * max_blocks + p / block_size];
    return c.data() + ((block * n_head + h) * block_size + p % block_size) * head_dim;
  };
  for (int s = 0; s < n_seqs; ++s)
    for (int i = 0; i < n_new[s]; ++i) {
      const int row = offsets[s] + i, pos = ctx[s] - n_new[s] + i;
      for (int h = 0; h < n_head; ++h) {
        const float* q = qkv.data() + static_cast<int64_t>(row) * 3 * d + h * head_dim;
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
              << "head_dim=" << head_dim << " seq=" << s << " row=" << i << " head=" << h
              << " c=" << c;
        }
      }
    }
}

TEST_P(CpuKernelsIsa, PagedAttention) {
  for (int head_dim : {64, 40, 37, 128}) check_attention(head_dim);  // 40, 37: dot tails
}

LTM_INSTANTIATE_ISA_TESTS(CpuKernelsIsa);

}  // namespace
}  // namespace ltm::kernels::cpu
