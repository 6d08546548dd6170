// packed_gemm's panel kernel for AVX2 + FMA (AMD Zen 3 and other CPUs without AVX-512; target
// flags: kernels/CMakeLists.txt). Include only isa_kernels.h and intrinsics here: see there why.
//
// 16 ymm registers: a 64-column panel row is 8 of them, so only one row of A fits as a full-width
// tile (8 accumulators, B read straight into the FMAs). Several rows are register-blocked on
// narrower strips of the panel instead: 6 rows x 16 columns (12 accumulators, 2 B registers, one
// broadcast: the classic AVX2 shape, FMA-bound), 2 rows x 32 columns, 3-5 rows x 16 columns.
// Every tile has at least 6 independent accumulators, enough to hide the FMA latency (4 cycles,
// 2 ports). As in the AVX-512 kernel, B is walked in chunks of kKChunk rows that stay in L1 while
// all the row groups of A use them, and the first row group prefetches the chunk from memory:
// the walk and the entry points are panel_loops.inc's, included at the end. 16-bit panels of up
// to 12 rows of A are converted in registers by tiles of their own (3 x 32, 4 x 24, 5-6 x 16: 10
// to 12 accumulators, as 8 chains at one FMA a row left the 4 x 16 tile latency-bound).
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX2__) && defined(__FMA__))
#error "packed_gemm_avx2.cpp needs -mavx2 -mfma (kernels/CMakeLists.txt)"
#endif

#include <immintrin.h>

#include "kernels/cpu/isa_kernels.h"

#ifndef PG_AVX2_KCHUNK
#define PG_AVX2_KCHUNK 64
#endif

namespace ltm::kernels::cpu::avx2 {
namespace {

constexpr int64_t kWidth = 64;                // kPanelWidth
constexpr int64_t kPrefetch = 8;              // panel rows prefetched ahead by the first rows
constexpr int64_t kKChunk = PG_AVX2_KCHUNK;  // [64 x 64] floats = 16 KB: half of Zen 3's L1
constexpr int64_t kKChunk16 = kKChunk;        // 16-bit panels: rows converted per chunk
constexpr int kMaxRows = 6;                   // rows of A per row group (panel_loops.inc)
#ifndef PG_AVX2_L2_NEXT
#define PG_AVX2_L2_NEXT 1
#endif
constexpr bool kL2Next = PG_AVX2_L2_NEXT != 0;  // the next chunk pulled into L2 (panel_loops.inc)
// The first group's share of the next chunk (panel_loops.inc): m = 3..6 ran 1.9-2.1x with it,
// 7..8 1.1-1.2x, 9 alike, 10..11 0.89-0.95x (docs/benchmarks.md, "The next chunk in L2 for few
// rows"); m <= 2 decode on gemv_panels.
constexpr int64_t kL2ShareFrom = 1, kL2ShareTo = 8;
// A tile's share of panel_loops.inc's L2Stream, spread evenly over its k steps: `lines` lines
// from `base`, one whenever a running sum of `lines` a step passes k (no division: the three
// this took per strip were 2-3% of a batch-32 step in perf). A group's share is split over its
// strips (strips below), so that the prefetches of the next chunk are spread over the whole time
// the group computes, not issued in one burst by the first strip: with 52 lines in the first 64
// of a group's 256 steps (m = 32), the strip carrying them ran 1.65x as long as the others
// (perf, forced AVX2, batch-32 decode, 2026-12-02; presumably more misses in flight than the
// core's fill buffers hold). Spread: m = 32, 1 thread, weights from memory, +7-12%.
struct L2Spread {
  const char* base = nullptr;
  int64_t lines = 0;
};
// A tile without a stream: no code.
struct NoL2 {};
template <typename L2>
constexpr bool kSpread = false;
template <>
constexpr bool kSpread<L2Spread> = true;

inline int64_t min_i(int64_t a, int64_t b) { return a < b ? a : b; }

// C[R rows, 8 V columns] (masked by mk[] when kMasked) = acc + beta * C: every tile's epilogue.
template <int R, int V, bool kMasked>
inline void store_tile(const __m256 (&acc)[R][V], float* c, int64_t ldc, float beta,
                       const __m256i* mk) {
  const __m256 vb = _mm256_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      __m256 out = acc[r][v];
      if constexpr (kMasked) {
        if (beta != 0.0f) out = _mm256_fmadd_ps(vb, _mm256_maskload_ps(cr + 8 * v, mk[v]), out);
        _mm256_maskstore_ps(cr + 8 * v, mk[v], out);
      } else {
        if (beta != 0.0f) out = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8 * v), out);
        _mm256_storeu_ps(cr + 8 * v, out);
      }
    }
  }
}

