// The tensor-core prefill attention's warp arithmetic (kernels/cuda/attention_mma.h, what
// attention_prefill_mma.cu runs), compiled for the CPU: each warp's 32 lanes run one after the
// other (HostWarp: mma.m16n8k16 emulated from the fragment layouts PTX documents, the quad
// shuffles as the device's xor butterfly), inside a copy of the kernel's block loop (the Q tile,
// the key offsets through a shuffled block table, K and transposed V tiles, the warps that see a
// tile). Against a float64 attention over the same 16-bit Q, K and V, for bf16 and fp16, head
// sizes 16 to 128 (80 padded to the 128-wide kernel), sequences whose prompts continue a cached
// context, several query tiles and key tiles, and grouped-query heads. Checked as well: nothing
// outside a sequence's own rows and head is written. What needs a GPU (that mma.sync has PTX's
// layout, the launch, the block's barriers) is cuda_backend_ops_gpu_test's, against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/attention_mma.h"
#include "tests/kernels/host_mma.h"
#include "runtime/model/dtype.h"

namespace ltm {
namespace {

namespace am = kernels::cuda::mma;

uint16_t lo16(uint32_t v) { return static_cast<uint16_t>(v & 0xffffu); }
uint16_t hi16(uint32_t v) { return static_cast<uint16_t>(v >> 16); }

// A warp on the CPU (host_mma.h) with the quad shuffles of the kernel's DeviceWarp.
template <int kD>
struct HostWarp : host_mma::HostWarp<am::Lane<kD>> {
  using host_mma::HostWarp<am::Lane<kD>>::lanes;
  // __shfl_xor_sync by 1 then 2 within each quad of lanes, as DeviceWarp.
  template <class Op>
  void quad(Op op) {
    for (int i = 0; i < 2; ++i)
      for (int offset : {1, 2}) {
        float v[32];
        for (int l = 0; l < 32; ++l) v[l] = lanes[l].red[i];
        for (int l = 0; l < 32; ++l) lanes[l].red[i] = op(v[l], v[l ^ offset]);
      }
  }
  void quad_max() { quad([](float x, float y) { return std::fmax(x, y); }); }
  void quad_sum() { quad([](float x, float y) { return x + y; }); }
};

// A batch as the kernel sees it: qkv rows, a paged K/V cache, each sequence's block table.
struct Batch {
  int n_head = 0, n_kv = 0, head_dim = 0, block_size = 16, max_blocks = 0;
  std::vector<int32_t> offsets;   // token_offsets
  std::vector<int32_t> contexts;  // context_lens
  std::vector<int32_t> tables;    // [seq][max_blocks]
  std::vector<uint16_t> qkv;      // [rows][(n_head + 2 n_kv) head_dim]
  std::vector<uint16_t> k, v;     // [blocks][n_kv][block_size][head_dim]
  int64_t qkv_stride() const { return static_cast<int64_t>(n_head + 2 * n_kv) * head_dim; }
  int64_t cache_at(int seq, int kv_head, int pos) const {
    const int block = tables[static_cast<size_t>(seq) * max_blocks + pos / block_size];
    return ((static_cast<int64_t>(block) * n_kv + kv_head) * block_size + pos % block_size) *
           head_dim;
  }
};

template <bool kBf16>
Batch make_batch(int n_head, int n_kv, int head_dim, const std::vector<int>& news,
                 const std::vector<int>& cached, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto r16 = [&](float scale) { return am::to_bits<kBf16>(scale * normal(rng)); };
  Batch b;
  b.n_head = n_head;
  b.n_kv = n_kv;
  b.head_dim = head_dim;
  b.offsets = {0};
  int max_ctx = 0;
  for (size_t s = 0; s < news.size(); ++s) {
    b.offsets.push_back(b.offsets.back() + news[s]);
    b.contexts.push_back(cached[s] + news[s]);
    max_ctx = std::max(max_ctx, b.contexts.back());
  }
  b.max_blocks = (max_ctx + b.block_size - 1) / b.block_size;
  const int n_blocks = b.max_blocks * static_cast<int>(news.size());
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // a sequence's blocks are anywhere in the pool
  b.tables = perm;
  b.qkv.resize(static_cast<size_t>(b.offsets.back() * b.qkv_stride()));
  for (auto& x : b.qkv) x = r16(1.5f);  // larger scores: a peaked softmax as well as a flat one
  const size_t cache = static_cast<size_t>(n_blocks) * n_kv * b.block_size * head_dim;
  b.k.resize(cache);
  b.v.resize(cache);
  for (auto& x : b.k) x = r16(1.5f);
  for (auto& x : b.v) x = r16(1.0f);
  return b;
}

// The kernel's block (attention_prefill_mma.cu's paged_prefill_mma_kernel), one warp at a time.
template <int kD, bool kBf16>
void run_block(const Batch& b, int q_tile, int head, int seq, std::vector<uint16_t>& out,
               int* mma_calls) {
  constexpr int kStride = am::row_stride(kD);
  const int first_row = b.offsets[seq];
  const int n_new = b.offsets[seq + 1] - first_row;
  const int q_begin = q_tile * am::kTileQ;
  if (q_begin >= n_new) return;
  const int n_rows = std::min(am::kTileQ, n_new - q_begin);
  const int pos0 = b.contexts[seq] - n_new + q_begin;
  const int n_keys = pos0 + n_rows;
  std::vector<uint16_t> q_s(am::kTileQ * kStride, 0xdead), k_s(am::kTileK * kStride, 0xdead),
      vt_s(kD * am::kVtStride, 0xdead);
  std::vector<int64_t> key_base(am::kTileK);
  const int64_t q_src = (first_row + q_begin) * b.qkv_stride() + int64_t{head} * b.head_dim;
  for (int i = 0; i < am::kTileQ * (kD / am::kChunk); ++i) {
    int r, c;
    am::chunk_place<kD>(i, &r, &c);
    for (int j = 0; j < am::kChunk; ++j)
      q_s[r * kStride + c + j] =
          r < n_rows && c < b.head_dim ? b.qkv[q_src + r * b.qkv_stride() + c + j] : 0;
  }
  HostWarp<kD> warps[am::kWarps];
  for (int w = 0; w < am::kWarps; ++w) am::start_warp<kD>(warps[w], w, pos0);
  const float scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(b.head_dim));
  const int kv_head = head / (b.n_head / b.n_kv);
  for (int k0 = 0; k0 < n_keys; k0 += am::kTileK) {
    for (int j = 0; j < am::kTileK; ++j)
      key_base[j] = k0 + j < n_keys ? b.cache_at(seq, kv_head, k0 + j) : -1;
    for (int i = 0; i < am::kTileK * (kD / am::kChunk); ++i) {
      int j, c;
      am::chunk_place<kD>(i, &j, &c);
      uint16_t kk[am::kChunk] = {}, vv[am::kChunk] = {};
      if (key_base[j] >= 0 && c < b.head_dim)
        for (int e = 0; e < am::kChunk; ++e) kk[e] = b.k[key_base[j] + c + e];
      std::copy(kk, kk + am::kChunk, k_s.begin() + j * kStride + c);
      am::chunk_place_v(i, &j, &c);
      if (key_base[j] >= 0 && c < b.head_dim)
        for (int e = 0; e < am::kChunk; ++e) vv[e] = b.v[key_base[j] + c + e];
      am::store_transposed(vt_s.data(), j, c, vv);
    }
    for (int w = 0; w < am::kWarps; ++w) {
      const int warp_last_pos = pos0 + std::min(16 * w + 15, n_rows - 1);
      if (16 * w < n_rows && k0 <= warp_last_pos)
        am::attend_tile<kD, kBf16>(warps[w], q_s.data() + 16 * w * kStride, k_s.data(),
                                   vt_s.data(), k0, n_keys, scale_log2);
    }
  }
  const int64_t out_stride = int64_t{b.n_head} * b.head_dim;
  for (int w = 0; w < am::kWarps; ++w) {
    if (16 * w >= n_rows) continue;
    const int64_t dst = (first_row + q_begin + 16 * w) * out_stride + int64_t{head} * b.head_dim;
    am::finish_warp<kD, kBf16>(warps[w], b.head_dim, [&](int r, int col, uint32_t bits) {
      if (16 * w + r >= n_rows) return;
      out[dst + r * out_stride + col] = lo16(bits);
      out[dst + r * out_stride + col + 1] = hi16(bits);
    });
    *mma_calls += warps[w].mma_calls;
  }
}

struct Result {
  double max_err = 0, max_v = 0, worst = 0;  // worst: |err| / tolerance (<= 1 passes)
  int untouched = 0, mma_calls = 0;
};

// cuda_backend_ops_gpu_test's tolerance for 16-bit outputs (cuda_backend_fixture.h's
// tolerance_act): the output's own rounding, plus 1e-4 for the float32 arithmetic.
template <bool kBf16>
double tolerance(double ref) {
  return (kBf16 ? 1.0 / 256 : 1.0 / 2048) * std::fabs(ref) + 1e-4;
}

template <int kD, bool kBf16>
Result run_and_compare(const Batch& b) {
  constexpr uint16_t kSentinel = 0x7fc1;  // a NaN in both types: any unwritten element shows
  const int n_rows = b.offsets.back();
  const int64_t out_stride = int64_t{b.n_head} * b.head_dim;
  std::vector<uint16_t> out(static_cast<size_t>(n_rows * out_stride), kSentinel);
  Result res;
  const int n_seqs = static_cast<int>(b.contexts.size());
  int max_new = 0;
  for (int s = 0; s < n_seqs; ++s) max_new = std::max(max_new, b.offsets[s + 1] - b.offsets[s]);
  for (int s = 0; s < n_seqs; ++s)
    for (int h = 0; h < b.n_head; ++h)
      for (int t = 0; t * am::kTileQ < max_new; ++t)
        run_block<kD, kBf16>(b, t, h, s, out, &res.mma_calls);
  auto f = [](uint16_t x) { return static_cast<double>(am::from_bits<kBf16>(x)); };
  for (int s = 0; s < n_seqs; ++s) {
    const int n_new = b.offsets[s + 1] - b.offsets[s];
    for (int i = 0; i < n_new; ++i) {
      const int row = b.offsets[s] + i;
      const int pos = b.contexts[s] - n_new + i;
      for (int h = 0; h < b.n_head; ++h) {
        const int kv = h / (b.n_head / b.n_kv);
        const uint16_t* q = &b.qkv[row * b.qkv_stride() + int64_t{h} * b.head_dim];
        std::vector<double> w(static_cast<size_t>(pos + 1));
        double m = -INFINITY;
        for (int p = 0; p <= pos; ++p) {
          const uint16_t* k = &b.k[b.cache_at(s, kv, p)];
          double dot = 0;
          for (int d = 0; d < b.head_dim; ++d) dot += f(q[d]) * f(k[d]);
          w[p] = dot / std::sqrt(static_cast<double>(b.head_dim));
          m = std::max(m, w[p]);
        }
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - m));
        for (int d = 0; d < b.head_dim; ++d) {
          double ref = 0;
          for (int p = 0; p <= pos; ++p) ref += w[p] * f(b.v[b.cache_at(s, kv, p) + d]);
          ref /= sum;
          const uint16_t got = out[row * out_stride + int64_t{h} * b.head_dim + d];
          if (got == kSentinel) {
            ++res.untouched;
            continue;
          }
          res.max_err = std::max(res.max_err, std::fabs(f(got) - ref));
          res.worst = std::max(res.worst, std::fabs(f(got) - ref) / tolerance<kBf16>(ref));
          res.max_v = std::max(res.max_v, std::fabs(ref));
        }
      }
    }
  }
  return res;
}

