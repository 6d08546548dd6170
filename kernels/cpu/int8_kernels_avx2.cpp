// int8_gemm's panel kernel for AVX2 (target flags: kernels/CMakeLists.txt); also the AVX-512
// path's kernel on a CPU without VNNI. maddubs multiplies unsigned by signed bytes and saturates
// its pair sums at 16 bits, so the weights' bytes are made signed again (xor 0x80) and the
// activations' signs moved onto them (sign_epi8): |a| (<= 127) times +-q_w (|q_w| <= 127) pairs
// sum to at most 32258, exact; madd with ones then sums the pairs into one 32-bit lane per column
// (int8_gemm.h's layout). Include only int8_kernels.h and intrinsics here (see isa_kernels.h).
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "int8_kernels_avx2.cpp needs -mavx2 -mfma -mf16c (kernels/CMakeLists.txt)"
#endif

#include <immintrin.h>

#include <type_traits>

#include <cstring>

#include "kernels/cpu/int8_kernels.h"

namespace ltm::kernels::cpu::int8::avx2 {
namespace {

constexpr int64_t kGroupBytes = 2176;

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The int32 sums of rows [0, R) of A times quarter u (16 columns) of group block g (at blk) of a
// panel: is[r][v] for columns 16 u + 8 v .. + 8. The weights' 2 vectors are loaded and flipped
// once per quad for the R rows.
template <int R>
[[gnu::always_inline]] inline void quarter_sums(const QuantRows& a, const uint8_t* blk, int64_t g,
                                                int u, __m256i (&is)[R][2]) {
  const int64_t kq = a.groups * 32;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) is[r][0] = is[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t) {
    const uint8_t* wq = blk + 128 + 256 * t + 64 * u;
    const __m256i w0 =
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq)), flip);
    const __m256i w1 =
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 32)), flip);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i x = _mm256_set1_epi32(load_i32(a.q + r * kq + 32 * g + 4 * t));
      const __m256i ax = _mm256_abs_epi8(x);
      is[r][0] = _mm256_add_epi32(
          is[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, x)), ones));
      is[r][1] = _mm256_add_epi32(
          is[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, x)), ones));
    }
  }
}

// acc[r][0..16) += is[r] (as fp32) x the quarter's weight scales x row r's scale for group g.
template <int R>
[[gnu::always_inline]] inline void add_quarter(const QuantRows& a, const uint8_t* blk, int64_t g,
                                               int u, const __m256i (&is)[R][2], float* acc,
                                               int64_t stride) {
  const __m256 sw0 =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 * u)));
  const __m256 sw1 =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 * u + 16)));
  for (int r = 0; r < R; ++r) {
    const __m256 sa = _mm256_set1_ps(a.scale[r * a.groups + g]);
    float* ar = acc + r * stride;
    _mm256_store_ps(ar, _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][0]), _mm256_mul_ps(sw0, sa),
                                        _mm256_load_ps(ar)));
    _mm256_store_ps(ar + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][1]), _mm256_mul_ps(sw1, sa),
                                            _mm256_load_ps(ar + 8)));
  }
}

// C[R, cols] = acc + beta * C, cols <= 8 * vectors, acc's rows `stride` floats apart.
template <int R>
inline void store_rows(const float* acc, int64_t stride, int vectors, float* c, int64_t ldc,
                       int64_t cols, float beta) {
  const __m256 vb = _mm256_set1_ps(beta);
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    for (int v = 0; v < vectors; ++v) {
      const int64_t left = cols - 8 * v;
      if (left <= 0) break;
      __m256 out = _mm256_load_ps(acc + r * stride + 8 * v);
      if (left >= 8) {
        if (beta != 0.0f) out = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8 * v), out);
        _mm256_storeu_ps(cr + 8 * v, out);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, out);
        for (int64_t j = 0; j < left; ++j)
          cr[8 * v + j] = beta != 0.0f ? tmp[j] + beta * cr[8 * v + j] : tmp[j];
      }
    }
  }
}

