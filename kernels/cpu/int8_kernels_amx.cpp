// int8_gemm's prefill kernel on Intel AMX-INT8 (target flags: kernels/CMakeLists.txt). Include
// only int8_kernels.h and intrinsics here (see isa_kernels.h why).
//
// One tdpbssd multiplies a 16-row x 32-byte A tile (16 rows of quantized activations, one group
// of 32 along k) by an 8-row x 64-byte B tile (the group's 8 quads of 4 rows for 16 columns:
// int8_gemm.h's layout is the VNNI layout the tiles read, 256 bytes a quad) into a 16 x 16 int32
// C tile: the group's exact integer sums. Each group has its own scales (the activations' per
// row, the weights' per column), so the four C tiles of a group (64 columns) are stored and
// scaled into fp32 accumulators with AVX-512, group after group: per group and 16 x 64 block, 4
// tile products and 64 vector convert + multiply + fma. The weights' bytes are stored unsigned
// (q + 128, for vpdpbusd): a panel is first copied once, xor 0x80, into a signed buffer that every
// block of 16 rows then reads (tdpbssd, s8 x s8: no correction term), with its tiles packed per
// group.
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__))
#error "int8_kernels_amx.cpp needs -mamx-tile -mamx-int8 -mavx512f (kernels/CMakeLists.txt)"
#endif

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's _mm512_cvtph_ps
#include <immintrin.h>

#include "kernels/cpu/int8_kernels.h"

namespace ltm::kernels::cpu::int8::amx {
namespace {

constexpr int64_t kGroupBytes = 2176;
constexpr int64_t kSignedGroupBytes = 2048;  // 8 quads x 256 bytes

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

}  // namespace

void tiles_begin(TileSave* saved) {
  // The AMX-BF16 kernel (packed_gemm_amx.cpp) configures its tiles once per thread and relies on
  // them staying so: this kernel saves whatever configuration is loaded and puts it back after.
  _tile_storeconfig(saved->bytes);
  __asm__ __volatile__("" : : "r"(saved) : "memory");  // all 64 bytes are written
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) {  // C: two sets of two 16 x 16 int32
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  for (int t = 4; t < 6; ++t) {  // A: 16 rows x one group of 32 bytes, one per set
    cfg.colsb[t] = 32;
    cfg.rows[t] = 16;
  }
  for (int t = 6; t < 8; ++t) {  // B: 8 quad rows x 16 columns of 4 bytes
    cfg.colsb[t] = 64;
    cfg.rows[t] = 8;
  }
  // GCC's _tile_loadconfig names only the first byte as read: without this the compiler drops
  // the stores above (seen with GCC 12: ldtilecfg of a zeroed config, then #UD at tilezero).
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

void tiles_end(const TileSave* saved) {
  if (saved->bytes[0] != 0) {
    __asm__ __volatile__("" : : "r"(saved) : "memory");
    _tile_loadconfig(saved->bytes);
  } else {
    _tile_release();  // nothing was configured before
  }
}

void signed_panel(const uint8_t* panel, int64_t groups, int8_t* out) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* src = panel + g * kGroupBytes + 128;
    int8_t* dst = out + g * kSignedGroupBytes;
    for (int64_t e = 0; e < kSignedGroupBytes; e += 64)
      _mm512_storeu_si512(dst + e, _mm512_xor_si512(_mm512_loadu_si512(src + e), flip));
  }
}

namespace {

// Group g's products for 32 columns (half of the panel) into the C tiles C0 and C1, A from tile
// TA; B tiles 6 and 7. (GCC's tile intrinsics take literal tile numbers: macros, not templates.)
#define LTM_INT8_AMX_ISSUE(C0, C1, TA, a, kq, b) \
  do {                                           \
    _tile_zero(C0);                              \
    _tile_zero(C1);                              \
    _tile_loadd(TA, a, kq);                      \
    _tile_loadd(6, b, 256);                      \
    _tile_dpbssd(C0, TA, 6);                     \
    _tile_loadd(7, (b) + 64, 256);               \
    _tile_dpbssd(C1, TA, 7);                     \
  } while (0)

}  // namespace

void panel_gemm(const QuantRows& a, const int8_t* wsigned, const uint8_t* panel, float* c,
                int64_t ldc, int64_t m, int64_t cols, float beta) {
  // Per block of 16 rows and half of the panel (32 columns), group after group, two sets of C
  // tiles in turn: group g + 1's tile products are issued before group g's are stored and
  // scaled, so that the tile unit works while AVX-512 scales.
  const int64_t groups = a.groups, kq = groups * 32;
  alignas(64) float acc[16][32];
  alignas(64) int32_t cb[16][32];
  const __m512 vb = _mm512_set1_ps(beta);
  for (int64_t i = 0; i < m; i += 16) {
    const int64_t rows = m - i < 16 ? m - i : 16;
    const int8_t* ai = a.q + i * kq;  // rows past m read the caller's padding rows
    const float* sa_col = a.scale + i * groups;
    for (int h = 0; h < 2 && 32 * h < cols; ++h) {
      for (int r = 0; r < 16; ++r) {
        _mm512_store_ps(&acc[r][0], _mm512_setzero_ps());
        _mm512_store_ps(&acc[r][16], _mm512_setzero_ps());
      }
      const int8_t* bh = wsigned + 128 * h;
      LTM_INT8_AMX_ISSUE(0, 1, 4, ai, kq, bh);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t g1 = g + 1;
        if (g1 < groups) {
          if (g1 % 2 == 0) {
            LTM_INT8_AMX_ISSUE(0, 1, 4, ai + 32 * g1, kq, bh + g1 * kSignedGroupBytes);
          } else {
            LTM_INT8_AMX_ISSUE(2, 3, 5, ai + 32 * g1, kq, bh + g1 * kSignedGroupBytes);
          }
        }
        if (g % 2 == 0) {
          _tile_stored(0, &cb[0][0], 128);
          _tile_stored(1, &cb[0][16], 128);
        } else {
          _tile_stored(2, &cb[0][0], 128);
          _tile_stored(3, &cb[0][16], 128);
        }
        const uint8_t* blk = panel + g * kGroupBytes + 64 * h;
        const __m512 sw0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
        const __m512 sw1 =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
        for (int64_t r = 0; r < rows; ++r) {
          const __m512 sa = _mm512_set1_ps(sa_col[r * groups + g]);
          const __m512 x0 = _mm512_cvtepi32_ps(_mm512_load_si512(&cb[r][0]));
          const __m512 x1 = _mm512_cvtepi32_ps(_mm512_load_si512(&cb[r][16]));
          _mm512_store_ps(&acc[r][0],
                          _mm512_fmadd_ps(x0, _mm512_mul_ps(sw0, sa), _mm512_load_ps(&acc[r][0])));
          _mm512_store_ps(&acc[r][16],
                          _mm512_fmadd_ps(x1, _mm512_mul_ps(sw1, sa), _mm512_load_ps(&acc[r][16])));
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* cr = c + (i + r) * ldc + 32 * h;
        for (int v = 0; v < 2; ++v) {
          const int64_t left = cols - 32 * h - 16 * v;
          if (left <= 0) break;
          const __mmask16 mk = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
          __m512 out = _mm512_load_ps(&acc[r][16 * v]);
          if (beta != 0.0f) out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, cr + 16 * v), out);
          _mm512_mask_storeu_ps(cr + 16 * v, mk, out);
        }
      }
    }
  }
}

}  // namespace ltm::kernels::cpu::int8::amx
#endif
