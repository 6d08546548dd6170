// One warp lane's share of the int8 weight-streaming GEMM (int8_gemm.cu): the arithmetic the
// kernel runs, compiled by nvcc for the device and by the host compiler for
// tests/kernels/int8_lane_emulated_test.cpp, which runs the 32 lanes of a warp on the CPU against
// a dequantizing reference. So CI, without a GPU, checks the layout arithmetic (which bytes and
// which scale each lane reads, the ragged end of k, the byte unpacking); what it cannot check is
// the launch, the memory system and the warp reduction, which cuda_int8_gpu_test does on a GPU.
//
// Layout (int8_gemm.h): a column's quants are kp = ceil(k / 32) * 32 consecutive int8 (zero past
// k), its scales ceil(k / 32) fp16. A warp walks one column: lane l reads 16 bytes at
// p = 512 i + 16 l (i = 0, 1, ...), half of group p / 32, multiplies them with the 16 activations
// at p of each row of A, and adds scale * that sum to the row's accumulator. The warp's 32 partial
// sums are then added (warp_sum) by the kernel.
//
// Unpacking: a byte v (-127..127) becomes the float 2^23 + (v + 128) by placing v ^ 0x80 under the
// exponent bits of 2^23 (one byte permute), then 2^23 + 128 is subtracted: exact, and two cheap
// ALU operations where a conversion instruction (I2F) runs at a quarter of their rate or less.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define LTM_INT8_HD __host__ __device__ __forceinline__
#define LTM_INT8_UNROLL _Pragma("unroll")
#else
#include "runtime/model/dtype.h"
#define LTM_INT8_HD inline
#define LTM_INT8_UNROLL _Pragma("GCC unroll 16")
#endif

namespace ltm::kernels::cuda::int8 {

inline constexpr int kLaneBytes = 16;          // quants a lane reads at a time
inline constexpr int kWarpBytes = 32 * kLaneBytes;  // a warp's step along k
inline constexpr int kGroup = 32;              // quants per scale
inline constexpr int kMaxRows = 16;            // rows of A the kernel holds accumulators for

LTM_INT8_HD int64_t padded_k(int64_t k) { return (k + kGroup - 1) / kGroup * kGroup; }
LTM_INT8_HD int64_t groups(int64_t k) { return (k + kGroup - 1) / kGroup; }

// __byte_perm on the device; the same selection on the host: result byte j is byte (s >> 4 j) & 7
// of the 8 bytes y:x (x bytes 0..3).
LTM_INT8_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t both = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t out = 0;
  for (int j = 0; j < 4; ++j)
    out |= static_cast<uint32_t>((both >> (8 * ((s >> (4 * j)) & 7u))) & 0xffu) << (8 * j);
  return out;
#endif
}

LTM_INT8_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

LTM_INT8_HD float scale_float(uint16_t h) {
#if defined(__CUDACC__)
  __half_raw raw;
  raw.x = h;
  return __half2float(__half(raw));
#else
  return f16_to_f32(h);
#endif
}

// The 4 signed bytes of `word` (byte 0 first) as floats, exactly.
LTM_INT8_HD void unpack4(uint32_t word, float* out) {
  const uint32_t biased = word ^ 0x80808080u;  // v + 128, as unsigned bytes
  constexpr float kBias = 8388608.0f + 128.0f;  // 2^23 + 128
LTM_INT8_UNROLL
  for (uint32_t j = 0; j < 4; ++j)
    out[j] = bits_float(byte_perm(biased, 0x4B000000u, 0x7540u + j)) - kBias;
}

// Activations as float: fp32, and on the device bf16 and fp16.
LTM_INT8_HD float act_float(float x) { return x; }
#if defined(__CUDACC__)
LTM_INT8_HD float act_float(__half x) { return __half2float(x); }
LTM_INT8_HD float act_float(__nv_bfloat16 x) { return __bfloat162float(x); }
#endif

// 16 activations at x as floats. kVec (on the device): x is 16-byte aligned, read as 16-byte
// words (4 for fp32, 2 for 16-bit types) instead of 16 element loads.
template <bool kVec, typename TA>
LTM_INT8_HD void load16(const TA* x, float (&out)[kLaneBytes]) {
#if defined(__CUDA_ARCH__)
  if constexpr (kVec) {
    constexpr int kPerWord = 16 / sizeof(TA);
LTM_INT8_UNROLL
    for (int v = 0; v < kLaneBytes / kPerWord; ++v) {
      const uint4 raw = reinterpret_cast<const uint4*>(x)[v];
      const TA* e = reinterpret_cast<const TA*>(&raw);
LTM_INT8_UNROLL
      for (int i = 0; i < kPerWord; ++i) out[v * kPerWord + i] = act_float(e[i]);
    }
  } else
#endif
  {
LTM_INT8_UNROLL
    for (int i = 0; i < kLaneBytes; ++i) out[i] = act_float(x[i]);
  }
}

