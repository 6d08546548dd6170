// int8 weights (kernels/cpu/int8_gemm.h): the packing (scales, rounding, pad rows and columns,
// streamed and transposed packing give the same bytes), and int8_gemm on every kernel path the CPU
// supports (Int8GemmIsa/*/avx512 runs the AVX-512 VNNI kernel where the CPU has VNNI, /avx2,
// /portable) against
//   1. a reference that dequantizes: W from the packed bytes (int8_packed_column), A quantized as
//      int8_gemm does (int8_quantize_row) and dequantized, multiplied in double: the kernels' only
//      error is fp32 rounding of the per-group partial sums;
//   2. the portable kernel on the same inputs;
//   3. the fp32 product, within what quantizing both sides may change.
// LTM_CPU_ISA forces one path for the whole binary; the ISA tests switch themselves.
#include "kernels/cpu/int8_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/weight_type.h"
#include "runtime/backend/backend.h"
#include "tests/kernels/isa_param.h"
#include "tests/kernels/random_floats.h"

namespace ltm::kernels::cpu {
namespace {

using test::random_floats;

std::vector<uint8_t> pack(const std::vector<float>& w, int64_t k, int64_t n) {
  std::vector<uint8_t> packed(int8_packed_bytes(k, n), 0xA5);  // garbage: every byte is written
  int8_pack_rows(w.data(), 0, k, k, n, packed.data());
  return packed;
}

// W dequantized from the packed bytes, row-major [k, n].
std::vector<float> dequantized(const std::vector<uint8_t>& packed, int64_t k, int64_t n) {
  std::vector<float> w(k * n), col(k);
  for (int64_t j = 0; j < n; ++j) {
    int8_packed_column(packed.data(), k, j, col.data());
    for (int64_t p = 0; p < k; ++p) w[p * n + j] = col[p];
  }
  return w;
}

struct Refs {
  std::vector<double> deq;     // reference 1
  std::vector<double> bound1;  // its tolerance per element
  std::vector<double> fp32;    // the unquantized product
  std::vector<double> bound3;
};

Refs references(const std::vector<float>& a, const std::vector<float>& w,
                const std::vector<uint8_t>& packed, const std::vector<float>& c0, int64_t m,
                int64_t n, int64_t k, float beta) {
  const std::vector<float> wd = dequantized(packed, k, n);
  const int64_t groups = int8_groups(k);
  std::vector<int8_t> q(groups * kInt8Group);
  std::vector<float> s(groups);
  Refs r{std::vector<double>(m * n), std::vector<double>(m * n), std::vector<double>(m * n),
         std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i) {
    int8_quantize_row(a.data() + i * k, k, q.data(), s.data());
    for (int64_t j = 0; j < n; ++j) {
      double d = beta * static_cast<double>(c0[i * n + j]), f = d, mag = std::fabs(d), err = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double ad = static_cast<double>(q[p]) * s[p / kInt8Group];
        d += ad * wd[p * n + j];
        mag += std::fabs(ad * wd[p * n + j]);
        f += static_cast<double>(a[i * k + p]) * w[p * n + j];
        // Quantizing a and w: |a - ad| <= s_a / 2, |w - wd| <= s_w / 2 (fp16 scale rounding is
        // already in wd). Bound the change of the product term by its worst case.
        const double sa = s[p / kInt8Group] / 2.0;
        const double sw = std::fabs(static_cast<double>(w[p * n + j]) - wd[p * n + j]);
        err += std::fabs(a[i * k + p]) * sw + sa * std::fabs(wd[p * n + j]);
      }
      r.deq[i * n + j] = d;
      // fp32: each group's int32 sum is exact; scaling and adding the groups round a few times
      // per group (relative 2^-24 each) on partial sums bounded by `mag`.
      r.bound1[i * n + j] = 1e-6 * mag + 1e-6;
      r.fp32[i * n + j] = f;
      r.bound3[i * n + j] = err + 1e-6 * mag + 1e-6;
    }
  }
  return r;
}

std::vector<float> run(const std::vector<float>& a, const std::vector<uint8_t>& packed,
                       const std::vector<float>& c0, int64_t m, int64_t n, int64_t k, float beta) {
  std::vector<float> out = c0;
  if (beta == 0.0f) std::fill(out.begin(), out.end(), std::nanf(""));  // must not be read
  int8_gemm(a.data(), packed.data(), out.data(), m, n, k, beta);
  return out;
}

void check(int64_t m, int64_t n, int64_t k, float beta, float w_scale = 1.0f) {
  SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k << " beta=" << beta);
  const auto a = random_floats(m * k, static_cast<unsigned>(m * 131 + k));
  auto w = random_floats(k * n, static_cast<unsigned>(n * 7 + k), -w_scale, w_scale);
  const auto c0 = random_floats(m * n, 3);
  const auto packed = pack(w, k, n);
  const Refs r = references(a, w, packed, c0, m, n, k, beta);
  const std::vector<float> out = run(a, packed, c0, m, n, k, beta);
  const Isa saved = isa();
  set_isa(Isa::kPortable);
  const std::vector<float> port = run(a, packed, c0, m, n, k, beta);
  set_isa(saved);
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_NEAR(out[i], r.deq[i], r.bound1[i]) << "dequantizing reference, element " << i;
    ASSERT_NEAR(out[i], port[i], 2 * r.bound1[i]) << "portable kernel, element " << i;
    ASSERT_NEAR(out[i], r.fp32[i], r.bound3[i]) << "fp32 product, element " << i;
  }
}

