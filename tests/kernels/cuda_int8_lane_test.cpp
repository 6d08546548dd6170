// The CUDA int8 GEMM's lane arithmetic (kernels/cuda/int8_lane.h, what int8_gemm.cu's kernel
// runs in each lane), compiled for the CPU: the 32 lanes of a warp run one after the other and
// their partial sums are added, as the kernel's warp_sum does. Checked without a GPU:
//  - the byte unpacking is exact for every int8 value;
//  - every quant of a column is read by exactly one lane, with its own group's scale: against
//    one-hot rows of A, the warp's sum is the dequantized weight q * s exactly (one product,
//    exact in float), for every k from 1 to past two warp steps;
//  - random A against a float64 reference on the same dequantized weights, 1..16 rows;
//  - the reads in flight a lane keeps (1, 2 or 4 warp steps) give the same bits;
//  - the layout holds the CPU backend's values: q * s of every weight equals the CPU's packed
//    int8 matrix (int8_packed_column), since both quantize by kernels/cpu/int8_quant.h;
//  - the backend's upload (int8_layout.h: staging and two strided copies, done here by a host
//    copy of cudaMemcpy2D's geometry) puts every byte of a weight and of a tied embedding where
//    the kernels read it, whatever the ranges of rows the model loads by.
// What needs a GPU (the launch, vector loads, the warp reduction, 16-bit activations, the
// backend's strided upload) is cuda_int8_gpu_test's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/int8_quant.h"
#include "kernels/cuda/int8_lane.h"
#include "kernels/cuda/int8_layout.h"
#include "tests/kernels/random_floats.h"