struct Case {
  int n_head, n_kv, head_dim;
  std::vector<int> news, cached;
};

// Sequences of one new row to three query tiles, prompts alone and after a cached context (a
// chunked prefill, a speculative verify), a partial last key tile, blocks of 16 keys.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {2, 2, 64, {1, 7, 64}, {0, 5, 0}},
      {2, 2, 128, {150, 3}, {0, 70}},
      {4, 2, 128, {65, 20}, {100, 0}},  // grouped-query: two query heads a KV head
      {1, 1, 80, {40}, {33}},           // 80 dims in the 128-wide kernel, zeros past 80
      {3, 3, 16, {130}, {1}},
  };
  return c;
}

template <int kD, bool kBf16>
void check(const Case& c, uint32_t seed) {
  const Batch b = make_batch<kBf16>(c.n_head, c.n_kv, c.head_dim, c.news, c.cached, seed);
  const Result r = run_and_compare<kD, kBf16>(b);
  EXPECT_EQ(r.untouched, 0) << "output elements the kernel never wrote, head_dim " << c.head_dim;
  EXPECT_GT(r.mma_calls, 0);
  EXPECT_LE(r.worst, 1.0) << "head_dim " << c.head_dim << ", max |err| " << r.max_err;
  std::printf("%s head_dim %3d: max |err| %.2e (largest |out| %.2f), worst ratio to the "
              "tolerance %.3f, %d mma\n",
              kBf16 ? "bf16" : "fp16", c.head_dim, r.max_err, r.max_v, r.worst, r.mma_calls);
}