class Int8GemmIsa : public IsaTest {};

TEST_P(Int8GemmIsa, KernelName) {
  const std::string name = int8_kernel_name();
  if (GetParam() == Isa::kPortable) {
    EXPECT_EQ(name, "portable");
  } else if (GetParam() == Isa::kAvx2) {
    EXPECT_EQ(name, "avx2");
  } else {
    EXPECT_TRUE(name == "avx512-vnni" || name == "avx2") << name;
  }
  std::printf("[ int8 kernel ] %s path: %s\n", isa_name(GetParam()), name.c_str());
}

TEST_P(Int8GemmIsa, RaggedShapes) {
  // m over every row-tile size and a remainder; n not a multiple of 64 (or 32, 16, 8); k not a
  // multiple of the group (a pad tail) and of one group or less.
  for (int64_t m : {1, 2, 3, 4, 5, 9})
    for (int64_t n : {1, 8, 17, 40, 64, 65, 130})
      for (int64_t k : {1, 4, 31, 32, 33, 96, 100})
        for (float beta : {0.0f, 0.5f}) check(m, n, k, beta);
}

TEST_P(Int8GemmIsa, Gpt2Shapes) {
  for (int64_t m : {1, 7})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {768, 3072}})
      check(m, n, k, m == 7 ? 1.0f : 0.0f, 0.05f);
}

TEST_P(Int8GemmIsa, OneAndTwoThreads) {
  const int saved = blas_threads();
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    check(70, 128, 64, 0.0f);   // 2 panels for 2 threads: the rows are split too
    check(33, 64, 100, 1.0f);   // one panel
    check(1, 300, 96, 0.0f);
  }
  set_blas_threads(saved);
}

// A row's result does not depend on how many rows the step has: each row alone (decode, the
// 4-panel walk) has the bits of the same row in a step of 2..20 rows (row tiles, and from 16 the
// AMX-INT8 kernel where the CPU has it), 1 and 2 threads, k across several groups. Greedy
// speculative decoding relies on it: a token verified among other rows must be the token plain
// decoding computes alone.
TEST_P(Int8GemmIsa, ARowHasTheSameBitsAtEveryRowCount) {
  std::printf("[ int8 kernels ] %s path: 1 row %s, 20 rows %s\n", isa_name(GetParam()),
              int8_kernel_name(1), int8_kernel_name(20));
  const int saved = blas_threads();
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    for (auto [n, k] : {std::pair<int64_t, int64_t>{300, 257}, {64, 768}, {130, 96}})
      for (float beta : {0.0f, 0.5f}) {
        constexpr int64_t kRows = 20;
        const auto a = random_floats(kRows * k, static_cast<unsigned>(k));
        const auto w = random_floats(k * n, static_cast<unsigned>(n + k));
        const auto c0 = random_floats(kRows * n, 5);
        const auto packed = pack(w, k, n);
        std::vector<float> alone(static_cast<size_t>(kRows * n));
        for (int64_t i = 0; i < kRows; ++i) {
          const std::vector<float> row(a.begin() + i * k, a.begin() + (i + 1) * k);
          const std::vector<float> c_row(c0.begin() + i * n, c0.begin() + (i + 1) * n);
          const std::vector<float> out = run(row, packed, c_row, 1, n, k, beta);
          std::copy(out.begin(), out.end(), alone.begin() + i * n);
        }
        for (int64_t m = 2; m <= kRows; ++m) {
          const std::vector<float> c_m(c0.begin(), c0.begin() + m * n);
          const std::vector<float> out = run(a, packed, c_m, m, n, k, beta);
          EXPECT_EQ(0, std::memcmp(out.data(), alone.data(), static_cast<size_t>(m * n) * 4))
              << "m=" << m << " n=" << n << " k=" << k << " beta=" << beta << " threads="
              << threads << " (" << int8_kernel_name(m) << ")";
        }
      }
  }
  set_blas_threads(saved);
}

