// packed_gemm's panel kernel for AVX-512 (target flags: kernels/CMakeLists.txt). Include only
// isa_kernels.h and intrinsics here: see there why.
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX512F__) && defined(__FMA__))
#error "packed_gemm_avx512.cpp needs -mavx512f -mfma (kernels/CMakeLists.txt)"
#endif

// GCC 12 false positive inside AVX-512 intrinsics (_mm256_undefined_pd, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/isa_kernels.h"

#ifndef PG_KCHUNK
#define PG_KCHUNK 128
#endif

namespace ltm::kernels::cpu::avx512 {
namespace {

constexpr int kMaxRows = 6;        // rows of A per register tile: 6 x 4 accumulators
constexpr int64_t kPrefetch = 8;  // panel rows prefetched ahead by the first row group
constexpr int64_t kKChunk = PG_KCHUNK;  // rows of a panel per pass over the rows of A
constexpr int64_t kWidth = 64;          // kPanelWidth

inline int64_t min_i(int64_t a, int64_t b) { return a < b ? a : b; }

#ifndef PG_L2_NEXT
#define PG_L2_NEXT 1  // 0: no prefetch of the next chunk of B (next_chunk_share), for comparisons
#endif
constexpr bool kL2Next = PG_L2_NEXT != 0;
// The first group's share of the next chunk (panel_loops.inc): m = 2, 3 (a 2 or 3 x 64 tile)
// ran 0.85-0.92x with it, m = 4 0.93-1.03x, m = 5..11 1.07-1.3x (docs/benchmarks.md, "The next
// chunk in L2 for few rows").
constexpr int64_t kL2ShareFrom = 5, kL2ShareTo = 11;
constexpr int64_t kKChunk16 = kKChunk;  // 16-bit panels: rows converted per chunk

// C[R rows, 64 cols] (masked by mk[] when kMasked) = acc + beta * C: every tile's epilogue.
template <int R, bool kMasked>
inline void store_tile(const __m512 (&acc)[R][4], float* c, int64_t ldc, float beta,
                       const __mmask16* mk) {
  const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __mmask16 m = kMasked ? mk[v] : __mmask16(0xFFFF);
      __m512 out = acc[r][v];
      if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cr + 16 * v), out);
      _mm512_mask_storeu_ps(cr + 16 * v, m, out);
    }
  }
}

// C[R rows, 64 cols] (masked by mk[]) = A[R, k] @ P + beta * C for one panel P [k, 64]; l2:
// panel_loops.inc's L2Stream, its `lines` cache lines from `base` pulled into L2 evenly over the k
// steps. Spread by a running sum instead of ceil(lines / k) a step from the first (a loop with a
// multiply every step, and the prefetches bunched at the start): m = 32, k = 768, one thread,
// old and new alternating in one process, 1.06-1.07x with B in L2, 1.08-1.10x from memory.
template <int R, bool kMasked, typename L2>
inline void nt_tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                    int64_t ldc, int64_t k, float beta, const __mmask16* mk, bool prefetch,
                    const L2& l2) {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
    acc[r][2] = _mm512_setzero_ps();
    acc[r][3] = _mm512_setzero_ps();
  }
  const __mmask16 m0 = kMasked ? mk[0] : 0xFFFF, m1 = kMasked ? mk[1] : 0xFFFF;
  const __mmask16 m2 = kMasked ? mk[2] : 0xFFFF, m3 = kMasked ? mk[3] : 0xFFFF;
  const int64_t kp = prefetch && k > kPrefetch ? k - kPrefetch : 0;
  // The L2 stream spread evenly over the k steps, one prefetch whenever a running sum of
  // l2.lines passes k (so k steps issue exactly l2.lines), as the AVX2 tile does.
  int64_t l2_sum = 0;
  const char* l2_at = l2.base;
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    if (p < kp) {
      const char* pf = reinterpret_cast<const char*>(bp + kPrefetch * ldb);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      _mm_prefetch(pf + 128, _MM_HINT_T0);
      _mm_prefetch(pf + 192, _MM_HINT_T0);
    }
    if (l2.lines > 0) {
      l2_sum += l2.lines;
      while (l2_sum >= k) {
        l2_sum -= k;
        _mm_prefetch(l2_at, _MM_HINT_T1);
        l2_at += 64;
      }
    }
    __m512 b0, b1, b2, b3;
    if constexpr (kMasked) {
      b0 = _mm512_maskz_loadu_ps(m0, bp);
      b1 = _mm512_maskz_loadu_ps(m1, bp + 16);
      b2 = _mm512_maskz_loadu_ps(m2, bp + 32);
      b3 = _mm512_maskz_loadu_ps(m3, bp + 48);
    } else {
      b0 = _mm512_loadu_ps(bp);
      b1 = _mm512_loadu_ps(bp + 16);
      b2 = _mm512_loadu_ps(bp + 32);
      b3 = _mm512_loadu_ps(bp + 48);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + p]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(x, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(x, b3, acc[r][3]);
    }
  }
  store_tile<R, kMasked>(acc, c, ldc, beta, mk);
}