TEST(AttentionMmaLanes, Bf16MatchesFloat64) {
  uint32_t seed = 1;
  for (const Case& c : cases()) {
    if (c.head_dim <= 64) check<64, true>(c, seed++);
    else check<128, true>(c, seed++);
  }
}

TEST(AttentionMmaLanes, Fp16MatchesFloat64) {
  uint32_t seed = 100;
  for (const Case& c : cases()) {
    if (c.head_dim <= 64) check<64, false>(c, seed++);
    else check<128, false>(c, seed++);
  }
}

// Rows beyond a sequence's own, and columns of other heads, keep what they held.
TEST(AttentionMmaLanes, WritesOnlyItsRowsAndHead) {
  const Batch b = make_batch<true>(2, 2, 64, {5}, {3}, 7);
  std::vector<uint16_t> out(static_cast<size_t>(5 * 2 * 64), 0x1234);
  int calls = 0;
  run_block<64, true>(b, 0, 1, 0, out, &calls);  // head 1 only
  for (int r = 0; r < 5; ++r)
    for (int col = 0; col < 128; ++col)
      EXPECT_EQ(out[r * 128 + col] != 0x1234, col >= 64) << "row " << r << " column " << col;
}

// Every chunk of the K and V tiles is filled exactly once by the block's threads, for both head
// sizes, and a warp's transposed V stores fall in distinct bank words pairwise (two threads a
// 32-bit word, 16 words a warp: no two threads of a warp store to one bank in different words).
TEST(AttentionMmaLanes, TileFillsCoverEveryChunkOnce) {
  for (int d : {64, 128}) {
    const int chunks = am::kTileK * (d / am::kChunk);
    std::vector<int> seen_k(static_cast<size_t>(chunks), 0), seen_v(seen_k);
    for (int i = 0; i < chunks; ++i) {
      int r, c;
      d == 64 ? am::chunk_place<64>(i, &r, &c) : am::chunk_place<128>(i, &r, &c);
      ++seen_k[r * (d / am::kChunk) + c / am::kChunk];
      am::chunk_place_v(i, &r, &c);
      ASSERT_LT(r, am::kTileK);
      ASSERT_LT(c, d);
      ++seen_v[r * (d / am::kChunk) + c / am::kChunk];
    }
    for (int i = 0; i < chunks; ++i) {
      EXPECT_EQ(seen_k[i], 1) << "K chunk " << i << ", head " << d;
      EXPECT_EQ(seen_v[i], 1) << "V chunk " << i << ", head " << d;
    }
    for (int first = 0; first < chunks; first += 32)
      for (int e = 0; e < am::kChunk; ++e) {
        std::vector<int> word_of_bank(32, -1);
        for (int lane = 0; lane < 32; ++lane) {
          int key, col;
          am::chunk_place_v(first + lane, &key, &col);
          const int word = ((col + e) * am::kVtStride + key) / 2;
          int& w = word_of_bank[word % 32];
          EXPECT_TRUE(w == -1 || w == word) << "bank conflict, head " << d << " lane " << lane;
          w = word;
        }
      }
  }
}

