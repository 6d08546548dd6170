// packed_gemm for bf16 panels on Intel AMX (TMUL, bf16 tiles): prefill-sized GEMMs (many rows
// of A) at several times the AVX-512 FMA rate. Target flags: kernels/CMakeLists.txt. Include
// only isa_kernels.h and intrinsics here (see isa_kernels.h).
//
// A (fp32 activations) is rounded to bf16 by the caller (avx512::bf16dot::round_rows_bf16), as
// oneDNN and llama.cpp do for bf16 weights; accumulation is fp32. A bf16 panel is packed in pairs of rows
// (packed_gemm.h), which is the VNNI layout the tiles read: for every 16 rows of A the kernel
// multiplies 16 x 32 A tiles by four 16-pair x 16-column B tiles, loaded from the panel itself,
// into four 16 x 16 fp32 C tiles.
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

void panel_gemm_bf16(const uint16_t* a16, int64_t kpad, const uint16_t* panel, float* c,
                     int64_t ldc, int64_t m, int64_t k, int64_t cols, float beta,
                     uint16_t* tail, float* c_tile, const uint16_t* next_panel) {
  configure_tiles();
  // The panel's pairs of rows (packed_gemm.h) are the VNNI layout the B tiles take: a tile is 16
  // pair rows (32 rows of k) x 16 columns, 64 bytes of each 256-byte pair row. Whole tiles load
  // straight from the panel; the pair rows after the last whole tile (k not a multiple of 32) are
  // copied into `tail` and zero-padded, so that no load reads past the panel.
  constexpr int64_t kPair = 2 * kWidth;             // elements of a pair row
  constexpr int64_t kStride = kPair * 2;            // its bytes
  const int64_t pairs = (k + 1) / 2;
  const int64_t whole = pairs / 16 * kTileK;        // k covered by whole tiles of the panel
  if (whole < kpad) {
    const int64_t q0 = whole / 2, n = pairs - q0;
    for (int64_t e = 0; e < n * kPair; e += 32)
      _mm512_storeu_si512(tail + e, _mm512_loadu_si512(panel + q0 * kPair + e));
    for (int64_t e = n * kPair; e < 16 * kPair; e += 32)
      _mm512_storeu_si512(tail + e, _mm512_setzero_si512());
  }
  // The next panel into L2 while the first 16 rows run, spread over their k steps.
#ifndef PG_AMX_NEXT
#define PG_AMX_NEXT 1
#endif
  const int64_t next_lines = PG_AMX_NEXT && next_panel != nullptr ? pairs * kStride / 64 : 0;
  const int64_t steps = kpad / kTileK;
  const int64_t per_step = (next_lines + steps - 1) / steps;
  const char* next_bytes = reinterpret_cast<const char*>(next_panel);
  const __mmask16 full = 0xFFFF;
  for (int64_t i = 0; i < m; i += 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    // Rows past m of the last block read the rows below (the caller pads A to whole tiles).
    const uint16_t* ai = a16 + i * kpad;
    for (int64_t kk = 0; kk < kpad; kk += kTileK) {
      if (i == 0) {
        for (int64_t l = (kk / kTileK) * per_step, e = l + per_step; l < e && l < next_lines; ++l)
          _mm_prefetch(next_bytes + l * 64, _MM_HINT_T1);
      }
      _tile_loadd(4, ai + kk, kpad * 2);
      const uint16_t* bq = kk < whole ? panel + (kk / 2) * kPair : tail;  // 16 pair rows
      _tile_loadd(5, bq, kStride);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, bq + 32, kStride);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, bq + 64, kStride);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(6, bq + 96, kStride);
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