// One k step of a tile: B row bp (8 V columns) times A's column p into the R x V accumulators.
template <int R, int V>
[[gnu::always_inline]] inline void tile_step(__m256 (&acc)[R][V], const float* a, int64_t lda,
                                             const float* bp, int64_t p) {
  __m256 bv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) bv[v] = _mm256_loadu_ps(bp + 8 * v);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 x = _mm256_broadcast_ss(a + r * lda + p);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(x, bv[v], acc[r][v]);
  }
}

#ifndef PG_AVX2_ASM6
#define PG_AVX2_ASM6 1
#endif
// N k steps of the 6 x 16 tile (the compute-bound kernel of batched decode and prefill on this
// path) as one asm block, the same operations as tile_step<6, 2> in the same order: per step two
// B loads, then per row a broadcast and its two FMAs. From the intrinsics GCC 12 interleaved the
// unrolled steps, ran out of the 16 registers and passed one or two accumulators an iteration
// through the stack (a store and a reload inside their FMA chains) besides register copies; here
// the 12 accumulators are register operands and ymm12-15 (B, broadcasts) the block's own. Same
// bits (every FMA is the same, in the same order per accumulator). Measured on the Zen 4 VM
// (2026-12-05, forced AVX2, m = 32, GPT-2 shapes, tests/kernels/packed_gemm_bench.cpp): one
// thread with B warm 90-95 -> 99-104 GFLOP/s (0.80 -> 0.88 of a core's FMA peak), two threads
// with B from memory 183-188 -> 192-201. a0: row 0 of A at the first step, a3: row 3, ld: A's
// row stride in bytes, bp: the first step's B row. PG_AVX2_ASM6=0 builds the intrinsics form
// (for measuring against it).
#define PG6_ROW(AO, BASE, IDX, REG, C0, C1)                      \
  "vbroadcastss " AO "(%[" BASE "]" IDX "), %%" REG "\n\t"      \
  "vfmadd231ps %%ymm14, %%" REG ", %[" C0 "]\n\t"               \
  "vfmadd231ps %%ymm15, %%" REG ", %[" C1 "]\n\t"
#define PG6_STEP(AO, BO)                                          \
  "vmovups " BO "(%[b]), %%ymm14\n\t"                             \
  "vmovups " BO "+32(%[b]), %%ymm15\n\t"                          \
  PG6_ROW(AO, "a0", "", "ymm12", "c00", "c01")                    \
  PG6_ROW(AO, "a0", ",%[ld],1", "ymm13", "c10", "c11")            \
  PG6_ROW(AO, "a0", ",%[ld],2", "ymm12", "c20", "c21")            \
  PG6_ROW(AO, "a3", "", "ymm13", "c30", "c31")                    \
  PG6_ROW(AO, "a3", ",%[ld],1", "ymm12", "c40", "c41")            \
  PG6_ROW(AO, "a3", ",%[ld],2", "ymm13", "c50", "c51")
template <int64_t N>
[[gnu::always_inline]] inline void steps6x16(__m256 (&acc)[6][2], const float* a0,
                                             const float* a3, int64_t ld, const float* bp) {
  static_assert(N == 1 || N == 4);
  static_assert(kWidth == 64, "the block's B offsets assume 256-byte panel rows");
#define PG6_OPERANDS                                                                          \
  [c00] "+x"(acc[0][0]), [c01] "+x"(acc[0][1]), [c10] "+x"(acc[1][0]), [c11] "+x"(acc[1][1]), \
      [c20] "+x"(acc[2][0]), [c21] "+x"(acc[2][1]), [c30] "+x"(acc[3][0]),                    \
      [c31] "+x"(acc[3][1]), [c40] "+x"(acc[4][0]), [c41] "+x"(acc[4][1]),                    \
      [c50] "+x"(acc[5][0]), [c51] "+x"(acc[5][1])                                            \
      : [a0] "r"(a0), [a3] "r"(a3), [ld] "r"(ld), [b] "r"(bp)                                 \
      : "xmm12", "xmm13", "xmm14", "xmm15", "memory"
  if constexpr (N == 4) {
    asm(PG6_STEP("0", "0") PG6_STEP("4", "256") PG6_STEP("8", "512") PG6_STEP("12", "768")
        : PG6_OPERANDS);
  } else {
    asm(PG6_STEP("0", "0") : PG6_OPERANDS);
  }
#undef PG6_OPERANDS
}
#undef PG6_STEP
#undef PG6_ROW

