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

// C[R rows, 64 cols] (masked by mk[]) = A[R, k] @ P + beta * C for one panel P [k, 64].
template <int R, bool kMasked>
inline void nt_tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                    int64_t ldc, int64_t k, float beta, const __mmask16* mk, bool prefetch) {
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
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    if (p < kp) {
      const char* pf = reinterpret_cast<const char*>(bp + kPrefetch * ldb);
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      _mm_prefetch(pf + 128, _MM_HINT_T0);
      _mm_prefetch(pf + 192, _MM_HINT_T0);
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

// B is walked in chunks of kKChunk rows ([kKChunk x 64] = 32 KB stays in L1 while every row
// group of A uses it); C accumulates across chunks.
template <bool kMasked>
void nt_rows(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
             int64_t m, int64_t k, float beta, const __mmask16* mk) {
  int64_t p0 = 0;
  do {
    const int64_t kc = min_i(kKChunk, k - p0);
    const float* bp = b + p0 * ldb;
    const float bt = p0 == 0 ? beta : 1.0f;
    for (int64_t i = 0; i < m; i += kMaxRows) {
      const float* ai = a + i * lda + p0;
      float* ci = c + i * ldc;
      const bool pf = i == 0;  // the first row group pulls the B chunk from memory
      switch (min_i(m - i, kMaxRows)) {
        case 6: nt_tile<6, kMasked>(ai, lda, bp, ldb, ci, ldc, kc, bt, mk, pf); break;
        case 5: nt_tile<5, kMasked>(ai, lda, bp, ldb, ci, ldc, kc, bt, mk, pf); break;
        case 4: nt_tile<4, kMasked>(ai, lda, bp, ldb, ci, ldc, kc, bt, mk, pf); break;
        case 3: nt_tile<3, kMasked>(ai, lda, bp, ldb, ci, ldc, kc, bt, mk, pf); break;
        case 2: nt_tile<2, kMasked>(ai, lda, bp, ldb, ci, ldc, kc, bt, mk, pf); break;
        default: nt_tile<1, kMasked>(ai, lda, bp, ldb, ci, ldc, kc, bt, mk, pf); break;
      }
    }
    p0 += kc;
  } while (p0 < k);
}

}  // namespace

void panel_gemm(const float* a, const float* panel, float* c, int64_t ldc, int64_t m, int64_t k,
                int64_t cols, float beta) {
  if (cols == kWidth) {
    nt_rows<false>(a, k, panel, kWidth, c, ldc, m, k, beta, nullptr);
    return;
  }
  __mmask16 mk[4];
  for (int v = 0; v < 4; ++v) {
    const int64_t left = cols - 16 * v;
    const int64_t n = left < 0 ? 0 : (left > 16 ? 16 : left);
    mk[v] = static_cast<__mmask16>((1u << n) - 1u);
  }
  nt_rows<true>(a, k, panel, kWidth, c, ldc, m, k, beta, mk);
}

}  // namespace ltm::kernels::cpu::avx512
#endif
