// One warp's share of the int8 x fp16 tensor-core GEMM (int8_gemm.cu's int8_gemm_mma, for 17 to
// kMmaMaxRows rows of A): the arithmetic the kernel runs, compiled by nvcc for the device and by
// the host compiler for tests/kernels/cuda_int8_mma_lane_test.cpp, which runs the 32 lanes of a
// warp on the CPU (host_mma.h: mma.m16n8k16 emulated from PTX's fragment layouts) against a
// float64 product with the dequantized weights. So CI, without a GPU, checks which quants, scales
// and activations each lane's fragments hold, that every one is used once, the ragged ends of k,
// n and m, and which outputs a lane writes. What it cannot check is the hardware (that mma.sync
// has PTX's layout, the launch, the loads): cuda_int8_gpu_test does, on a GPU, against float64.
//
// Why: the GEMMs of a batched decode step or a verify step of 17-64 rows used to dequantize the
// whole weight into an fp16 scratch and run cuBLASLt on it: 1.06 bytes a weight read, 2 written,
// 2 read again. Here the weight is read once, as it is stored (int8_gemm.h's layout), and the
// quants go into the tensor cores as exact fp16 integers; the scales are applied in float32.
//
// The product is computed transposed, C^T [n, m] = W^T [n, k] A^T [k, m], so that the weight
// columns are the mma's M (16 a warp) and the rows of A its N (8 an n-tile, up to 8 n-tiles):
// both operands are then read along k, as they lie in memory. The mma adds over k in any order,
// so each lane's fragment slots are mapped to consecutive k: in group j (k = 32 j .. 32 j + 31,
// one scale a column) and step s (0, 1), lane 4 g + t holds
//   A (weights, rows = columns c0 + g and c0 + g + 8): slots 2t, 2t+1, 2t+8, 2t+9 = quants at
//     k = 32 j + 8 t + 4 s + (0, 1, 2, 3): bytes 4 s .. 4 s + 3 of the 8 it loads for the group;
//   B (activations, n = row 8 nt + g of A): the same slots = A[row][32 j + 8 t + 4 s + 0 .. 3].
// A group's two steps accumulate into `part` (float32, exact products of integers and fp16), and
// part times the column's scale is added to the accumulator in float32: one rounding of the
// scale per group where the dequantize-then-GEMM path rounded every q * s to fp16. A lane's
// accumulator element e of n-tile nt is C[8 nt + 2 t + (e & 1)][c0 + g + 8 (e >> 1)].
//
// Quants as fp16: a byte v (-127..127), biased to v + 128, is placed under the exponent bits of
// 1024 (0x64) by one byte permute for two values, and 1152 subtracted from both by one
// half-precision instruction: exact, where a conversion per value would cost several times more.
#pragma once

#include "kernels/cuda/int8_lane.h"

namespace ltm::kernels::cuda::int8 {

inline constexpr int kMmaCols = 16;          // weight columns a warp (the mma's M)
inline constexpr int kMmaMaxRows = 64;       // rows of A: 8 n-tiles of 8
inline constexpr int kMmaWarps = 4;          // warps a block, each its own 16 columns
inline constexpr int kMmaGroupsInFlight = 4;  // groups whose quants a lane has requested

// Bytes 2 h and 2 h + 1 of `word` (two int8 quants, the first in the low half) as two fp16
// values, exactly.
LTM_INT8_HD uint32_t quant_pair_f16(uint32_t word, int h) {
  const uint32_t bits = byte_perm(word ^ 0x80808080u, 0x64646464u, h == 0 ? 0x4140u : 0x4342u);
#if defined(__CUDA_ARCH__)
  uint32_t out;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(out) : "r"(bits), "r"(0x64806480u));  // - (1152, 1152)
  return out;
#else
  // fp16 arithmetic on the two halves: 1024 + (v + 128) - 1152 is exact.
  const auto half = [](uint32_t b) {
#if defined(__CUDACC__)
    const float v = __half2float(__ushort_as_half(static_cast<uint16_t>(b))) - 1152.0f;
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(v)));
#else
    return static_cast<uint32_t>(f32_to_f16(f16_to_f32(static_cast<uint16_t>(b)) - 1152.0f));
#endif
  };
  return half(bits & 0xffffu) | (half(bits >> 16) << 16);
#endif
}