// k steps a loop iteration in tile(). One step (12 FMAs at 6 x 16) came with ~18 more uops (B
// loads, broadcasts, the address arithmetic of six rows, the loop and the L2 stream's test), near
// the ~5 uops a cycle the front end issues, so the FMA ports idled: in L1 (one thread, 6 x 16
// tiles over a 64 x 64 chunk, best of 15 alternating rounds) 50-51 GFLOP/s, unrolled by 4 64-65.
// Each accumulator still sums its k steps in order, so C is bit for bit the same.
constexpr int64_t kUnroll = 4;
template <int64_t N>
struct StepCount {  // tile()'s steps at a time, as a constant
  static constexpr int64_t n = N;
};

// C[R rows, 8 V columns] = A[R, k] @ B[k, 8 V] + beta * C, B rows kWidth apart. mk: the
// column masks of C (kMasked); prefetch: pull the whole panel row kPrefetch rows ahead (b must
// then be the row's start); l2 (an L2Spread): lines of the next chunk pulled into L2. Inlined,
// with strips(), into row_group: a call for each strip of each chunk (64 k steps) spent a few
// percent of the batched step in the calls' prologues and epilogues (forced AVX2, Zen 4, batch-32
// decode 1.01-1.06x in 4 alternating rounds, 2026-12-05).
template <int R, int V, bool kMasked, typename L2 = NoL2>
[[gnu::always_inline]] inline void tile(const float* a, int64_t lda, const float* b, float* c,
                                        int64_t ldc, int64_t k, float beta, const __m256i* mk,
                                        bool prefetch, const L2& l2 = {}) {
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  const int64_t kp = prefetch && k > kPrefetch ? k - kPrefetch : 0;
  [[maybe_unused]] const float* a3 = a + 3 * lda;
  [[maybe_unused]] int64_t l2_sum = 0;
  [[maybe_unused]] const char* l2_at = nullptr;
  [[maybe_unused]] int64_t l2_lines = 0;  // a copy: the asm's memory clobber would reload l2's
  if constexpr (kSpread<L2>) {
    l2_at = l2.base;
    l2_lines = l2.lines;
  }
  // Steps [p, p + n): the panel rows kPrefetch ahead of those below kp pulled into L1, the L2
  // stream's share of n steps (over k steps it issues exactly l2.lines prefetches), the FMAs.
  auto steps = [&](int64_t p, auto count) __attribute__((always_inline)) {
    constexpr int64_t n = decltype(count)::n;
    if (p < kp) {
#pragma GCC unroll 8
      for (int64_t u = 0; u < n; ++u) {
        if (p + u >= kp) break;
        const char* pf = reinterpret_cast<const char*>(b + (p + u + kPrefetch) * kWidth);
        _mm_prefetch(pf, _MM_HINT_T0);
        _mm_prefetch(pf + 64, _MM_HINT_T0);
        _mm_prefetch(pf + 128, _MM_HINT_T0);
        _mm_prefetch(pf + 192, _MM_HINT_T0);
      }
    }
    if constexpr (kSpread<L2>) {
      l2_sum += l2_lines * n;
      while (l2_sum >= k) {
        l2_sum -= k;
        _mm_prefetch(l2_at, _MM_HINT_T1);
        l2_at += 64;
      }
    }
    if constexpr (R == 6 && V == 2 && PG_AVX2_ASM6) {
      steps6x16<n>(acc, a + p, a3 + p, lda * 4, b + p * kWidth);
    } else {
#pragma GCC unroll 8
      for (int64_t u = 0; u < n; ++u) tile_step<R, V>(acc, a, lda, b + (p + u) * kWidth, p + u);
    }
  };
  int64_t p = 0;
  for (; p + kUnroll <= k; p += kUnroll) steps(p, StepCount<kUnroll>{});
  for (; p < k; ++p) steps(p, StepCount<1>{});
  store_tile<R, V, kMasked>(acc, c, ldc, beta, mk);
}

// R rows of A over the panel's columns [0, cols) in strips of 8 V columns.
// The first strip pulls the chunk (prefetch); every strip pulls a part of the group's share of
// the next chunk (l2). A group with no share (one group: decode) runs the tile without the
// stream's test per step.
template <int R, int V, bool kMasked, typename L2>
[[gnu::always_inline]] inline void strips(const float* a, int64_t lda, const float* b, float* c,
                                          int64_t ldc, int64_t k, float beta, const __m256i* mk,
                                          int64_t cols, bool prefetch, const L2& l2) {
  // A full panel's strip count is a constant, so that the share below is a shift.
  const int64_t n_strips = kMasked ? (cols + 8 * V - 1) / (8 * V) : kWidth / (8 * V);
  // Each strip takes an even part of the group's lines, spread over its k steps.
  const int64_t sub = l2.lines > 0 && k > 0 ? (l2.lines + n_strips - 1) / n_strips : 0;
  for (int64_t s = 0; s < n_strips; ++s) {
    const float* bs = b + s * 8 * V;
    float* cs = c + s * 8 * V;
    const int64_t first = s * sub, lines = min_i(sub, l2.lines - first);
    if (lines > 0) {
      L2Spread sp;
      sp.base = l2.base + first * 64;
      sp.lines = lines;
      tile<R, V, kMasked>(a, lda, bs, cs, ldc, k, beta, mk + s * V, prefetch && s == 0, sp);
    } else {
      tile<R, V, kMasked>(a, lda, bs, cs, ldc, k, beta, mk + s * V, prefetch && s == 0);
    }
  }
}

