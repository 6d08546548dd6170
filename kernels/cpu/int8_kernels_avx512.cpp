// int8_gemm's panel kernel for AVX-512 VNNI (target flags: kernels/CMakeLists.txt): vpdpbusd
// multiplies the weights' unsigned bytes (q_w + 128) by the activations' signed ones, four to a
// 32-bit lane (one lane per column, int8_gemm.h's layout); each lane starts at -128 * (the group's
// activation sum), so that it ends at the signed dot product. Include only int8_kernels.h and
// intrinsics here (see isa_kernels.h why).
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__FMA__))
#error "int8_kernels_avx512.cpp needs -mavx512f -mavx512vnni -mfma (kernels/CMakeLists.txt)"
#endif

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/cpu/int8_kernels.h"

namespace ltm::kernels::cpu::int8::avx512 {
namespace {

constexpr int64_t kGroupBytes = 2176;

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Rows [0, R) of A (a points at the first) times one panel: C[R, cols] = A @ P + beta * C; the
// panel read once front to back whatever kOnly (see the AVX2 tile).
template <int R, bool kOnly>
inline void tile(const QuantRows& a, const uint8_t* panel, float* c, int64_t ldc, int64_t cols,
                 float beta) {
  const int64_t groups = a.groups, kq = groups * 32;
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* blk = panel + g * kGroupBytes;
    __m512i is[R][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i init = _mm512_set1_epi32(-128 * a.sum[r * groups + g]);
      for (int v = 0; v < 4; ++v) is[r][v] = init;
    }
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      const uint8_t* wq = blk + 128 + 256 * t;
      const __m512i w0 = _mm512_loadu_si512(wq), w1 = _mm512_loadu_si512(wq + 64);
      const __m512i w2 = _mm512_loadu_si512(wq + 128), w3 = _mm512_loadu_si512(wq + 192);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_set1_epi32(load_i32(a.q + r * kq + 32 * g + 4 * t));
        is[r][0] = _mm512_dpbusd_epi32(is[r][0], w0, x);
        is[r][1] = _mm512_dpbusd_epi32(is[r][1], w1, x);
        is[r][2] = _mm512_dpbusd_epi32(is[r][2], w2, x);
        is[r][3] = _mm512_dpbusd_epi32(is[r][3], w3, x);
      }
    }
    __m512 sw[4];
    for (int v = 0; v < 4; ++v)
      sw[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * v)));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 sa = _mm512_set1_ps(a.scale[r * groups + g]);
      for (int v = 0; v < 4; ++v)
        acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][v]), _mm512_mul_ps(sw[v], sa), acc[r][v]);
    }
  }
  const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    for (int v = 0; v < 4; ++v) {
      const int64_t left = cols - 16 * v;
      if (left <= 0) break;
      const __mmask16 mk = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      __m512 out = acc[r][v];
      if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, cr + 16 * v), out);
      _mm512_mask_storeu_ps(cr + 16 * v, mk, out);
    }
  }
}

}  // namespace

void quantize_row(const float* a, int64_t k, int8_t* q, float* scale, int32_t* sum) {
  // As int8_quantize_row: NaN lanes count as zero, the product a * (127 / amax) rounded to
  // nearest even (vcvtps2dq under the default rounding) and clamped to +-127.
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const int64_t groups = (k + 31) / 32;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = k - 32 * g < 32 ? k - 32 * g : 32;
    const __mmask16 m0 = rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
    const __mmask16 m1 = rows >= 32 ? __mmask16(0xFFFF)
                         : rows > 16 ? __mmask16((1u << (rows - 16)) - 1) : __mmask16(0);
    __m512 v0 = _mm512_maskz_loadu_ps(m0, a + 32 * g), v1 = _mm512_maskz_loadu_ps(m1, a + 32 * g + 16);
    v0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v0, v0, _CMP_ORD_Q), v0);
    v1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v1, v1, _CMP_ORD_Q), v1);
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[g] = amax / 127.0f;
    const __m512 vi = _mm512_set1_ps(inv);
    __m512 p0 = _mm512_mul_ps(v0, vi), p1 = _mm512_mul_ps(v1, vi);
    p0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p0, p0, _CMP_ORD_Q), p0);  // inf * 0
    p1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p1, p1, _CMP_ORD_Q), p1);
    const __m512i q0 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(p0)));
    const __m512i q1 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(p1)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * g), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * g + 16), _mm512_cvtepi32_epi8(q1));
    sum[g] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }
}

// gemv_panels' step (int8_gemv.inc): 256-bit vpdpbusd (AVX512-VL). On the AMD EPYC Zen 4 VM,
// with the weights streamed from memory, a form with 512-bit loads and 16 accumulators read
// 0.7-0.8x the bytes a second of this walk (docs/benchmarks.md, "Issue 22 on the AMD EPYC Zen 4
// VM").
struct GemvStep {
  static constexpr bool kUsesMagnitude = false;
  static __m256i init(int32_t sum) { return _mm256_set1_epi32(-128 * sum); }
  static __m256i dot(__m256i acc, __m256i w, __m256i x, __m256i) {
    return _mm256_dpbusd_epi32(acc, w, x);
  }
};

#include "kernels/cpu/int8_gemv.inc"
#include "kernels/cpu/int8_panel_rows.inc"

}  // namespace ltm::kernels::cpu::int8::avx512
#endif