// What a warp reads: W's quants and scales (int8_gemm.h's layout), A [m, k] fp16 (rows k apart).
struct MmaArgs {
  const int8_t* q = nullptr;
  const uint16_t* scales = nullptr;
  int64_t n = 0, k = 0;
  const uint16_t* a = nullptr;  // fp16 bits
  int64_t m = 0;
  bool a_vec = false;  // A 8-byte aligned and k % 4 == 0: four activations as one 8-byte read
};

// One lane's registers for NT n-tiles (8 NT rows of A).
template <int NT>
struct MmaLane {
  float acc[NT][4];
  float part[4];                         // one group's product for one n-tile, before the scale
  uint32_t q[kMmaGroupsInFlight][2][2];  // [slot][column g, g + 8][word: step 0, 1]
  float s[kMmaGroupsInFlight][2];        // the two columns' scales of each group
  uint32_t af[2][4];                     // the A fragments of the group in use, steps 0 and 1
};

// A's elements pk .. pk + 3 of `row` as two registers (zeros past m or k). With a_vec (k % 4 == 0)
// a quad lies wholly inside k or wholly past it: one predicated 8-byte read, no loop.
LTM_INT8_HD void act_quad(const MmaArgs& p, int64_t row, int64_t pk, uint32_t b[2]) {
  b[0] = b[1] = 0;
  const uint16_t* x = p.a + row * p.k + pk;
  if (p.a_vec) {
    if (row < p.m && pk < p.k) {
#if defined(__CUDA_ARCH__)
      const uint2 v = *reinterpret_cast<const uint2*>(x);
      b[0] = v.x;
      b[1] = v.y;
#else
      std::memcpy(b, x, 8);
#endif
    }
    return;
  }
  if (row >= p.m) return;
  uint32_t e[4];
LTM_INT8_UNROLL
  for (int i = 0; i < 4; ++i) e[i] = pk + i < p.k ? x[i] : 0u;
  b[0] = e[0] | (e[1] << 16);
  b[1] = e[2] | (e[3] << 16);
}

template <int NT, class W>
LTM_INT8_HD void mma_start(W& w) {
  w.each([](MmaLane<NT>& st, int) {
LTM_INT8_UNROLL
    for (int nt = 0; nt < NT; ++nt)
LTM_INT8_UNROLL
      for (int e = 0; e < 4; ++e) st.acc[nt][e] = 0.0f;
  });
}

// Slot u of the lane's quant registers: group j's quants and scales of the warp's columns
// c0 .. c0 + 15 (zeros past j_end or n): 8 bytes a column.
template <int NT, class W>
LTM_INT8_HD void mma_load(W& w, const MmaArgs& p, int64_t c0, int u, int64_t j, int64_t j_end) {
  const int64_t kp = padded_k(p.k), ng = groups(p.k);
  w.each([&](MmaLane<NT>& st, int lane) {
    const int g = lane >> 2, t = lane & 3;
LTM_INT8_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int64_t col = c0 + g + 8 * i;
      st.q[u][i][0] = st.q[u][i][1] = 0;
      st.s[u][i] = 0.0f;
      if (j >= j_end || col >= p.n) continue;
      const int8_t* src = p.q + col * kp + kGroup * j + 8 * t;  // 8-byte aligned
#if defined(__CUDA_ARCH__)
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      st.q[u][i][0] = v.x;
      st.q[u][i][1] = v.y;
#else
      std::memcpy(st.q[u][i], src, 8);
#endif
      st.s[u][i] = scale_float(p.scales[col * ng + j]);
    }
  });
}

