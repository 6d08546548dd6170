// One warp's share of the tensor-core prefill attention (attention_prefill_mma.cu): the arithmetic
// the kernel runs, compiled by nvcc for the device and by the host compiler for
// tests/kernels/cuda_attention_mma_lane_test.cpp, which runs the 32 lanes of each warp on the CPU
// (HostWarp there: the matrix product and the lane shuffles emulated from PTX's documented
// fragment layouts) against a float64 attention. So CI, without a GPU, checks the index
// arithmetic: which Q, K and V elements each lane's fragments hold, the causal mask, the online
// softmax and its rescaling, the shared-memory tiles (V transposed) and which output elements a
// lane writes. What it cannot check is the hardware itself (that mma.sync has the layout PTX
// documents, the launch, the block's synchronisation): cuda_backend_ops_gpu_test does, on a GPU,
// against the CPU backend.
//
// A block of kWarps warps owns kTileQ = 16 kWarps query rows of one (sequence, head); warp w its
// rows 16 w .. 16 w + 15. Keys stream through shared memory kTileK at a time. Per key tile, each
// warp: S = Q K^T with mma.m16n8k16 (16-bit inputs, float32 accumulators: 8 n-tiles of 8 keys,
// head_dim / 16 k-steps), scaled and causally masked in float32; the online softmax per row (a
// row's 16 values in a lane, then the 4 lanes that share the row: a quad); O += P V with P's
// accumulator fragments reused as A fragments (their layouts coincide) and V^T read from a
// transposed tile. P is split into two 16-bit parts, hi = round(P) and lo = round(P - hi), and
// multiplied as two products: P then keeps ~16 significant bits instead of 8 (bf16) or 11 (fp16),
// so the kernel meets the float32 kernel's tolerance (the output's own rounding, plus 1e-4) where
// rounding P once would not near outputs that cancel to ~0; it costs half as much tensor-core
// work again (128 dims: 64 mma for S and 2 x 64 for P V a warp and key tile, against 64 + 64).
//
// mma.m16n8k16 fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane = 4 g + t:
//   A (16 x 16, row major): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9],
//                           a3 = A[g+8][2t+8, 2t+9] (two 16-bit values a register, lower first)
//   B (16 x 8, k x n):      b0 = B[2t, 2t+1][g],  b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8, float):   c0, c1 = C[g][2t, 2t+1],  c2, c3 = C[g+8][2t, 2t+1]
// So a lane holds two rows of the warp's 16 (g and g + 8), and an n-tile of S gives it columns
// 2t, 2t+1: with two n-tiles side by side exactly an A fragment of P.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/mma_16816.h"
#define LTM_MMA_HD __host__ __device__ __forceinline__
#define LTM_MMA_UNROLL _Pragma("unroll")
#else
#include "runtime/model/dtype.h"
#define LTM_MMA_HD inline
#define LTM_MMA_UNROLL
#endif