// The walk's row group (panel_loops.inc): R rows of A in strips of the panel, 6 x 16 (3-5 rows
// likewise), 2 x 32, 1 x 64; the groups after a chunk's first pull a share of the next chunk into
// L2 (kL2Next: 1 thread, GPT-2 shapes, weights from memory, m = 8..32: +14-22%).
// Not inlined: inside the walk GCC ran short of registers for the tile's loop.
template <int R, bool kMasked, typename L2>
[[gnu::noinline]] void row_group(const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                      int64_t k, float beta, const __m256i* mk, int64_t cols, bool prefetch,
                      const L2& l2) {
  constexpr int V = R >= 3 ? 2 : 8 / R;
  strips<R, V, kMasked>(a, lda, b, c, ldc, k, beta, mk, cols, prefetch, l2);
}


// ---- 16-bit panels (bf16, fp16): the same layout with 2-byte elements ----
//
// m <= kRegRows16 (decode, a verify step, small batches): the panel rows are converted in
// registers as read (bf16, pairs of rows: a shift left 16 and a mask; fp16: F16C's vcvtph2ps),
// half the bytes of the fp32 kernel, by the chunks of kKChunk16 rows of the path for larger m,
// which converts each chunk once into an fp32 scratch (16 KB, L1) and runs the fp32 tiles on it.

constexpr int64_t kPrefetch16 = 16;  // panel rows (128 bytes each) prefetched ahead

template <bool kF16>
inline __m256 cvt8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (kF16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// As tile, B 16-bit (rows kWidth elements apart).
// k_rest: the panel's rows from b on (>= k; prefetching may run past this call's k into them).
// H: B vectors converted at a time (V, or fewer where R V accumulators and V B registers would not
// fit: 3 rows x 32 columns take two halves, each row's broadcast read again for the second).
template <int R, int V, bool kMasked, bool kF16, int H = V>
inline void tile16(const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc,
                   int64_t k, float beta, const __m256i* mk, bool prefetch, int64_t k_rest) {
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  const int64_t kp = prefetch && k_rest > kPrefetch16 ? min_i(k, k_rest - kPrefetch16) : 0;
  for (int64_t p = 0; p < k; ++p) {
    const uint16_t* bp = b + p * kWidth;
    if (p < kp) {
      const char* pf = reinterpret_cast<const char*>(bp + kPrefetch16 * kWidth);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int h = 0; h < V; h += H) {
      // Read the broadcasts again: otherwise GCC keeps them in registers and spills accumulators.
      if (h > 0) asm volatile("" ::: "memory");
      __m256 bv[H];
#pragma GCC unroll 8
      for (int v = 0; v < H; ++v) bv[v] = cvt8<kF16>(bp + 8 * (h + v));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(a + r * lda + p);
#pragma GCC unroll 8
        for (int v = 0; v < H; ++v) acc[r][h + v] = _mm256_fmadd_ps(x, bv[v], acc[r][h + v]);
      }
    }
  }
  store_tile<R, V, kMasked>(acc, c, ldc, beta, mk);
}