// 16 quants at q as 4 little-endian words.
LTM_INT8_HD void load_words(const int8_t* q, uint32_t (&words)[4]) {
#if defined(__CUDA_ARCH__)
  const uint4 raw = *reinterpret_cast<const uint4*>(q);  // 16-byte aligned (int8_gemm.h)
  words[0] = raw.x;
  words[1] = raw.y;
  words[2] = raw.z;
  words[3] = raw.w;
#else
  std::memcpy(words, q, sizeof words);  // little-endian, as the GPU
#endif
}

// One lane's 16 quants at p (words, under the scale bits sh) against rows r < min(m, MT) of A.
template <int MT, bool kVec, typename TA>
LTM_INT8_HD void lane_step(const uint32_t (&words)[4], uint16_t sh, const TA* a, int64_t lda,
                           int64_t m, int64_t k, int64_t p, float (&acc)[MT]) {
  float w[kLaneBytes];
LTM_INT8_UNROLL
  for (int j = 0; j < 4; ++j) unpack4(words[j], w + 4 * j);
  const float s = scale_float(sh);
  // Activations [p, p + valid) exist; valid <= 0 for a lane wholly in the padding past k (its
  // quants are zero and it adds nothing).
  const int64_t valid = k - p < kLaneBytes ? k - p : kLaneBytes;
LTM_INT8_UNROLL
  for (int r = 0; r < MT; ++r) {
    if (r >= m) break;
    const TA* x = a + r * lda + p;
    float d = 0.0f;
    if (valid == kLaneBytes) {
      float xv[kLaneBytes];
      load16<kVec>(x, xv);
LTM_INT8_UNROLL
      for (int i = 0; i < kLaneBytes; ++i) d = fmaf(w[i], xv[i], d);
    } else {
      for (int64_t i = 0; i < valid; ++i) d = fmaf(w[i], act_float(x[i]), d);
    }
    acc[r] = fmaf(s, d, acc[r]);
  }
}

// Warp steps whose quants a lane loads before using any of them (lane_dot): decode is bound by
// how many bytes the GPU has in flight, and on the H100 (2026-12-06) two 16-byte reads a lane
// left the one-row kernel at 1.8 TB/s on weights of 4096 columns (512 blocks of 8 warps: under
// half the warps the GPU holds) and 2.2-2.3 TB/s on wider ones, of ~3 TB/s. Four for one row of A
// (46-48 -> 55-63 registers on sm_90, no spills); more rows keep two (at two rows, four spilled
// with fp32 activations; their accumulators and activations need the registers).
template <int MT>
inline constexpr int kStepsInFlight = MT == 1 ? 4 : 2;

// The lane's partial sums of rows r < min(m, MT) of A [m, k] (rows lda apart) times one column
// (q: its kp quants; sc: its scales), added to acc[r] (which the caller zeroes). kVec: A and lda
// keep every lane's 16 activations 16-byte aligned (int8_gemm.cu checks before choosing it).
// kInFlight warp steps' quants (and scales) are loaded before any is used, so that each lane has
// that many 16-byte reads in flight; the sums go in the order of p all the same, so every
// kInFlight gives the same bits (cuda_int8_lane_test checks 1, 2 and 4).
template <int MT, bool kVec, typename TA, int kInFlight = kStepsInFlight<MT>>
LTM_INT8_HD void lane_dot(const int8_t* q, const uint16_t* sc, const TA* a, int64_t lda,
                          int64_t m, int64_t k, int lane, float (&acc)[MT]) {
  static_assert(kInFlight >= 1 && kInFlight <= 8);
  const int64_t kp = padded_k(k);
  if constexpr (kInFlight == 2) {  // written out: the general loop below spilled for 16 rows
    for (int64_t p = static_cast<int64_t>(lane) * kLaneBytes; p < kp; p += 2 * kWarpBytes) {
      const int64_t p2 = p + kWarpBytes;
      const bool second = p2 < kp;
      uint32_t w0[4], w1[4] = {0, 0, 0, 0};
      load_words(q + p, w0);
      if (second) load_words(q + p2, w1);
      const uint16_t s0 = sc[p / kGroup], s1 = second ? sc[p2 / kGroup] : uint16_t{0};
      lane_step<MT, kVec>(w0, s0, a, lda, m, k, p, acc);
      if (second) lane_step<MT, kVec>(w1, s1, a, lda, m, k, p2, acc);
    }
  } else {
    for (int64_t p = static_cast<int64_t>(lane) * kLaneBytes; p < kp;
         p += kInFlight * kWarpBytes) {
      uint32_t w[kInFlight][4];
      uint16_t s[kInFlight];
LTM_INT8_UNROLL
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t pu = p + u * kWarpBytes;
        if (pu < kp) {
          load_words(q + pu, w[u]);
          s[u] = sc[pu / kGroup];
        } else {
          w[u][0] = w[u][1] = w[u][2] = w[u][3] = 0;
          s[u] = 0;
        }
      }
LTM_INT8_UNROLL
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t pu = p + u * kWarpBytes;
        if (pu < kp) lane_step<MT, kVec>(w[u], s[u], a, lda, m, k, pu, acc);
      }
    }
  }
}

}  // namespace ltm::kernels::cuda::int8