namespace ltm::kernels::cuda::mma {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kTileQ = 16 * kWarps;  // query rows of a block
inline constexpr int kTileK = 64;           // keys of a shared-memory tile
inline constexpr int kNTiles = kTileK / 8;  // n-tiles of S a tile
inline constexpr int kPad = 8;              // 16-bit elements after each shared row
inline constexpr int kChunk = 8;            // 16-bit elements a 16-byte global read moves
inline constexpr int kVtStride = kTileK + kPad;  // V^T tile: [kD][kVtStride]

// Shared row stride of the Q and K tiles ([rows][kD + kPad]): rows of (kD + 8) / 2 words, 4 more
// than a multiple of 32, so the fragment reads of a warp (rows g, words t) hit 32 distinct banks;
// the same holds for V^T's 36-word rows. Rows start on 16-byte boundaries (kD % 16 == 0).
LTM_MMA_HD constexpr int row_stride(int kD) { return kD + kPad; }

// Shared memory of a block: the Q, K and V^T tiles, then kTileK 64-bit key offsets.
LTM_MMA_HD constexpr int smem_bytes(int kD) {
  return (kTileQ * row_stride(kD) + kTileK * row_stride(kD) + kD * kVtStride) * 2 +
         kTileK * 8;
}

// 16-bit values of the tile's type (bf16 when kBf16, else fp16) as bits.
template <bool kBf16>
LTM_MMA_HD uint16_t to_bits(float f) {
#if defined(__CUDACC__)
  if constexpr (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  else return __half_as_ushort(__float2half_rn(f));
#else
  if constexpr (kBf16) return f32_to_bf16(f);
  else return f32_to_f16(f);
#endif
}

template <bool kBf16>
LTM_MMA_HD float from_bits(uint16_t b) {
#if defined(__CUDACC__)
  if constexpr (kBf16) return __bfloat162float(__ushort_as_bfloat16(b));
  else return __half2float(__ushort_as_half(b));
#else
  if constexpr (kBf16) return bf16_to_f32(b);
  else return f16_to_f32(b);
#endif
}

LTM_MMA_HD uint32_t pack(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// Two consecutive 16-bit elements (the first at an even index) as one register.
LTM_MMA_HD uint32_t load_pair(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

// 2^x: on the device one MUFU.EX2 (ex2.approx: ~2 ulp, -inf -> 0, subnormal results flushed),
// where exp2f without --use_fast_math is a longer sequence; 34 of them a lane a key tile.
LTM_MMA_HD float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

LTM_MMA_HD float max_f(float a, float b) { return a > b ? a : b; }

// A fragment of the 16 x 16 block at `tile` (row major, `stride` elements a row).
LTM_MMA_HD void load_a(const uint16_t* tile, int stride, int lane, uint32_t a[4]) {
  const int g = lane >> 2, t = lane & 3;
  a[0] = load_pair(tile + g * stride + 2 * t);
  a[1] = load_pair(tile + (g + 8) * stride + 2 * t);
  a[2] = load_pair(tile + g * stride + 2 * t + 8);
  a[3] = load_pair(tile + (g + 8) * stride + 2 * t + 8);
}

// B fragment of a 16 (k) x 8 (n) block held n-major: element (k, n) at tile[n * stride + k]. K
// tiles ([key][dim]: n = key, k = dim) and V^T tiles ([dim][key]: n = dim, k = key) are.
LTM_MMA_HD void load_b(const uint16_t* tile, int stride, int lane, uint32_t b[2]) {
  const int g = lane >> 2, t = lane & 3;
  b[0] = load_pair(tile + g * stride + 2 * t);
  b[1] = load_pair(tile + g * stride + 2 * t + 8);
}

// D = A B + C on the tensor cores (the device only; HostWarp emulates it): mma_16816.h's.
#if defined(__CUDACC__)
using ltm::kernels::cuda::mma_16816;
#endif

// One lane's registers: its two rows (g and g + 8 of the warp's 16).
template <int kD>
struct Lane {
  float s[kNTiles][4];     // S of the current key tile, then P
  uint32_t p_hi[4];        // A fragments of P's two 16-bit parts, for one k-step of P V
  uint32_t p_lo[4];
  float o[kD / 8][4];      // the output accumulator, 8 dims an n-tile
  float m[2];              // running max of the row's scaled scores (log2 units)
  float l[2];              // running sum of its weights
  float red[2];            // what the quad reduces (max, then sum)
  int pos[2];              // positions of the two rows in the sequence
};

// Where a row's lane state starts: positions from pos0 (the block's row 0), no keys seen.
template <int kD, class W>
LTM_MMA_HD void start_warp(W& w, int warp, int pos0) {
  w.each([&](Lane<kD>& st, int lane) {
    const int g = lane >> 2;
    LTM_MMA_UNROLL
    for (int nd = 0; nd < kD / 8; ++nd)
      LTM_MMA_UNROLL
      for (int e = 0; e < 4; ++e) st.o[nd][e] = 0.0f;
    LTM_MMA_UNROLL
    for (int i = 0; i < 2; ++i) {
      st.m[i] = -INFINITY;
      st.l[i] = 0.0f;
      st.pos[i] = pos0 + 16 * warp + g + 8 * i;
    }
  });
}

// One key tile (keys k0 .. k0 + kTileK - 1 in k_tile and vt_tile; those >= n_keys are zeros) for
// one warp, whose 16 query rows start at q_rows (in the Q tile: A fragments are read from shared
// memory at each tile rather than held, 32 registers fewer a lane for 128 dims). scale_log2 =
// log2(e) / sqrt(head_dim): scores in log2 units, so exp2 gives the weight.
template <int kD, bool kBf16, class W>
LTM_MMA_HD void attend_tile(W& w, const uint16_t* q_rows, const uint16_t* k_tile,
                            const uint16_t* vt_tile, int k0, int n_keys, float scale_log2) {
  constexpr int kStride = row_stride(kD);
  w.each([&](Lane<kD>& st, int) {
    LTM_MMA_UNROLL
    for (int nt = 0; nt < kNTiles; ++nt)
      LTM_MMA_UNROLL
      for (int e = 0; e < 4; ++e) st.s[nt][e] = 0.0f;
  });
  // S = Q K^T: n-tile nt is keys 8 nt .. 8 nt + 7 (rows of the K tile), k-step ks dims 16 ks ...
  LTM_MMA_UNROLL
  for (int nt = 0; nt < kNTiles; ++nt)
    LTM_MMA_UNROLL
    for (int ks = 0; ks < kD / 16; ++ks)
      w.template mma<kBf16>(
          [&](Lane<kD>&, int lane, uint32_t a[4]) {
            load_a(q_rows + 16 * ks, kStride, lane, a);
          },
          [&](Lane<kD>&, int lane, uint32_t b[2]) {
            load_b(k_tile + (8 * nt) * kStride + 16 * ks, kStride, lane, b);
          },
          [&](Lane<kD>& st) { return st.s[nt]; });
  // Scale, causal mask, and each row's maximum over this lane's 16 values.
  w.each([&](Lane<kD>& st, int lane) {
    const int t = lane & 3;
    st.red[0] = st.red[1] = -INFINITY;
    LTM_MMA_UNROLL
    for (int nt = 0; nt < kNTiles; ++nt)
      LTM_MMA_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;  // c0, c1: row g; c2, c3: row g + 8
        const int key = k0 + 8 * nt + 2 * t + (e & 1);
        const float v = key > st.pos[i] || key >= n_keys ? -INFINITY : st.s[nt][e] * scale_log2;
        st.s[nt][e] = v;
        st.red[i] = max_f(st.red[i], v);
      }
  });
  w.quad_max();
  // New maxima, the weights (float32 here; split in two 16-bit parts for P V below), and the old
  // sums and outputs rescaled.
  w.each([&](Lane<kD>& st, int) {
    float alpha[2];
    LTM_MMA_UNROLL
    for (int i = 0; i < 2; ++i) {
      const float m_new = max_f(st.m[i], st.red[i]);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: weights 0
      alpha[i] = fast_exp2(st.m[i] - m_ref);
      st.m[i] = m_new;
      st.red[i] = 0.0f;
    }
    LTM_MMA_UNROLL
    for (int nt = 0; nt < kNTiles; ++nt)
      LTM_MMA_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        const float m_ref = st.m[i] == -INFINITY ? 0.0f : st.m[i];
        const float p = fast_exp2(st.s[nt][e] - m_ref);
        st.s[nt][e] = p;
        st.red[i] += p;
      }
    LTM_MMA_UNROLL
    for (int i = 0; i < 2; ++i) st.l[i] *= alpha[i];
    LTM_MMA_UNROLL
    for (int nd = 0; nd < kD / 8; ++nd)
      LTM_MMA_UNROLL
      for (int e = 0; e < 4; ++e) st.o[nd][e] *= alpha[e >> 1];
  });
  w.quad_sum();
  w.each([&](Lane<kD>& st, int) {
    LTM_MMA_UNROLL
    for (int i = 0; i < 2; ++i) st.l[i] += st.red[i];
  });
  // O += P V: k-step ks is keys 16 ks .. 16 ks + 15 (n-tiles 2 ks and 2 ks + 1 of P), n-tile nd
  // dims 8 nd .. 8 nd + 7 (rows of the V^T tile); P's high part, then its low part.
  LTM_MMA_UNROLL
  for (int ks = 0; ks < kTileK / 16; ++ks) {
    w.each([&](Lane<kD>& st, int) {
      const float p[4][2] = {{st.s[2 * ks][0], st.s[2 * ks][1]},
                             {st.s[2 * ks][2], st.s[2 * ks][3]},
                             {st.s[2 * ks + 1][0], st.s[2 * ks + 1][1]},
                             {st.s[2 * ks + 1][2], st.s[2 * ks + 1][3]}};
      LTM_MMA_UNROLL
      for (int r = 0; r < 4; ++r) {
        uint16_t hi[2], lo[2];
        LTM_MMA_UNROLL
        for (int j = 0; j < 2; ++j) {
          hi[j] = to_bits<kBf16>(p[r][j]);
          lo[j] = to_bits<kBf16>(p[r][j] - from_bits<kBf16>(hi[j]));
        }
        st.p_hi[r] = pack(hi[0], hi[1]);
        st.p_lo[r] = pack(lo[0], lo[1]);
      }
    });
    LTM_MMA_UNROLL
    for (int part = 0; part < 2; ++part)
      LTM_MMA_UNROLL
      for (int nd = 0; nd < kD / 8; ++nd)
        w.template mma<kBf16>(
            [&](Lane<kD>& st, int, uint32_t a[4]) {
              LTM_MMA_UNROLL
              for (int r = 0; r < 4; ++r) a[r] = part == 0 ? st.p_hi[r] : st.p_lo[r];
            },
            [&](Lane<kD>&, int lane, uint32_t b[2]) {
              load_b(vt_tile + (8 * nd) * kVtStride + 16 * ks, kVtStride, lane, b);
            },
            [&](Lane<kD>& st) { return st.o[nd]; });
  }
}

// The lane's finished outputs: `put(row, col, bits)` for its rows (warp-relative 0..15) and each
// pair of columns below head_dim, two 16-bit values in one register (column col first).
template <int kD, bool kBf16, class W, class Put>
LTM_MMA_HD void finish_warp(W& w, int head_dim, Put&& put) {
  w.each([&](Lane<kD>& st, int lane) {
    const int g = lane >> 2, t = lane & 3;
    LTM_MMA_UNROLL
    for (int i = 0; i < 2; ++i) {
      const float inv_l = st.l[i] > 0.0f ? 1.0f / st.l[i] : 0.0f;
      LTM_MMA_UNROLL
      for (int nd = 0; nd < kD / 8; ++nd) {
        const int col = 8 * nd + 2 * t;
        if (col >= head_dim) continue;
        put(g + 8 * i, col,
            pack(to_bits<kBf16>(st.o[nd][2 * i] * inv_l),
                 to_bits<kBf16>(st.o[nd][2 * i + 1] * inv_l)));
      }
    }
  });
}

// A thread's share of filling the tiles: 16-byte chunk `i` (of rows x kD / kChunk) of a row-major
// tile (Q, K: consecutive threads take consecutive chunks of a row, so a quarter-warp's 16-byte
// stores fill distinct banks).
template <int kD>
LTM_MMA_HD void chunk_place(int i, int* row, int* col) {
  *row = i / (kD / kChunk);
  *col = (i % (kD / kChunk)) * kChunk;
}

// The same for V, key-major: consecutive threads take the same columns of consecutive keys, so
// that their transposed stores (below) go to consecutive elements of one V^T row, two threads a
// bank word, instead of one bank for the whole row of chunks.
LTM_MMA_HD void chunk_place_v(int i, int* key, int* col) {
  *key = i % kTileK;
  *col = (i / kTileK) * kChunk;
}

// A V chunk (key's elements col .. col + 7, zeros past the keys or the head) into V^T.
LTM_MMA_HD void store_transposed(uint16_t* vt_tile, int key, int col, const uint16_t src[kChunk]) {
  LTM_MMA_UNROLL
  for (int j = 0; j < kChunk; ++j) vt_tile[(col + j) * kVtStride + key] = src[j];
}

}  // namespace ltm::kernels::cuda::mma