// Group j (in slot u) into the accumulators: its A fragments once, then for each n-tile with a
// row below m two mma steps into `part` and part times the scales into acc.
template <int NT, class W>
LTM_INT8_HD void mma_group(W& w, const MmaArgs& p, int u, int64_t j) {
  w.each([&](MmaLane<NT>& st, int) {
LTM_INT8_UNROLL
    for (int s = 0; s < 2; ++s) {
      st.af[s][0] = quant_pair_f16(st.q[u][0][s], 0);  // column g, k slots 2t, 2t+1
      st.af[s][1] = quant_pair_f16(st.q[u][1][s], 0);  // column g + 8
      st.af[s][2] = quant_pair_f16(st.q[u][0][s], 1);  // column g, slots 2t+8, 2t+9
      st.af[s][3] = quant_pair_f16(st.q[u][1][s], 1);
    }
  });
LTM_INT8_UNROLL
  for (int nt = 0; nt < NT; ++nt) {
    if (8 * nt >= p.m) break;
    w.each([](MmaLane<NT>& st, int) {
LTM_INT8_UNROLL
      for (int e = 0; e < 4; ++e) st.part[e] = 0.0f;
    });
LTM_INT8_UNROLL
    for (int s = 0; s < 2; ++s)
      w.template mma<false>(
          [&](MmaLane<NT>& st, int, uint32_t a[4]) {
LTM_INT8_UNROLL
            for (int r = 0; r < 4; ++r) a[r] = st.af[s][r];
          },
          [&](MmaLane<NT>&, int lane, uint32_t b[2]) {
            act_quad(p, 8 * nt + (lane >> 2), kGroup * j + 8 * (lane & 3) + 4 * s, b);
          },
          [](MmaLane<NT>& st) { return st.part; });
    w.each([&](MmaLane<NT>& st, int) {
LTM_INT8_UNROLL
      for (int e = 0; e < 4; ++e)
        st.acc[nt][e] = fmaf(st.s[u][e >> 1], st.part[e], st.acc[nt][e]);
    });
  }
}

// Groups [j_begin, j_end) of the warp's columns c0 .. c0 + 15, all of A's rows, in order. The
// quants rotate through kMmaGroupsInFlight register slots: as soon as a slot's group is used, the
// group kMmaGroupsInFlight further on is requested into it, so a lane keeps that many groups'
// reads in flight while it multiplies (the same registers as loading a batch, using it, then
// loading the next, without the wait for each batch).
template <int NT, class W>
LTM_INT8_HD void mma_columns(W& w, const MmaArgs& p, int64_t c0, int64_t j_begin, int64_t j_end) {
  mma_start<NT>(w);
LTM_INT8_UNROLL
  for (int u = 0; u < kMmaGroupsInFlight; ++u) mma_load<NT>(w, p, c0, u, j_begin + u, j_end);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kMmaGroupsInFlight) {
LTM_INT8_UNROLL
    for (int u = 0; u < kMmaGroupsInFlight; ++u) {
      const int64_t j = j0 + u;
      if (j >= j_end) break;
      mma_group<NT>(w, p, u, j);
      mma_load<NT>(w, p, c0, u, j + kMmaGroupsInFlight, j_end);
    }
  }
}

// put(row, col, sum) for each of the lane's outputs inside [m, n).
template <int NT, class W, class Put>
LTM_INT8_HD void mma_finish(W& w, const MmaArgs& p, int64_t c0, Put&& put) {
  w.each([&](MmaLane<NT>& st, int lane) {
    const int g = lane >> 2, t = lane & 3;
LTM_INT8_UNROLL
    for (int nt = 0; nt < NT; ++nt)
LTM_INT8_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int64_t row = 8 * nt + 2 * t + (e & 1), col = c0 + g + 8 * (e >> 1);
        if (row < p.m && col < p.n) put(row, col, st.acc[nt][e]);
      }
  });
}

// Splits of k (each whole groups, at least 4 of them, at most 16 splits) that give about
// `blocks_wanted` blocks of kMmaWarps warps for n columns, and the groups each split takes.
struct MmaSplit {
  int64_t splits = 1, groups_per_split = 1;
};
LTM_INT8_HD MmaSplit mma_split(int64_t n, int64_t k, int64_t blocks_wanted, int64_t force = 0) {
  const int64_t ng = groups(k);
  const int64_t blocks = ((n + kMmaCols - 1) / kMmaCols + kMmaWarps - 1) / kMmaWarps;
  int64_t s = force > 0 ? force : (blocks_wanted + blocks - 1) / blocks;
  if (force <= 0) s = s > ng / 4 ? ng / 4 : s;
  if (force <= 0 && s > 16) s = 16;
  if (s > ng) s = ng;
  if (s < 1) s = 1;
  MmaSplit r;
  r.groups_per_split = (ng + s - 1) / s;
  r.splits = ng == 0 ? 1 : (ng + r.groups_per_split - 1) / r.groups_per_split;  // none empty
  return r;
}

}  // namespace ltm::kernels::cuda::int8