TEST_P(Int8GemmIsa, ExtremesDoNotSaturate) {
  // Every weight and activation at +-max in the same or opposite sign pattern: the AVX2 kernel's
  // 16-bit pair sums reach 2 * 127 * 127, the largest group sums +-32 * 127 * 127.
  const int64_t m = 3, n = 64, k = 64;
  std::vector<float> a(m * k), w(k * n);
  for (int64_t p = 0; p < k; ++p) {
    const float sign = p % 3 == 0 ? -1.0f : 1.0f;
    // 127/64: the scale 1/64 is exact in fp16, so the products are exact too.
    for (int64_t j = 0; j < n; ++j) w[p * n + j] = (j % 2 == 0 ? sign : -sign) * 127.0f / 64.0f;
    a[0 * k + p] = sign;            // same signs as column 0: every product +127 * 127
    a[1 * k + p] = -sign;           // every product -127 * 127
    a[2 * k + p] = p % 2 ? 1.0f : -1.0f;
  }
  const auto packed = pack(w, k, n);
  std::vector<float> c0(m * n, 0.0f);
  const std::vector<float> out = run(a, packed, c0, m, n, k, 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0;
      for (int64_t p = 0; p < k; ++p) ref += static_cast<double>(a[i * k + p]) * w[p * n + j];
      ASSERT_NEAR(out[i * n + j], ref, 1e-4 * std::fabs(ref) + 1e-4) << i << "," << j;
    }
  EXPECT_NEAR(out[0], 127.0, 1e-3);  // 64 products of 1 * 127/64
  EXPECT_NEAR(out[n], -127.0, 1e-3);
}

TEST_P(Int8GemmIsa, CpuBackendWeightsEmbeddingAndLmHead) {
  // The backend's int8 weights are int8_gemm.h's: streamed in row ranges (whole groups) through
  // write_weight_rows, the tied embedding through write_embedding_rows (E^T).
  auto backend = make_cpu_backend(2);
  ASSERT_TRUE(backend->supports(Precision::kInt8, Precision::kF16));
  ASSERT_FALSE(backend->supports(Precision::kF32, Precision::kInt8));
  const int64_t m = 5, n = 100, k = 96;
  const auto a = random_floats(m * k, 21), w = random_floats(k * n, 22);
  DeviceBuffer wb = backend->alloc_weight(k, n, Precision::kInt8);
  EXPECT_EQ(wb.bytes(), int8_packed_bytes(k, n));
  backend->write_weight_rows(wb, w.data() + 64 * n, 64, 96, k, n);
  backend->write_weight_rows(wb, w.data(), 0, 64, k, n);
  const auto packed = pack(w, k, n);
  ASSERT_EQ(0, std::memcmp(wb.data(), packed.data(), packed.size()));
  std::vector<float> out(m * n), ref(m * n);
  backend->matmul(a.data(), wb, out.data(), m, n, k, 0.0f);
  int8_gemm(a.data(), packed.data(), ref.data(), m, n, k, 0.0f);
  EXPECT_EQ(out, ref);
  // packed_gemm.h's generic entry points take kInt8 too.
  std::vector<float> gen(m * n);
  EXPECT_EQ(packed_bytes(k, n, WeightType::kInt8), int8_packed_bytes(k, n));
  packed_gemm(a.data(), packed.data(), WeightType::kInt8, gen.data(), m, n, k, 0.0f);
  EXPECT_EQ(gen, ref);

  const int64_t rows = 130, d = 64;  // E [rows, d]; this rank holds vocab rows [10, 140)
  const auto e = random_floats(rows * d, 23);
  DeviceBuffer table = backend->upload_embedding(e.data(), rows, d, Precision::kInt8);
  std::vector<float> x(m * d), logits(m * rows);
  x = random_floats(m * d, 24);
  backend->lm_head(x.data(), table, logits.data(), m, rows, d);
  std::vector<float> et(d * rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < d; ++p) et[p * rows + r] = e[r * d + p];
  const Refs rr = references(x, et, pack(et, d, rows), std::vector<float>(m * rows), m, rows, d, 0.0f);
  for (int64_t i = 0; i < m * rows; ++i) ASSERT_NEAR(logits[i], rr.deq[i], rr.bound1[i]) << i;
  const std::vector<int32_t> ids = {10, 139, 5, 140};
  std::vector<float> emb(ids.size() * d, std::nanf(""));
  backend->embed(ids.data(), table, 10, 140, emb.data(), static_cast<int64_t>(ids.size()), d);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t p = 0; p < d; ++p) {
      const bool mine = ids[t] >= 10 && ids[t] < 140;
      const float want = mine ? e[(ids[t] - 10) * d + p] : 0.0f;
      ASSERT_NEAR(emb[t * d + p], want, mine ? 1.0f / 127.0f : 0.0f) << t << "," << p;
    }
}