// As tile16 for a bf16 panel (pairs of rows, packed_gemm.h); b is the panel plus 2 x the first
// column (a pair row is 128 elements). Each 32-byte load holds 8 columns of rows 2q and 2q + 1,
// split into fp32 by a shift and a mask; every accumulator sees the rows in order, as in tile16.
template <int R, int V, bool kMasked>
inline void tile_pairs(const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc,
                       int64_t k, float beta, const __m256i* mk, bool prefetch, int64_t k_rest) {
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  constexpr int64_t kAheadPairs = kPrefetch16 / 2;
  const int64_t pairs = (k + 1) / 2, pairs_rest = (k_rest + 1) / 2;
  const int64_t kp = prefetch && pairs_rest > kAheadPairs ? min_i(pairs, pairs_rest - kAheadPairs) : 0;
  for (int64_t q = 0; q < pairs; ++q) {
    const uint16_t* bq = b + q * 2 * kWidth;
    if (q < kp) {  // the whole pair row (256 bytes), whichever half this tile reads
      const char* pf = reinterpret_cast<const char*>(bq + kAheadPairs * 2 * kWidth);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      _mm_prefetch(pf + 128, _MM_HINT_T0);
      _mm_prefetch(pf + 192, _MM_HINT_T0);
    }
    const bool both = 2 * q + 1 < k;  // false only for the pad row of an odd k
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bq + 16 * v));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        acc[r][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * lda + 2 * q), even, acc[r][v]);
      if (both) {
        const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(x, hi));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          acc[r][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * lda + 2 * q + 1), odd, acc[r][v]);
      }
    }
  }
  store_tile<R, V, kMasked>(acc, c, ldc, beta, mk);
}

// tile_pairs for 3..6 rows, where the 12 accumulators (3 x 32 or 6 x 16 columns) leave no
// registers for a pair's even and odd vectors together: per pair row and H vectors (8 H columns),
// the even rows' vectors are converted and each row's broadcast meets them all, then the same for
// the odd rows, the pair read again from L1. A broadcast per row, half pair and 8 H columns
// (tile_pairs: per row, half pair and 8 columns); each accumulator still sees rows 2q, 2q + 1 in
// order.
template <int R, int V, int H, bool kMasked>
inline void tile_pairs_phased(const float* a, int64_t lda, const uint16_t* b, float* c,
                              int64_t ldc, int64_t k, float beta, const __m256i* mk,
                              bool prefetch, int64_t k_rest) {
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  constexpr int64_t kAheadPairs = kPrefetch16 / 2;
  const int64_t pairs = (k + 1) / 2, pairs_rest = (k_rest + 1) / 2;
  const int64_t kp = prefetch && pairs_rest > kAheadPairs ? min_i(pairs, pairs_rest - kAheadPairs) : 0;
  for (int64_t q = 0; q < pairs; ++q) {
    const uint16_t* bq = b + q * 2 * kWidth;
    if (q < kp) {
      const char* pf = reinterpret_cast<const char*>(bq + kAheadPairs * 2 * kWidth);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      _mm_prefetch(pf + 128, _MM_HINT_T0);
      _mm_prefetch(pf + 192, _MM_HINT_T0);
    }
    const bool both = 2 * q + 1 < k;  // false only for the pad row of an odd k
#pragma GCC unroll 8
    for (int h = 0; h < V; h += H) {
      // Each phase reads the pair (and the broadcasts) again: otherwise GCC keeps the first
      // loads in registers and spills accumulators instead, a store and a reload in their chains
      // (6 rows cost 1.17x).
      if (h > 0) asm volatile("" ::: "memory");
      __m256 w[H];
#pragma GCC unroll 8
      for (int v = 0; v < H; ++v)
        w[v] = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bq + 16 * (h + v))), 16));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(a + r * lda + 2 * q);
#pragma GCC unroll 8
        for (int v = 0; v < H; ++v) acc[r][h + v] = _mm256_fmadd_ps(x, w[v], acc[r][h + v]);
      }
      if (both) {
        asm volatile("" ::: "memory");
#pragma GCC unroll 8
        for (int v = 0; v < H; ++v)
          w[v] = _mm256_castsi256_ps(_mm256_and_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bq + 16 * (h + v))), hi));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256 x = _mm256_broadcast_ss(a + r * lda + 2 * q + 1);
#pragma GCC unroll 8
          for (int v = 0; v < H; ++v) acc[r][h + v] = _mm256_fmadd_ps(x, w[v], acc[r][h + v]);
        }
      }
    }
  }
  store_tile<R, V, kMasked>(acc, c, ldc, beta, mk);
}

// Columns of a register-converted tile of R rows (8 V a strip): 1 x 64, 2 x 32, 3 x 32, and
// 4..6 x 16 as the fp32 tiles: 8..12 accumulators from 2 rows on.
template <int R>
constexpr int kRegV = R == 1 ? 8 : R <= 3 ? 4 : 2;

// One strip of a row group: R rows x 8 V columns from column j of the panel, H vectors of B
// converted at a time (tile16, tile_pairs_phased); pf: prefetch the panel rows ahead.
template <int R, int V, int H, bool kMasked, bool kF16>
inline void strip16(const float* a, int64_t lda, const uint16_t* b, float* c, int64_t ldc,
                    int64_t kc, float beta, const __m256i* mk, int64_t j, bool pf, int64_t rest) {
  if constexpr (kF16) {
    tile16<R, V, kMasked, kF16, H>(a, lda, b + j, c + j, ldc, kc, beta, mk + j / 8, pf, rest);
  } else if constexpr (R >= 3) {  // column j sits at 2 j in a pair row
    tile_pairs_phased<R, V, H, kMasked>(a, lda, b + 2 * j, c + j, ldc, kc, beta, mk + j / 8, pf,
                                        rest);
  } else {
    tile_pairs<R, V, kMasked>(a, lda, b + 2 * j, c + j, ldc, kc, beta, mk + j / 8, pf, rest);
  }
}