// The fragment loads read the tiles' padded rows without touching the padding: each element of
// a 16 x 16 A block lands in exactly one (lane, register, half), and each of a 16 x 8 B block.
TEST(AttentionMmaLanes, FragmentsCoverTheirBlocksOnce) {
  constexpr int kStride = am::row_stride(64);
  std::vector<uint16_t> tile(16 * kStride);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < kStride; ++c) tile[r * kStride + c] = static_cast<uint16_t>(r * 256 + c);
  std::vector<int> seen_a(256, 0), seen_b(128, 0);
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t a[4], b[2];
    am::load_a(tile.data(), kStride, lane, a);
    am::load_b(tile.data(), kStride, lane, b);
    for (uint32_t reg : a)
      for (uint16_t v : {lo16(reg), hi16(reg)}) {
        ASSERT_LT(v % 256, 16) << "A read past its block's 16 columns";
        ++seen_a[(v / 256) * 16 + v % 256];
      }
    for (uint32_t reg : b)
      for (uint16_t v : {lo16(reg), hi16(reg)}) {
        ASSERT_LT(v / 256, 8) << "B read past its block's 8 n-rows";
        ++seen_b[(v / 256) * 16 + v % 256];
      }
  }
  for (int i = 0; i < 256; ++i) EXPECT_EQ(seen_a[i], 1) << "A element " << i;
  for (int i = 0; i < 128; ++i) EXPECT_EQ(seen_b[i], 1) << "B element " << i;
}

}  // namespace
}  // namespace ltm
