// The int8 x fp16 tensor-core GEMM's warp arithmetic (kernels/cuda/int8_mma.h, what int8_gemm.cu's
// int8_mma_kernel runs), compiled for the CPU: each warp's 32 lanes run one after the other
// (host_mma.h's HostWarp: mma.m16n8k16 emulated from PTX's fragment layouts), for every warp
// and split of k of a launch, and the splits' partial sums are added in split order as
// int8_mma_reduce_kernel does. Checked without a GPU:
//  - the quants become exact fp16 integers (the byte permute under 1024's exponent, minus 1152)
//    for every byte value, in both halves of a register;
//  - every quant of every column is multiplied once, with its own group's scale, by the
//    activation at its own k: one-hot rows of A give q * s exactly, for all k;
//  - random A (fp16) against a float64 product with the dequantized weight: ragged n (not a
//    multiple of 16), k (not a multiple of 32 or 4: the element loads), m from 17 to 64 (a
//    partial n-tile), 1 to 7 splits of k, both activation load paths giving the same bits;
//  - nothing outside [m, n) is written, and every output inside it is;
//  - mma_split: whole groups, no empty split, the bounds it promises.
// What needs a GPU (that mma.sync has PTX's layout, the launch, the epilogue, the backend's choice
// of kernel) is cuda_int8_gpu_test's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/cuda/int8_mma.h"
#include "runtime/model/dtype.h"
#include "tests/kernels/host_mma.h"