// The walk's row group (panel_loops.inc): one 6 x 64 tile (or fewer rows).
// Not inlined: inside the walk GCC ran short of registers for the tile's loop.
template <int R, bool kMasked, typename L2>
[[gnu::noinline]] void row_group(const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                      int64_t k, float beta, const __mmask16* mk, int64_t, bool prefetch,
                      const L2& l2) {
  nt_tile<R, kMasked>(a, lda, b, kWidth, c, ldc, k, beta, mk, prefetch, l2);
}


// ---- 16-bit panels (bf16, fp16): the same layout with 2-byte elements ----
//
// Decode (m <= kMaxRows, one row group): each panel row is converted in registers as it is read
// (bf16, pairs of rows: a shift left 16 and a mask; fp16: vcvtph2ps), so the kernel streams half
// the bytes of the fp32 one. Larger m: a chunk of kKChunk panel rows is converted once into an
// fp32 scratch (32 KB, L1) and every row group runs the fp32 tile on it, so the conversion is
// paid once per chunk, not once per row group, and the compute-bound kernel is the fp32 one.

#ifndef PG_PREFETCH16
#define PG_PREFETCH16 16
#endif
constexpr int64_t kPrefetch16 = PG_PREFETCH16;  // panel rows (128 bytes each) prefetched ahead

template <bool kF16>
inline __m512 cvt16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (kF16) {
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// As nt_tile (C stores masked by mk[]), B a 16-bit panel read whole (pad columns are zero, and
// the lanes past `cols` are never stored). k_rest: the panel's rows from b on (>= k: the prefetch
// runs on past this call's k, into the next chunk). Not inlined (nor nt_tile_pairs): inlined into
// decode16's loop over chunks, the 6-row tile ran 10-20% slower with the panel in L2 (2026-12-03).
template <int R, bool kMasked, bool kF16>
[[gnu::noinline]] void nt_tile16(const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc,
                      int64_t k, float beta, const __mmask16* mk, int64_t k_rest) {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
    acc[r][2] = _mm512_setzero_ps();
    acc[r][3] = _mm512_setzero_ps();
  }
  const int64_t kp = k_rest > kPrefetch16 ? min_i(k, k_rest - kPrefetch16) : 0;
  for (int64_t p = 0; p < k; ++p) {
    const uint16_t* bp = b + p * kWidth;
    if (p < kp) {
      const char* pf = reinterpret_cast<const char*>(bp + kPrefetch16 * kWidth);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
    }
    const __m512 b0 = cvt16<kF16>(bp), b1 = cvt16<kF16>(bp + 16);
    const __m512 b2 = cvt16<kF16>(bp + 32), b3 = cvt16<kF16>(bp + 48);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + p]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(x, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(x, b3, acc[r][3]);
    }
  }
  store_tile<R, kMasked>(acc, c, ldc, beta, mk);
}

// As nt_tile16 for a bf16 panel (pairs of rows, packed_gemm.h): each 64-byte load holds 16
// columns of rows 2q and 2q + 1; a shift and a mask make the two fp32 rows. Every accumulator
// sees rows in the same order as with one row after the other, so the results are the same.
constexpr int64_t kPrefetchPairs = kPrefetch16 / 2;  // pair rows (256 bytes each) ahead

template <int R, bool kMasked>
[[gnu::noinline]] void nt_tile_pairs(const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc,
                          int64_t k, float beta, const __mmask16* mk, int64_t k_rest) {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
    acc[r][2] = _mm512_setzero_ps();
    acc[r][3] = _mm512_setzero_ps();
  }
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = (k + 1) / 2, pairs_rest = (k_rest + 1) / 2;
  const int64_t kp = pairs_rest > kPrefetchPairs ? min_i(pairs, pairs_rest - kPrefetchPairs) : 0;
  for (int64_t q = 0; q < pairs; ++q) {
    const uint16_t* bq = b + q * 2 * kWidth;
    if (q < kp) {
      const char* pf = reinterpret_cast<const char*>(bq + kPrefetchPairs * 2 * kWidth);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      _mm_prefetch(pf + 128, _MM_HINT_T0);
      _mm_prefetch(pf + 192, _MM_HINT_T0);
    }
    const bool both = 2 * q + 1 < k;  // false only for the pad row of an odd k
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i x = _mm512_loadu_si512(bq + 32 * v);
      const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + 2 * q]), even, acc[r][v]);
      if (both) {
        const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + 2 * q + 1]), odd, acc[r][v]);
      }
    }
  }
  store_tile<R, kMasked>(acc, c, ldc, beta, mk);
}