TEST_P(Int8GemmIsa, QuantizeRowIsBitIdenticalOnEveryPath) {
  // Random rows with ties (x.5 after scaling), zeros, NaN, inf and huge values; k with tails.
  for (int64_t k : {1, 5, 31, 32, 33, 64, 100, 768}) {
    std::vector<float> a = random_floats(k, static_cast<unsigned>(k), -3.0f, 3.0f);
    for (int64_t p = 0; p < k; p += 7) a[p] = std::nearbyint(a[p] * 4.0f) / 8.0f;  // ties
    if (k > 40) {
      a[3] = std::nanf("");
      a[35] = std::numeric_limits<float>::infinity();
      for (int64_t p = 64; p < std::min<int64_t>(k, 96); ++p) a[p] = 0.0f;  // an all-zero group
    }
    const int64_t g = int8_groups(k);
    std::vector<int8_t> q_ref(g * 32, 99), q(g * 32, 77);
    std::vector<float> s_ref(g), s(g);
    std::vector<int32_t> sum(g);
    int8_quantize_row(a.data(), k, q_ref.data(), s_ref.data());
    int8_quantize_row_for_path(a.data(), k, q.data(), s.data(), sum.data());
    EXPECT_EQ(q, q_ref) << "k=" << k;
    for (int64_t i = 0; i < g; ++i) {
      EXPECT_EQ(std::memcmp(&s[i], &s_ref[i], sizeof(float)), 0) << "k=" << k << " group " << i;
      int32_t want = 0;
      for (int64_t p = 0; p < 32; ++p) want += q_ref[i * 32 + p];
      EXPECT_EQ(sum[i], want) << "k=" << k << " group " << i;
    }
  }
}

LTM_INSTANTIATE_ISA_TESTS(Int8GemmIsa);