// R rows of A over one chunk of kc panel rows, strip by strip over the panel's columns [0, cols),
// each strip's B converted in registers as read; the first strip prefetches the panel rows ahead
// (prefetch). rest: the panel's rows from b on (the prefetch may run past the chunk).
#ifndef PG_AVX2_R4W24
#define PG_AVX2_R4W24 1
#endif
template <int R, bool kMasked, bool kF16>
[[gnu::noinline]] void rows16(const float* a, int64_t lda, const uint16_t* b, float* c,
                              int64_t ldc, int64_t kc, float beta, const __m256i* mk,
                              int64_t cols, bool prefetch, int64_t rest) {
  if constexpr (R == 4 && PG_AVX2_R4W24) {
    // 4 x 24, 4 x 24, 4 x 16: 12 accumulators where 4 x 16 has 8, each one FMA a row (or two
    // chained a bf16 pair): 8 chains are as many as the FMA pipes hold, with no slack.
    strip16<4, 3, 3, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, 0, prefetch, rest);
    if (cols > 24) strip16<4, 3, 3, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, 24, false, rest);
    if (cols > 48) strip16<4, 2, 2, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, 48, false, rest);
  } else {
    constexpr int V = kRegV<R>, H = R >= 3 ? 2 : V;
    for (int64_t j = 0; j < cols; j += 8 * V)
      strip16<R, V, H, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, j, prefetch && j == 0, rest);
  }
}

// panel_loops.inc's row group of its 16-bit register path (decode16 there).
template <bool kMasked, bool kF16>
void rows16_group(int64_t rows, const float* a, int64_t lda, const uint16_t* b, float* c,
                  int64_t ldc, int64_t kc, float beta, const __m256i* mk, int64_t cols,
                  bool prefetch, int64_t rest) {
  switch (rows) {
    case 1: rows16<1, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, cols, prefetch, rest); break;
    case 2: rows16<2, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, cols, prefetch, rest); break;
    case 3: rows16<3, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, cols, prefetch, rest); break;
    case 4: rows16<4, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, cols, prefetch, rest); break;
    case 5: rows16<5, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, cols, prefetch, rest); break;
    default: rows16<6, kMasked, kF16>(a, lda, b, c, ldc, kc, beta, mk, cols, prefetch, rest); break;
  }
}

// Rows of A up to which a 16-bit panel is converted in registers (decode16); more take the
// scratch path. On models/kjv-small's GEMMs (1 thread, forced AVX2 on the Xeon, 2026-12-03) the
// register path cost 0.5-0.7x the scratch path at 3 rows, 0.65-0.85x at 6, 0.7-0.93x at 12 (the
// lower figures at load 3-6, the higher at load 1.5; an earlier form still 0.9x at 13..24, under
// load); 12 covers a verify step of two sequences, as on AVX-512.
#ifndef PG_AVX2_REG16_ROWS
#define PG_AVX2_REG16_ROWS 12
#endif
constexpr int64_t kRegRows16 = PG_AVX2_REG16_ROWS;

using Mask = __m256i;
constexpr int kMasks = 8;

void column_masks(int64_t cols, __m256i* mk) {
  for (int v = 0; v < 8; ++v) {
    alignas(32) int32_t lanes[8];
    for (int j = 0; j < 8; ++j) lanes[j] = 8 * v + j < cols ? -1 : 0;
    mk[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
  }
}

}  // namespace
}  // namespace ltm::kernels::cpu::avx2

#define LTM_ISA_NS avx2
#include "kernels/cpu/panel_loops.inc"