namespace ltm {
namespace {

namespace li = kernels::cuda::int8;

// W [k, n] fp32 in the CUDA layout: q [n, kp] then scales [n, groups], as the backend writes it.
struct Layout {
  int64_t n = 0, k = 0, kp = 0, groups = 0;
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;
  float weight(int64_t p, int64_t c) const {
    return static_cast<float>(q[c * kp + p]) * li::scale_float(scales[c * groups + p / 32]);
  }
};

Layout quantize(const std::vector<float>& w, int64_t k, int64_t n) {
  Layout l;
  l.n = n;
  l.k = k;
  l.kp = li::padded_k(k);
  l.groups = li::groups(k);
  l.q.assign(static_cast<size_t>(n * l.kp), 0);
  l.scales.resize(static_cast<size_t>(n * l.groups));
  for (int64_t c = 0; c < n; ++c)
    for (int64_t g = 0; g < l.groups; ++g)
      l.scales[c * l.groups + g] = kernels::int8_quantize_group(
          w.data() + g * 32 * n + c, n, std::min<int64_t>(32, k - g * 32), l.q.data() + c * l.kp + g * 32);
  return l;
}

// The warp's result for column c and rows [0, m) of A (lda k): the lanes' sums, then added.
template <int MT>
std::vector<float> warp(const Layout& l, const std::vector<float>& a, int64_t m, int64_t c) {
  std::vector<float> out(static_cast<size_t>(m), 0.0f);
  for (int lane = 0; lane < 32; ++lane) {
    float acc[MT] = {};
    li::lane_dot<MT, false>(l.q.data() + c * l.kp, l.scales.data() + c * l.groups, a.data(), l.k,
                            m, l.k, lane, acc);
    for (int64_t r = 0; r < m; ++r) out[r] += acc[r];
  }
  return out;
}

using test::random_floats;

TEST(CudaInt8Lane, UnpackIsExact) {
  for (int v = -128; v <= 127; ++v) {
    const uint8_t b = static_cast<uint8_t>(static_cast<int8_t>(v));
    const uint32_t word = b | (uint32_t{0x7f} << 8) | (uint32_t{0x81} << 16) | (uint32_t{b} << 24);
    float out[4];
    li::unpack4(word, out);
    EXPECT_EQ(out[0], static_cast<float>(v));
    EXPECT_EQ(out[1], 127.0f);
    EXPECT_EQ(out[2], -127.0f);
    EXPECT_EQ(out[3], static_cast<float>(v));
  }
  // __byte_perm's selection: bytes 0..3 of x, 4..7 of y.
  EXPECT_EQ(li::byte_perm(0x33221100u, 0x77665544u, 0x7540u), 0x77554400u);
  EXPECT_EQ(li::byte_perm(0x33221100u, 0x77665544u, 0x0123u), 0x00112233u);
}

TEST(CudaInt8Lane, EveryQuantIsReadOnceWithItsScale) {
  constexpr int64_t n = 3;
  for (int64_t k = 1; k <= 1100; k += (k < 70 ? 1 : 37)) {
    const std::vector<float> w = random_floats(static_cast<size_t>(k * n), 7 + static_cast<uint32_t>(k));
    const Layout l = quantize(w, k, n);
    std::vector<float> a(static_cast<size_t>(k));
    for (int64_t p = 0; p < k; ++p) {
      std::fill(a.begin(), a.end(), 0.0f);
      a[p] = 1.0f;
      for (int64_t c = 0; c < n; ++c) {
        const std::vector<float> got = warp<1>(l, a, 1, c);
        ASSERT_EQ(got[0], l.weight(p, c)) << "k " << k << " p " << p << " column " << c;
      }
    }
  }
}

TEST(CudaInt8Lane, RowsAgainstAFloat64Reference) {
  constexpr int64_t n = 4;
  for (int64_t k : {1, 7, 32, 33, 100, 511, 512, 513, 768, 1000, 3072}) {
    const std::vector<float> w = random_floats(static_cast<size_t>(k * n), 11 + static_cast<uint32_t>(k));
    const Layout l = quantize(w, k, n);
    for (int64_t m : {1, 2, 3, 5, 8, 16}) {
      const std::vector<float> a = random_floats(static_cast<size_t>(m * k), 3 + static_cast<uint32_t>(m));
      for (int64_t c = 0; c < n; ++c) {
        const std::vector<float> got = warp<16>(l, a, m, c);
        for (int64_t r = 0; r < m; ++r) {
          double ref = 0.0, mag = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            ref += static_cast<double>(a[r * k + p]) * l.weight(p, c);
            mag += std::fabs(static_cast<double>(a[r * k + p]) * l.weight(p, c));
          }
          ASSERT_NEAR(got[r], ref, 1e-6 * mag + 1e-7) << "k " << k << " m " << m << " row " << r;
        }
      }
    }
  }
}

// The reads in flight (int8_lane.h's kInFlight) change when quants are loaded, not the order of
// the sums: 1, 2 (written out) and 4 (the general loop) warp steps at a time give the same bits
// for every lane, across k with ragged ends and several whole rounds of 4 steps.
template <int MT, int kInFlight>
std::vector<float> lanes(const Layout& l, const std::vector<float>& a, int64_t m, int64_t c) {
  std::vector<float> out;
  for (int lane = 0; lane < 32; ++lane) {
    float acc[MT] = {};
    li::lane_dot<MT, false, float, kInFlight>(l.q.data() + c * l.kp,
                                              l.scales.data() + c * l.groups, a.data(), l.k, m,
                                              l.k, lane, acc);
    out.insert(out.end(), acc, acc + m);
  }
  return out;
}

TEST(CudaInt8Lane, ReadsInFlightKeepTheBits) {
  EXPECT_EQ(li::kStepsInFlight<1>, 4);
  EXPECT_EQ(li::kStepsInFlight<2>, 2);
  EXPECT_EQ(li::kStepsInFlight<16>, 2);
  constexpr int64_t n = 2;
  for (int64_t k : {1, 31, 512, 1000, 1024, 1536, 2047, 2048, 2049, 5000}) {
    const std::vector<float> w =
        random_floats(static_cast<size_t>(k * n), 31 + static_cast<uint32_t>(k));
    const Layout l = quantize(w, k, n);
    for (int64_t m : {1, 2}) {
      const std::vector<float> a =
          random_floats(static_cast<size_t>(m * k), 41 + static_cast<uint32_t>(m));
      for (int64_t c = 0; c < n; ++c) {
        const std::vector<float> two = lanes<2, 2>(l, a, m, c);
        const std::vector<float> four = lanes<2, 4>(l, a, m, c);
        const std::vector<float> one = lanes<2, 1>(l, a, m, c);
        ASSERT_EQ(four, two) << "k " << k << " m " << m;
        ASSERT_EQ(one, two) << "k " << k << " m " << m;
      }
    }
  }
}

TEST(CudaInt8Lane, HoldsTheCpuBackendsValues) {
  for (int64_t k : {5, 32, 100, 768}) {
    constexpr int64_t n = 70;  // past one CPU panel of 64 columns
    std::vector<float> w = random_floats(static_cast<size_t>(k * n), 5 + static_cast<uint32_t>(k));
    w[3] = 0.0f;  // a few special values: zero, a large one, a NaN
    w[static_cast<size_t>(n + 1)] = 1e4f;
    w[static_cast<size_t>(2 * n + 2) % w.size()] = std::nanf("");
    const Layout l = quantize(w, k, n);
    std::vector<uint8_t> packed(kernels::cpu::int8_packed_bytes(k, n));
    kernels::cpu::int8_pack_rows(w.data(), 0, k, k, n, packed.data());
    std::vector<float> column(static_cast<size_t>(k));
    for (int64_t c = 0; c < n; ++c) {
      kernels::cpu::int8_packed_column(packed.data(), k, c, column.data());
      for (int64_t p = 0; p < k; ++p) ASSERT_EQ(l.weight(p, c), column[p]) << "k " << k << " p " << p << " c " << c;
    }
  }
}

// cudaMemcpy2D's geometry on the host.
void copy_2d(std::vector<uint8_t>& buf, const void* src, const kernels::cuda::Int8Copy& c) {
  ASSERT_LE(c.dst_offset + (c.height - 1) * c.dst_pitch + c.width, buf.size());
  for (size_t r = 0; r < c.height; ++r)
    std::memcpy(buf.data() + c.dst_offset + r * c.dst_pitch,
                static_cast<const uint8_t*>(src) + r * c.src_pitch, c.width);
}

// The bytes the layout must hold: quants (zero past k), then scales.
std::vector<uint8_t> layout_bytes(const Layout& l) {
  std::vector<uint8_t> out(l.q.size() + 2 * l.scales.size());
  std::memcpy(out.data(), l.q.data(), l.q.size());
  std::memcpy(out.data() + l.q.size(), l.scales.data(), l.scales.size() * 2);
  return out;
}

TEST(CudaInt8Lane, UploadPutsEveryByteInPlace) {
  for (auto [k, n] : {std::pair<int64_t, int64_t>{100, 70}, {768, 5}, {33, 3}, {64, 9}}) {
    const std::vector<float> w = random_floats(static_cast<size_t>(k * n), 21 + static_cast<uint32_t>(k));
    const std::vector<uint8_t> want = layout_bytes(quantize(w, k, n));
    for (int64_t chunk : {32, 64, 96, 4096}) {  // the model loads whole groups of 32 rows
      std::vector<uint8_t> buf(want.size(), 0x55);  // every byte the upload misses shows
      std::vector<int8_t> q;
      std::vector<uint16_t> s;
      for (int64_t r0 = 0; r0 < k; r0 += chunk) {
        const int64_t r1 = std::min(k, r0 + chunk);
        const kernels::cuda::Int8Staged st =
            kernels::cuda::int8_stage_rows(w.data() + r0 * n, r0, r1, k, n, q, s);
        copy_2d(buf, q.data(), st.quants);
        copy_2d(buf, s.data(), st.scales);
      }
      ASSERT_EQ(buf, want) << "k " << k << " n " << n << " chunks of " << chunk;
    }
  }
  // The tied embedding E [rows, d]: its rows are the columns of the weight E^T [d, rows].
  constexpr int64_t rows = 333, d = 100;
  const std::vector<float> e = random_floats(rows * d, 23);
  std::vector<float> et(e.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) et[c * rows + r] = e[r * d + c];
  const std::vector<uint8_t> want = layout_bytes(quantize(et, d, rows));
  std::vector<uint8_t> buf(want.size(), 0x55);
  std::vector<int8_t> q;
  std::vector<uint16_t> s;
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, 50}, {50, 51}, {51, 333}}) {
    const kernels::cuda::Int8Staged st =
        kernels::cuda::int8_stage_table_rows(e.data() + r0 * d, r0, r1, rows, d, q, s);
    copy_2d(buf, q.data(), st.quants);
    copy_2d(buf, s.data(), st.scales);
  }
  ASSERT_EQ(buf, want);
}

}  // namespace
}  // namespace ltm
