// packed_gemm for bf16 panels with AVX512-BF16's dot product (vdpbf16ps): prefill-sized GEMMs on
// CPUs that have AVX512-BF16 but no AMX (AMD Zen 4 and 5, Intel Cooper Lake). Target flags:
// kernels/CMakeLists.txt. Include only isa_kernels.h and intrinsics here (see isa_kernels.h).
//
// As on AMX, A (fp32 activations) is rounded to bf16 by the caller (round_rows_bf16), as oneDNN
// and llama.cpp do for bf16 weights; products of two bf16 values are exact in fp32 and the sums
// are fp32. A bf16 panel is packed in pairs of rows (packed_gemm.h): one 64-byte vector of a pair
// row is 16 columns x (row 2q, row 2q + 1), which is what vdpbf16ps multiplies by a broadcast
// pair (A[r, 2q], A[r, 2q + 1]), so the panel is read as it is stored, twice the elements per
// instruction of the fp32 FMA kernel.
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX512BF16__) && defined(__AVX512BW__))
#error "packed_gemm_avx512bf16.cpp needs -mavx512bf16 -mavx512bw (kernels/CMakeLists.txt)"
#endif

// GCC 12 false positive inside AVX-512 intrinsics (_mm256_undefined_pd, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu::avx512::bf16dot {
namespace {

constexpr int64_t kWidth = 64;   // kPanelWidth
constexpr int64_t kPair = 2 * kWidth;  // elements of a pair row
constexpr int kMaxRows = 6;      // rows of A per register tile: 6 x 4 accumulators
// Pair rows of a panel per pass over the rows of A: 64 x 256 bytes = 16 KiB, kept in L1 while
// every row group of the block multiplies it.
constexpr int64_t kChunk = 64;

inline int64_t min_i(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace
}  // namespace ltm::kernels::cpu::avx512::bf16dot

#define LTM_ISA_NS avx512::bf16dot
#define LTM_PANEL_WALK_ONLY
#include "kernels/cpu/panel_loops.inc"

namespace ltm::kernels::cpu::avx512::bf16dot {
namespace {

template <int R>
inline void tile(const uint16_t* a16, int64_t kpad, const uint16_t* panel, int64_t q0,
                 int64_t q1, float* c, int64_t ldc, float beta, const __mmask16* mk) {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t q = q0; q < q1; ++q) {
    const uint16_t* bq = panel + q * kPair;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bq);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bq + 32);
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(bq + 64);
    const __m512bh b3 = (__m512bh)_mm512_loadu_si512(bq + 96);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a16 + r * kpad + 2 * q, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, b3);
    }
  }
  const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      __m512 out = acc[r][v];
      if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk[v], cr + 16 * v), out);
      _mm512_mask_storeu_ps(cr + 16 * v, mk[v], out);
    }
  }
}

}  // namespace

void round_rows_bf16(const float* a, int64_t m, int64_t k, int64_t kpad, uint16_t* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* src = a + r * k;
    uint16_t* dst = out + r * kpad;
    int64_t p = 0;
    for (; p + 32 <= k; p += 32) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + p + 16), _mm512_loadu_ps(src + p));
      _mm512_storeu_si512(dst + p, (__m512i)v);
    }
    if (p < k) {
      const int64_t n = k - p;
      const __mmask16 lo = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
      const __mmask16 hi = n > 16 ? __mmask16((1u << (n - 16)) - 1) : __mmask16(0);
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, src + p + 16),
                                            _mm512_maskz_loadu_ps(lo, src + p));
      _mm512_storeu_si512(dst + p, (__m512i)v);  // zeros past k (masked loads)
      p += 32;
    }
    for (; p < kpad; p += 32) _mm512_storeu_si512(dst + p, _mm512_setzero_si512());
  }
}

void panel_gemm_bf16(const uint16_t* a16, int64_t kpad, const uint16_t* panel, float* c,
                     int64_t ldc, int64_t m, int64_t k, int64_t cols, float beta) {
  __mmask16 mk[4];
  for (int v = 0; v < 4; ++v) {
    const int64_t left = cols - 16 * v;
    const int64_t n = left < 0 ? 0 : (left > 16 ? 16 : left);
    mk[v] = static_cast<__mmask16>((1u << n) - 1u);
  }
  // A16's zeros past k meet the panel's zero pad row when k is odd, so whole pairs are exact.
  // panel_loops.inc's walk, in pair rows: chunks of kChunk, groups of kMaxRows rows.
  walk_chunks(m, (k + 1) / 2, kChunk, beta, [](int64_t, int64_t) {}, [&]<int R>(const Group& g) {
    tile<R>(a16 + g.row * kpad, kpad, panel, g.p0, g.p0 + g.kc, c + g.row * ldc, ldc, g.beta, mk);
  });
}

}  // namespace ltm::kernels::cpu::avx512::bf16dot

#endif