// ---- Decode (one row of A) over several panels at once ----
//
// As the AVX-512 kernel's gemv_panels: one row of A is bandwidth-bound, and one sequential
// stream per core leaves the memory system idle part of the time; S panels walked together are
// S streams. A 64-column panel row takes 8 of the 16 ymm registers, so the S panels take turns
// of kTurnBytes each, their accumulators kept in L1 between turns (a store and a reload change
// no bits). The sum is the one the row groups make (row_group<1>, decode16): each chunk of
// kKChunk rows from zero in row order (a bf16 pair's even row, then its odd one), then added to
// C (the call's beta for the first chunk, 1 after), so a decode row keeps the bits of the same
// row in a larger step. Measured (forced AVX2 on the Xeon, fp32, 2 threads, GPT-2-124M shapes,
// weights from memory, alternating): 1.3-1.45x the one-stream tile; turns of 1, 2 or 4 rows
// alike, 8 and more rows worse, prefetching 8 rows ahead better than none, 16 or 32. 16-bit
// weights are prefetched with prefetchnta, the streams left to the hardware prefetchers, at the
// distance the caller passes (ahead16: packed_gemm.cpp chooses by CPU, 512 or 2048 bytes): 512
// bytes (two bf16 pair rows) was 3-5% faster in bf16 decode than 2048 bytes into L1 on an AMD EPYC
// Zen 4, 10% in fp16 (docs/benchmarks.md, "Short non-temporal prefetch and paired panels in the
// decode gemvs"), while on a Zen 5 2048 bytes non-temporal was 1.26-1.32x faster than 512 ("The
// AVX2 16-bit decode's prefetch distance"); fp32 was even there, so it keeps the Xeon's setting.
#ifndef PG_AVX2_GEMV_TURN_BYTES
#define PG_AVX2_GEMV_TURN_BYTES 512
#endif
#ifndef PG_AVX2_GEMV_AHEAD_BYTES
#define PG_AVX2_GEMV_AHEAD_BYTES 2048
#endif
namespace ltm::kernels::cpu::avx2 {
namespace {

constexpr int64_t kTurnBytes = PG_AVX2_GEMV_TURN_BYTES;    // of a panel per turn
constexpr int64_t kAheadBytes = PG_AVX2_GEMV_AHEAD_BYTES;  // prefetched ahead per stream, fp32

// kType: 0 fp32, 1 bf16 (a unit is a pair row), 2 fp16; a unit is one panel row otherwise.
// R rows of A (1 or 2, k apart; C's rows ldc apart): the R x 8 accumulators of a panel do not fit
// the registers for R = 2, so each turn runs over R parts of 8 V columns (V = 8 / R, the tiles'
// widths: 1 x 64, 2 x 32), the later parts reading the turn's rows again from L1.
template <int S, int kType, int R>
void gemv_s(const float* a, const void* panels, float* c, int64_t ldc, int64_t k, float beta,
            int64_t ahead16) {
  constexpr int V = 8 / R;
  constexpr int64_t kUnitRows = kType == 1 ? 2 : 1;
  constexpr int64_t kUnitBytes = kWidth * (kType == 0 ? 4 : 2) * kUnitRows;
  constexpr int64_t kTurn = kTurnBytes / kUnitBytes > 0 ? kTurnBytes / kUnitBytes : 1;
  const int64_t ahead = kType == 0 ? kAheadBytes / kUnitBytes : ahead16 / kUnitBytes;
  constexpr auto kHint = kType == 0 ? _MM_HINT_T0 : _MM_HINT_NTA;  // enum (GCC) or int (clang)
  static_assert(kKChunk % 2 == 0, "bf16 pair rows must not straddle a chunk");
  const int64_t units = (k + kUnitRows - 1) / kUnitRows;
  const int64_t panel_bytes = units * kUnitBytes;
  const char* base = static_cast<const char*>(panels);
  [[maybe_unused]] const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  alignas(32) float part[S][R][kWidth];
  int64_t p0 = 0;
  do {  // at least once: k = 0 still writes beta * C
    const int64_t u0 = p0 / kUnitRows, u1 = min_i(units, (p0 + kKChunk) / kUnitRows);
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < 8; ++v) _mm256_store_ps(part[s][r] + 8 * v, _mm256_setzero_ps());
    for (int64_t t0 = u0; t0 < u1; t0 += kTurn) {
      const int64_t t1 = min_i(t0 + kTurn, u1);
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        const char* panel = base + s * panel_bytes;
#pragma GCC unroll 2
        for (int h = 0; h < R; ++h) {  // columns [8 V h, 8 V (h + 1))
          __m256 acc[R][V];
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int v = 0; v < V; ++v) acc[r][v] = _mm256_load_ps(part[s][r] + 8 * (h * V + v));
          for (int64_t u = t0; u < t1; ++u) {
            const char* row = panel + u * kUnitBytes;
            if (h == 0 && u + ahead < units) {
#pragma GCC unroll 4
              for (int64_t line = 0; line < kUnitBytes; line += 64)
                _mm_prefetch(row + ahead * kUnitBytes + line, kHint);
            }
            if constexpr (kType == 1) {
              __m256 x[R];
#pragma GCC unroll 2
              for (int r = 0; r < R; ++r) x[r] = _mm256_broadcast_ss(a + r * k + 2 * u);
#pragma GCC unroll 8
              for (int v = 0; v < V; ++v) {
                const __m256i w =
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * (h * V + v)));
                const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
#pragma GCC unroll 2
                for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(x[r], even, acc[r][v]);
              }
              if (2 * u + 1 < k) {  // false only for the pad row of an odd k
#pragma GCC unroll 2
                for (int r = 0; r < R; ++r) x[r] = _mm256_broadcast_ss(a + r * k + 2 * u + 1);
#pragma GCC unroll 8
                for (int v = 0; v < V; ++v) {
                  const __m256i w =
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * (h * V + v)));
                  const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(w, hi));
#pragma GCC unroll 2
                  for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(x[r], odd, acc[r][v]);
                }
              }
            } else {
              __m256 x[R];
#pragma GCC unroll 2
              for (int r = 0; r < R; ++r) x[r] = _mm256_broadcast_ss(a + r * k + u);
#pragma GCC unroll 8
              for (int v = 0; v < V; ++v) {
                __m256 w;
                if constexpr (kType == 2) {
                  w = _mm256_cvtph_ps(
                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * (h * V + v))));
                } else {
                  w = _mm256_loadu_ps(reinterpret_cast<const float*>(row) + 8 * (h * V + v));
                }