// One register tile of up to kMaxRows rows over k rows of the panel from b (k_rest: the panel's
// rows from b on, for the prefetch).
template <bool kMasked, bool kF16>
void tile16(const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc, int64_t m,
            int64_t k, float beta, const __mmask16* mk, int64_t k_rest) {
  if constexpr (!kF16) {
    switch (m) {
      case 6: nt_tile_pairs<6, kMasked>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 5: nt_tile_pairs<5, kMasked>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 4: nt_tile_pairs<4, kMasked>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 3: nt_tile_pairs<3, kMasked>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 2: nt_tile_pairs<2, kMasked>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      default: nt_tile_pairs<1, kMasked>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
    }
  } else {
    switch (m) {
      case 6: nt_tile16<6, kMasked, kF16>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 5: nt_tile16<5, kMasked, kF16>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 4: nt_tile16<4, kMasked, kF16>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 3: nt_tile16<3, kMasked, kF16>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      case 2: nt_tile16<2, kMasked, kF16>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
      default: nt_tile16<1, kMasked, kF16>(a, lda, b, c, ldc, k, beta, mk, k_rest); break;
    }
  }
}

// panel_loops.inc's 16-bit register path (decode16 there) takes up to 12 rows (a verify step of
// speculative decoding, a small decode batch) as two tiles per chunk, 6 rows then the rest (from
// L1), instead of the scratch path, which converts each chunk once for every row group: on
// models/kjv-small's shapes with weights colder than L3 that measured 30-40% faster at 7-9 rows
// on the layer GEMMs, level on the LM head.
constexpr int64_t kRegRows16 = 2 * kMaxRows;

// Its row group: one tile over the whole panel (the masks keep C's columns past cols; prefetch
// in every group: the second's reads hit L1).
template <bool kMasked, bool kF16>
void rows16_group(int64_t rows, const float* a, int64_t lda, const uint16_t* b, float* c,
                  int64_t ldc, int64_t kc, float beta, const __mmask16* mk, int64_t /*cols*/,
                  bool /*first*/, int64_t rest) {
  tile16<kMasked, kF16>(a, lda, b, c, ldc, rows, kc, beta, mk, rest);
}

using Mask = __mmask16;
constexpr int kMasks = 4;

void column_masks(int64_t cols, __mmask16* mk) {
  for (int v = 0; v < 4; ++v) {
    const int64_t left = cols - 16 * v;
    const int64_t n = left < 0 ? 0 : (left > 16 ? 16 : left);
    mk[v] = static_cast<__mmask16>((1u << n) - 1u);
  }
}

}  // namespace

