// packed_gemm for bf16 panels on Intel AMX (TMUL, bf16 tiles): prefill-sized GEMMs (many rows
// of A) at several times the AVX-512 FMA rate. Target flags: kernels/CMakeLists.txt. Include
// only isa_kernels.h and intrinsics here (see isa_kernels.h).
//
// A (fp32 activations) is rounded to bf16 by the caller (amx_round_rows), as oneDNN and llama.cpp
// do for bf16 weights; accumulation is fp32. For each 64-column panel [k, 64] (bf16 elements, the
// packed layout of packed_gemm.h) the kernel first interleaves pairs of panel rows into the VNNI
// layout the tiles read (row q of the copy holds, for each column, rows 2q and 2q + 1), then for
// every 16 rows of A multiplies 16 x 32 A tiles by four 16-pair x 16-column B tiles into four
// 16 x 16 fp32 C tiles.
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__))
#error "packed_gemm_amx.cpp needs -mamx-tile -mamx-bf16 -mavx512bw (kernels/CMakeLists.txt)"
#endif

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu::amx {
namespace {

constexpr int64_t kWidth = 64;  // kPanelWidth
constexpr int kTileK = 32;      // bf16 elements of k per tile step

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (16 x 16 fp32), 4: A (16 rows x 32 bf16), 5 and 6: B (16 pairs x 16 columns).
void configure_tiles() {
  static thread_local bool configured = false;
  if (configured) return;
  TileConfig cfg;
  for (int t = 0; t < 7; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  configured = true;
}

}  // namespace

bool request_amx() {
  // Linux hands out the AMX tile state only to processes that ask (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA); CPUID may report AMX on a kernel or VM that does not allow it.
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

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
                     int64_t ldc, int64_t m, int64_t k, int64_t cols, float beta,
                     uint16_t* vnni, float* c_tile, const uint16_t* next_panel) {
  configure_tiles();
  // The panel as pairs of rows, [kpad / 2][64 columns][2]; rows past k are zero.
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i hi_idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25,
                                          56, 24, 55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18,
                                          49, 17, 48, 16);
  for (int64_t q = 0; q < kpad / 2; ++q) {
    const int64_t p = 2 * q;
    if (next_panel != nullptr && p < k) {
      // Rows p and p + 1 of the next panel (256 bytes, 4 lines): one panel ahead of the reads.
      const char* nx = reinterpret_cast<const char*>(next_panel + p * kWidth);
      _mm_prefetch(nx, _MM_HINT_T1);
      _mm_prefetch(nx + 64, _MM_HINT_T1);
      if (p + 1 < k) {
        _mm_prefetch(nx + 128, _MM_HINT_T1);
        _mm_prefetch(nx + 192, _MM_HINT_T1);
      }
    }
    for (int half = 0; half < 2; ++half) {  // columns [32 half, 32 half + 32)
      const __m512i x = p < k ? _mm512_loadu_si512(panel + p * kWidth + 32 * half)
                              : _mm512_setzero_si512();
      const __m512i y = p + 1 < k ? _mm512_loadu_si512(panel + (p + 1) * kWidth + 32 * half)
                                  : _mm512_setzero_si512();
      uint16_t* dst = vnni + q * 2 * kWidth + 64 * half;
      _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(x, lo_idx, y));
      _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(x, hi_idx, y));
    }
  }
  const __mmask16 full = 0xFFFF;
  for (int64_t i = 0; i < m; i += 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    // Rows past m of the last block read the rows below (the caller pads A to whole tiles).
    const uint16_t* ai = a16 + i * kpad;
    for (int64_t kk = 0; kk < kpad; kk += kTileK) {
      _tile_loadd(4, ai + kk, kpad * 2);
      const uint16_t* bq = vnni + (kk / 2) * 2 * kWidth;  // 16 pairs, stride 256 bytes
      _tile_loadd(5, bq, 2 * kWidth * 2);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, bq + 32, 2 * kWidth * 2);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, bq + 64, 2 * kWidth * 2);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(6, bq + 96, 2 * kWidth * 2);
      _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, c_tile, kWidth * 4);
    _tile_stored(1, c_tile + 16, kWidth * 4);
    _tile_stored(2, c_tile + 32, kWidth * 4);
    _tile_stored(3, c_tile + 48, kWidth * 4);
    const int64_t rows = m - i < 16 ? m - i : 16;
    const __m512 vb = _mm512_set1_ps(beta);
    for (int64_t r = 0; r < rows; ++r) {
      float* cr = c + (i + r) * ldc;
      for (int v = 0; v < 4; ++v) {
        const int64_t c0 = 16 * v;
        if (c0 >= cols) break;
        const __mmask16 mk = cols - c0 >= 16 ? full : __mmask16((1u << (cols - c0)) - 1);
        __m512 out = _mm512_loadu_ps(c_tile + r * kWidth + c0);
        if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, cr + c0), out);
        _mm512_mask_storeu_ps(cr + c0, mk, out);
      }
    }
  }
}

}  // namespace ltm::kernels::cpu::amx

#endif