TEST(Int8Pack, ScalesAndRounding) {
  const int64_t k = 70, n = 3;  // groups of 32, 32, 6 (a tail of 26 pad rows)
  const auto w = random_floats(k * n, 11, -3.0f, 3.0f);
  const auto packed = pack(w, k, n);
  ASSERT_EQ(packed.size(), static_cast<size_t>(3 * kInt8GroupBytes));  // one panel, 3 groups
  std::vector<float> col(k);
  for (int64_t j = 0; j < n; ++j) {
    int8_packed_column(packed.data(), k, j, col.data());
    for (int64_t g = 0; g < 3; ++g) {
      const uint8_t* blk = packed.data() + g * kInt8GroupBytes;
      const float s = f16_to_f32(static_cast<uint16_t>(blk[2 * j] | (blk[2 * j + 1] << 8)));
      float amax = 0.0f;
      for (int64_t p = g * 32; p < std::min(k, g * 32 + 32); ++p)
        amax = std::max(amax, std::fabs(w[p * n + j]));
      EXPECT_EQ(s, round_to(WeightType::kF16, amax / 127.0f)) << "column " << j << " group " << g;
      for (int64_t p = g * 32; p < std::min(k, g * 32 + 32); ++p) {
        EXPECT_LE(std::fabs(col[p] - w[p * n + j]), s / 2 * (1 + 1e-6)) << p << "," << j;
        const float qf = col[p] / s;
        EXPECT_EQ(qf, std::nearbyint(qf));
        EXPECT_LE(std::fabs(qf), 127.0f);
      }
      for (int64_t p = k; p < g * 32 + 32; ++p)  // pad rows: zero bytes (128)
        EXPECT_EQ(blk[128 + 256 * ((p % 32) / 4) + 4 * j + p % 4], 128) << "pad row " << p;
    }
  }
  for (int64_t c = n; c < 64; ++c)  // pad columns: scale 0, zero bytes
    for (int64_t g = 0; g < 3; ++g) {
      const uint8_t* blk = packed.data() + g * kInt8GroupBytes;
      EXPECT_EQ(blk[2 * c] | blk[2 * c + 1], 0);
      for (int64_t p = 0; p < 32; ++p) EXPECT_EQ(blk[128 + 256 * (p / 4) + 4 * c + p % 4], 128);
    }
}

TEST(Int8Pack, ZeroAndNonFiniteGroups) {
  const int64_t k = 64, n = 2;
  std::vector<float> w(k * n, 0.0f);
  w[40 * n + 1] = std::numeric_limits<float>::infinity();
  w[41 * n + 1] = std::nanf("");
  const auto packed = pack(w, k, n);
  std::vector<float> col(k);
  int8_packed_column(packed.data(), k, 0, col.data());
  for (float x : col) EXPECT_EQ(x, 0.0f);  // an all-zero group: scale 0
  int8_packed_column(packed.data(), k, 1, col.data());
  for (float x : col) EXPECT_TRUE(std::isfinite(x));  // clamped, no NaN or inf bytes
}

TEST(Int8Pack, StreamedRangesAndTransposedGiveTheSameBytes) {
  const int64_t k = 200, n = 150;  // 7 groups (the last of 8 rows), 3 panels (the last of 22)
  const auto w = random_floats(k * n, 5);
  const auto whole = pack(w, k, n);
  std::vector<uint8_t> streamed(whole.size(), 0x5A);
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{96, 200}, {0, 32}, {32, 96}})
    int8_pack_rows(w.data() + r0 * n, r0, r1, k, n, streamed.data());
  EXPECT_EQ(streamed, whole);
  // W = E^T for E [n, k]: E's rows in ranges.
  std::vector<float> e(n * k);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) e[j * k + p] = w[p * n + j];
  std::vector<uint8_t> transposed(whole.size(), 0x5A);
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{100, 150}, {0, 37}, {37, 100}})
    int8_pack_transposed_rows(e.data() + r0 * k, r0, r1, n, k, transposed.data());
  EXPECT_EQ(transposed, whole);
  std::vector<uint8_t> sink(whole.size());
  EXPECT_THROW(int8_pack_rows(w.data(), 0, 40, k, n, sink.data()), std::invalid_argument);
  EXPECT_THROW(int8_pack_rows(w.data(), 8, 32, k, n, sink.data()), std::invalid_argument);
}

TEST(Int8Quantize, RowGroups) {
  const int64_t k = 40;
  auto a = random_floats(k, 9);
  a[3] = 2.5f;  // the first group's largest
  std::vector<int8_t> q(64);
  std::vector<float> s(2);
  int8_quantize_row(a.data(), k, q.data(), s.data());
  EXPECT_FLOAT_EQ(s[0], 2.5f / 127.0f);
  EXPECT_EQ(q[3], 127);
  for (int64_t p = 0; p < k; ++p) EXPECT_LE(std::fabs(q[p] * s[p / 32] - a[p]), s[p / 32] * 0.5001f);
  for (int64_t p = k; p < 64; ++p) EXPECT_EQ(q[p], 0);
}

}  // namespace
}  // namespace ltm::kernels::cpu