// ---- Decode (one row of A) over several panels at once ----
//
// One row of A is bandwidth-bound: each panel is one sequential stream, and one stream per core
// leaves the memory system idle part of the time. Walking S panels together (S streams, each
// prefetched ahead) measured here: 1 stream 28 GB/s, 2 streams 33, 4 streams 35-36 (2 threads,
// bf16, 250 MB of weights).
namespace {

template <int kType>  // 0: fp32, 1: bf16, 2: fp16
inline __m512 load_w(const void* base, int64_t i) {
  if constexpr (kType == 0) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m256i h =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (kType == 2) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <int S, int kType>
void gemv_s(const float* a, const void* panels, float* c, int64_t k, int64_t cols, float beta) {
  constexpr int64_t kBytes = kType == 0 ? 4 : 2;
  // Panel rows prefetched ahead per stream. fp32: 16 rows into L1. 16-bit: two rows (one bf16
  // pair row) with prefetchnta, just ahead of the loads, the streams left to the hardware
  // prefetchers; on an AMD EPYC Zen 4 that measured 1.13-1.18x in bf16 decode and 1.27x in fp16
  // against 16 rows into L1, and 0.94x for fp32 (docs/benchmarks.md, "Short non-temporal
  // prefetch and paired panels in the decode gemvs").
  constexpr int64_t kAhead = kType == 0 ? 16 : 2;
  constexpr auto kHint = kType == 0 ? _MM_HINT_T0 : _MM_HINT_NTA;  // enum (GCC) or int (clang)
  const char* base = static_cast<const char*>(panels);
  const int64_t panel_bytes = (kType == 1 ? (k + 1) / 2 * 2 : k) * kWidth * kBytes;
  __m512 acc[S][4];
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s)
    for (int v = 0; v < 4; ++v) acc[s][v] = _mm512_setzero_ps();
  // C = acc + cb * C (cb = 0: C = acc), and the accumulators start again from zero.
  const auto flush = [&](float cb) {
    const __m512 vb = _mm512_set1_ps(cb);
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
      for (int v = 0; v < 4; ++v) {
        const int64_t c0 = s * kWidth + 16 * v;
        const int64_t left = cols - c0;
        if (left <= 0) break;
        const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
        __m512 out = acc[s][v];
        if (cb != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, c + c0), out);
        _mm512_mask_storeu_ps(c + c0, m, out);
        acc[s][v] = _mm512_setzero_ps();
      }
  };
  if constexpr (kType == 1) {  // bf16: pairs of rows (packed_gemm.h), as nt_tile_pairs
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    constexpr int64_t kPairBytes = 2 * kWidth * 2;
    const int64_t pairs = (k + 1) / 2;
    for (int64_t q = 0; q < pairs; ++q) {
      if (q > 0 && 2 * q % kKChunk == 0) flush(2 * q == kKChunk ? beta : 1.0f);
      const bool both = 2 * q + 1 < k;
      const __m512 x0 = _mm512_set1_ps(a[2 * q]);
      const __m512 x1 = _mm512_set1_ps(both ? a[2 * q + 1] : 0.0f);
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        const char* row = base + s * panel_bytes + q * kPairBytes;
        if (q + kAhead / 2 < pairs) {
#pragma GCC unroll 4
          for (int64_t line = 0; line < kPairBytes; line += 64)
            _mm_prefetch(row + kAhead / 2 * kPairBytes + line, kHint);
        }
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const __m512i x = _mm512_loadu_si512(row + 64 * v);
          acc[s][v] = _mm512_fmadd_ps(x0, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), acc[s][v]);
          if (both)
            acc[s][v] = _mm512_fmadd_ps(x1, _mm512_castsi512_ps(_mm512_and_si512(x, hi)), acc[s][v]);
        }
      }
    }
  }
  // By the row tiles' chunks of kKChunk rows (bf16 above likewise), each summed from zero and
  // added into C (the call's beta for the first, 1 after), so that a decode row has the bits of
  // the same row in a larger step (the 16-bit decode tiles and the chunked path sum the same way).
  const int64_t k_end = kType == 1 ? 0 : k;
  constexpr int64_t chunk = kKChunk;
  for (int64_t p0 = 0; p0 < k_end; p0 += chunk) {
    if (p0 > 0) flush(p0 == chunk ? beta : 1.0f);
    const int64_t p1 = p0 + chunk < k_end ? p0 + chunk : k_end;
    for (int64_t p = p0; p < p1; ++p) {
      const __m512 x = _mm512_set1_ps(a[p]);
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        const char* row = base + s * panel_bytes + p * kWidth * kBytes;
        if (p + kAhead < k) {
#pragma GCC unroll 4
          for (int64_t line = 0; line < kWidth * kBytes; line += 64)
            _mm_prefetch(row + kAhead * kWidth * kBytes + line, kHint);
        }
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v)
          acc[s][v] = _mm512_fmadd_ps(x, load_w<kType>(row, 16 * v), acc[s][v]);
      }
    }
  }
  flush(k > kKChunk ? 1.0f : beta);
}

template <int kType>
void gemv_any(const float* a, const void* panels, float* c, int64_t k, int64_t cols, float beta) {
  switch ((cols + kWidth - 1) / kWidth) {
    case 4: gemv_s<4, kType>(a, panels, c, k, cols, beta); break;
    case 3: gemv_s<3, kType>(a, panels, c, k, cols, beta); break;
    case 2: gemv_s<2, kType>(a, panels, c, k, cols, beta); break;
    default: gemv_s<1, kType>(a, panels, c, k, cols, beta); break;
  }
}

}  // namespace

void gemv_panels(const float* a, const void* panels, int type, float* c, int64_t k, int64_t cols,
                 float beta) {
  if (type == 1) gemv_any<1>(a, panels, c, k, cols, beta);
  else if (type == 2) gemv_any<2>(a, panels, c, k, cols, beta);
  else gemv_any<0>(a, panels, c, k, cols, beta);
}

}  // namespace ltm::kernels::cpu::avx512

#define LTM_ISA_NS avx512
#include "kernels/cpu/panel_loops.inc"
#endif