#pragma GCC unroll 2
                for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(x[r], w, acc[r][v]);
              }
            }
          }
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int v = 0; v < V; ++v) _mm256_store_ps(part[s][r] + 8 * (h * V + v), acc[r][v]);
        }
      }
    }
    const float cb = p0 == 0 ? beta : 1.0f;
    const __m256 vb = _mm256_set1_ps(cb);
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v) {
          float* cv = c + r * ldc + s * kWidth + 8 * v;
          __m256 out = _mm256_load_ps(part[s][r] + 8 * v);
          if (cb != 0.0f) out = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cv), out);
          _mm256_storeu_ps(cv, out);
        }
    p0 += kKChunk;
  } while (p0 < k);
}

template <int kType, int R>
void gemv_any(const float* a, const void* panels, float* c, int64_t ldc, int64_t k,
              int64_t cols, float beta, int64_t ahead16) {
  const int64_t full = min_i(cols / kWidth, 4);
  switch (full) {
    case 0: break;
    case 1: gemv_s<1, kType, R>(a, panels, c, ldc, k, beta, ahead16); break;
    case 2: gemv_s<2, kType, R>(a, panels, c, ldc, k, beta, ahead16); break;
    case 3: gemv_s<3, kType, R>(a, panels, c, ldc, k, beta, ahead16); break;
    default: gemv_s<4, kType, R>(a, panels, c, ldc, k, beta, ahead16); break;
  }
  if (cols <= full * kWidth) return;
  // A narrower last panel: the panel kernels (the same sums).
  constexpr int64_t kUnitRows = kType == 1 ? 2 : 1;
  const int64_t panel_elems = (k + kUnitRows - 1) / kUnitRows * kUnitRows * kWidth;
  const int64_t rest = cols - full * kWidth;
  float* cr = c + full * kWidth;
  if constexpr (kType == 0) {
    panel_gemm(a, static_cast<const float*>(panels) + full * panel_elems, cr, ldc, R, k, rest,
               beta);
  } else {
    const uint16_t* pr = static_cast<const uint16_t*>(panels) + full * panel_elems;
    if constexpr (kType == 1) panel_gemm_bf16(a, pr, cr, ldc, R, k, rest, beta);
    else panel_gemm_f16(a, pr, cr, ldc, R, k, rest, beta);
  }
}

template <int R>
void gemv_rows(const float* a, const void* panels, int type, float* c, int64_t ldc, int64_t k,
               int64_t cols, float beta, int64_t ahead16) {
  if (type == 1) gemv_any<1, R>(a, panels, c, ldc, k, cols, beta, ahead16);
  else if (type == 2) gemv_any<2, R>(a, panels, c, ldc, k, cols, beta, ahead16);
  else gemv_any<0, R>(a, panels, c, ldc, k, cols, beta, ahead16);
}

}  // namespace

void gemv_panels(const float* a, int64_t m, const void* panels, int type, float* c, int64_t ldc,
                 int64_t k, int64_t cols, float beta, int64_t ahead16) {
  if (m == 2) gemv_rows<2>(a, panels, type, c, ldc, k, cols, beta, ahead16);
  else gemv_rows<1>(a, panels, type, c, ldc, k, cols, beta, ahead16);
}

}  // namespace ltm::kernels::cpu::avx2
#endif