namespace ltm {
namespace {

namespace li = kernels::cuda::int8;

// An int8 weight in the GPU layout (int8_gemm.h): random quants and scales; the padding past k
// holds nonzero quants too, so a kernel that read activations past k would show it.
struct Weight {
  int64_t n = 0, k = 0, kp = 0, groups = 0;
  std::vector<int8_t> q;          // [n][kp]
  std::vector<uint16_t> scales;   // [n][groups], fp16
  float deq(int64_t c, int64_t p) const {
    return static_cast<float>(q[c * kp + p]) * f16_to_f32(scales[c * groups + p / 32]);
  }
};

Weight make_weight(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> quant(-127, 127);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  Weight w;
  w.n = n;
  w.k = k;
  w.kp = li::padded_k(k);
  w.groups = li::groups(k);
  w.q.resize(static_cast<size_t>(n * w.kp));
  for (auto& v : w.q) v = static_cast<int8_t>(quant(rng));
  w.scales.resize(static_cast<size_t>(n * w.groups));
  for (auto& s : w.scales) s = f32_to_f16(scale(rng));
  return w;
}

// C [m, n] as the kernel computes it for `splits` (0: the choice for 528 blocks, an H200's 132
// SMs), every output the kernel does not write left NaN. writes[i]: how many splits wrote output
// i (each should, once).
std::vector<float> run(const Weight& w, const std::vector<uint16_t>& a, int64_t m, bool a_vec,
                       int64_t force_splits, std::vector<int>* writes = nullptr) {
  li::MmaArgs p;
  p.q = w.q.data();
  p.scales = w.scales.data();
  p.n = w.n;
  p.k = w.k;
  p.a = a.data();
  p.m = m;
  p.a_vec = a_vec;
  const li::MmaSplit sp = li::mma_split(w.n, w.k, 528, force_splits);
  std::vector<float> part(static_cast<size_t>(sp.splits * m * w.n), std::nanf(""));
  if (writes != nullptr) writes->assign(static_cast<size_t>(m * w.n), 0);
  const int64_t warps = (w.n + li::kMmaCols - 1) / li::kMmaCols;
  auto warp_run = [&](auto nt_tag, int64_t c0, int64_t split) {
    constexpr int NT = decltype(nt_tag)::value;
    host_mma::HostWarp<li::MmaLane<NT>> warp;
    const int64_t j_begin = split * sp.groups_per_split;
    const int64_t j_end = std::min(w.groups, j_begin + sp.groups_per_split);
    li::mma_columns<NT>(warp, p, c0, j_begin, j_end);
    li::mma_finish<NT>(warp, p, c0, [&](int64_t row, int64_t col, float v) {
      ASSERT_TRUE(row >= 0 && row < m && col >= 0 && col < w.n) << row << " " << col;
      part[(split * m + row) * w.n + col] = v;
      if (writes != nullptr) ++(*writes)[row * w.n + col];
    });
  };
  for (int64_t split = 0; split < sp.splits; ++split) {
    for (int64_t warp = 0; warp < warps; ++warp) {
      if (m <= 32) {
        warp_run(std::integral_constant<int, 4>{}, warp * li::kMmaCols, split);
      } else {
        warp_run(std::integral_constant<int, 8>{}, warp * li::kMmaCols, split);
      }
    }
  }
  std::vector<float> c(static_cast<size_t>(m * w.n));
  for (size_t i = 0; i < c.size(); ++i) {
    float v = 0.0f;
    for (int64_t s = 0; s < sp.splits; ++s) v += part[s * m * w.n + static_cast<int64_t>(i)];
    c[i] = v;
  }
  return c;
}

TEST(CudaInt8MmaLane, QuantsBecomeExactFp16) {
  for (int v = -128; v < 128; ++v)
    for (int lane_byte = 0; lane_byte < 4; ++lane_byte) {
      // v at one byte, its negation (or 0) at the others.
      uint8_t bytes[4];
      for (int b = 0; b < 4; ++b)
        bytes[b] = static_cast<uint8_t>(
            static_cast<int8_t>(b == lane_byte ? v : (v == -128 ? 0 : -v)));
      uint32_t word;
      std::memcpy(&word, bytes, 4);
      for (int h = 0; h < 2; ++h) {
        const uint32_t pair = li::quant_pair_f16(word, h);
        EXPECT_EQ(f16_to_f32(static_cast<uint16_t>(pair & 0xffffu)),
                  static_cast<float>(static_cast<int8_t>(bytes[2 * h])));
        EXPECT_EQ(f16_to_f32(static_cast<uint16_t>(pair >> 16)),
                  static_cast<float>(static_cast<int8_t>(bytes[2 * h + 1])));
      }
    }
}

TEST(CudaInt8MmaLane, EveryQuantOnceWithItsScale) {
  // Row r of A is one-hot at k = base + r: C[r][c] = q[c][base + r] * s exactly (one product).
  for (int64_t k : {32, 100, 37, 200}) {
    const Weight w = make_weight(37, k, 11 + static_cast<uint32_t>(k));
    for (int64_t base = 0; base < k; base += li::kMmaMaxRows) {
      const int64_t m = std::min<int64_t>(li::kMmaMaxRows, k - base);
      std::vector<uint16_t> a(static_cast<size_t>(m * k), 0);
      for (int64_t r = 0; r < m; ++r) a[r * k + base + r] = f32_to_f16(1.0f);
      for (int64_t splits : {1, 2, 3}) {
        const std::vector<float> c = run(w, a, m, k % 4 == 0, splits);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t col = 0; col < w.n; ++col)
            ASSERT_EQ(c[r * w.n + col], w.deq(col, base + r))
                << "k " << k << " row " << r << " col " << col << " splits " << splits;
      }
    }
  }
}

struct Case {
  int64_t n, k, m;
};

TEST(CudaInt8MmaLane, RandomAgainstFloat64) {
  const Case cases[] = {{16, 32, 17}, {70, 100, 33}, {5, 33, 64}, {96, 768, 64},
                        {37, 129, 20}, {48, 256, 40}, {200, 64, 24}};
  uint32_t seed = 500;
  for (const Case& cs : cases) {
    const Weight w = make_weight(cs.n, cs.k, ++seed);
    std::mt19937 rng(++seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> a(static_cast<size_t>(cs.m * cs.k));
    for (auto& v : a) v = f32_to_f16(normal(rng));
    std::vector<double> want(static_cast<size_t>(cs.m * cs.n));
    double largest = 0;
    for (int64_t r = 0; r < cs.m; ++r)
      for (int64_t c = 0; c < cs.n; ++c) {
        double sum = 0;
        for (int64_t p = 0; p < cs.k; ++p)
          sum += static_cast<double>(f16_to_f32(a[r * cs.k + p])) * w.deq(c, p);
        want[r * cs.n + c] = sum;
        largest = std::max(largest, std::fabs(sum));
      }
    for (int64_t splits : {0, 1, 2, 7}) {
      std::vector<int> writes;
      const int64_t n_splits = li::mma_split(cs.n, cs.k, 528, splits).splits;
      const bool vec = cs.k % 4 == 0;
      const std::vector<float> got = run(w, a, cs.m, vec, splits, &writes);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(writes[i], n_splits) << "output " << i << " written " << writes[i] << " times";
        const double d = std::fabs(got[i] - want[i]);
        if (!(d <= worst)) worst = d;  // NaN (a partial sum never written) is the worst
      }
      std::printf("[ int8 mma n=%lld k=%lld m=%lld splits=%lld ] %.3g of the largest output\n",
                  static_cast<long long>(cs.n), static_cast<long long>(cs.k),
                  static_cast<long long>(cs.m), static_cast<long long>(splits), worst / largest);
      EXPECT_LT(worst, 1e-5 * largest) << cs.n << " " << cs.k << " " << cs.m << " " << splits;
      if (vec) {  // the element loads give the same bits as the 8-byte ones
        const std::vector<float> elem = run(w, a, cs.m, false, splits);
        EXPECT_EQ(elem, got);
      }
    }
  }
}

TEST(CudaInt8MmaLane, SplitsAreWholeGroupsAndNoneEmpty) {
  for (int64_t n : {16, 768, 4608, 50257})
    for (int64_t k : {1, 32, 33, 768, 3072, 12288})
      for (int64_t force : {0, 1, 2, 5, 64}) {
        const li::MmaSplit sp = li::mma_split(n, k, 528, force);
        const int64_t groups = li::groups(k);
        ASSERT_GE(sp.splits, 1);
        ASSERT_GE(sp.groups_per_split, 1);
        EXPECT_GE(sp.splits * sp.groups_per_split, groups);  // every group in a split
        EXPECT_LT((sp.splits - 1) * sp.groups_per_split, groups);  // the last one not empty
        EXPECT_LE(sp.splits, force > 0 ? force : 16);
        if (force == 0 && sp.splits > 1) {
          EXPECT_GE(sp.groups_per_split, 4);
        }
      }
  // Narrow weights are split to fill the GPU; lm_head-wide ones are not.
  EXPECT_GT(li::mma_split(768, 3072, 528).splits, 1);
  EXPECT_EQ(li::mma_split(50257, 768, 528).splits, 1);
}

}  // namespace
}  // namespace ltm