// Rows [0, R) of A times one panel: C[R, cols] = A @ P + beta * C, 8 int32 accumulators at a time
// (R = 4 rows x 2 vectors of 8 columns, a quarter of the panel's columns) and the fp32 ones in
// memory (touched once per group and quarter), so that nothing spills from the 16 ymm registers
// inside the quad loop. kOnly (these rows are the panel's only tile: m <= 4,
// int8_panel_rows.inc): group block by group block, each block's quarters in turn, so that the
// panel is read once front to back; otherwise (as every m was before) a quarter over all the
// groups, then the next: 4 passes over the panel with a 256-byte stride, which ran m = 2..3
// 1.1-1.9x slower from memory (m = 4 about the same), but m >= 5 (later tiles read the panel from
// L2) block by block ran 0.85-0.97x at m = 6..8 (docs/benchmarks.md, "The next chunk in L2 for
// few rows"). Each column sums its groups in order either way: the same bits. Not inlined:
// inlined into panel_gemm, m >= 5 ran 2-14% slower than the same loops did before they were split
// into these helpers.
template <int R, bool kOnly>
[[gnu::noinline]] void tile(const QuantRows& a, const uint8_t* panel, float* c, int64_t ldc,
                            int64_t cols, float beta) {
  const int quarters = cols >= 64 ? 4 : static_cast<int>((cols + 15) / 16);
  __m256i is[R][2];
  if constexpr (kOnly) {
    alignas(32) float acc[R][64];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 8; ++v) _mm256_store_ps(&acc[r][8 * v], _mm256_setzero_ps());
    for (int64_t g = 0; g < a.groups; ++g) {
      const uint8_t* blk = panel + g * kGroupBytes;
      for (int u = 0; u < quarters; ++u) {
        quarter_sums<R>(a, blk, g, u, is);
        add_quarter<R>(a, blk, g, u, is, &acc[0][16 * u], 64);
      }
    }
    store_rows<R>(&acc[0][0], 64, 8, c, ldc, cols, beta);
  } else {
    for (int u = 0; u < quarters; ++u) {
      alignas(32) float acc[R][16];
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < 2; ++v) _mm256_store_ps(&acc[r][8 * v], _mm256_setzero_ps());
      for (int64_t g = 0; g < a.groups; ++g) {
        const uint8_t* blk = panel + g * kGroupBytes;
        quarter_sums<R>(a, blk, g, u, is);
        add_quarter<R>(a, blk, g, u, is, &acc[0][0], 16);
      }
      store_rows<R>(&acc[0][0], 16, 2, c + 16 * u, ldc, cols - 16 * u, beta);
    }
  }
}

}  // namespace

void quantize_row(const float* a, int64_t k, int8_t* q, float* scale, int32_t* sum) {
  // As int8_quantize_row (see the AVX-512 version); a tail group is copied into a zero-padded
  // buffer first.
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int64_t groups = (k + 31) / 32;
  alignas(32) float tail[32];
  for (int64_t g = 0; g < groups; ++g) {
    const float* src = a + 32 * g;
    if (k - 32 * g < 32) {
      for (int64_t i = 0; i < 32; ++i) tail[i] = i < k - 32 * g ? src[i] : 0.0f;
      src = tail;
    }
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(src + 8 * j);
      v[j] = _mm256_and_ps(v[j], _mm256_cmp_ps(v[j], v[j], _CMP_ORD_Q));  // NaN -> 0
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[g] = amax / 127.0f;
    const __m256 vi = _mm256_set1_ps(inv);
    __m256i qi[4];
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      __m256 p = _mm256_mul_ps(v[j], vi);
      p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q));  // inf * 0
      qi[j] = _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(p)));
      s = _mm256_add_epi32(s, qi[j]);
    }
    // int32 -> int8 in order: the packs work within 128-bit lanes, the permute puts them back.
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * g), p8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    sum[g] = _mm_cvtsi128_si32(s4);
  }
}

// gemv_panels' step (int8_gemv.inc): the weights' bytes made signed again and the activations'
// signs moved onto them, |a| x +-w pair sums by maddubs, then madd with ones.
struct GemvStep {
  static constexpr bool kUsesMagnitude = true;
  static __m256i init(int32_t) { return _mm256_setzero_si256(); }
  static __m256i dot(__m256i acc, __m256i w, __m256i x, __m256i ax) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i sw = _mm256_sign_epi8(_mm256_xor_si256(w, flip), x);
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sw), _mm256_set1_epi16(1)));
  }
};

#include "kernels/cpu/int8_gemv.inc"
#include "kernels/cpu/int8_panel_rows.inc"

}  // namespace ltm::kernels::cpu::int8::avx2
#endif
