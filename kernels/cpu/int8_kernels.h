// Internal to kernels/cpu: the per-ISA bodies of int8_gemm (int8_gemm.h), chosen at run time in
// int8_gemm.cpp. As isa_kernels.h: each ISA's functions live in its own namespace, compiled only
// in that ISA's translation unit, and this header holds declarations only.
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu::int8 {

// A [m, k] quantized per row and group of 32 (int8_gemm.h): q [m, groups * 32] (zero past k),
// scale [m, groups] (fp32), sum [m, groups] (the sum of a group's q, for kernels that multiply
// q by the weights' unsigned bytes q_w + 128 and take 128 * sum off).
struct QuantRows {
  const int8_t* q;
  const float* scale;
  const int32_t* sum;
  int64_t groups;
};

#define LTM_DECLARE_INT8_KERNELS(ns)                                                             \
  namespace ns {                                                                                 \
  /* C[m, cols] = A @ P + beta * C for one panel P (int8_gemm.h layout) and rows [0, m) of A */ \
  /* (a points at the first of them); only the first `cols` columns of C are written */         \
  void panel_gemm(const QuantRows& a, const uint8_t* panel, float* c, int64_t ldc, int64_t m,   \
                  int64_t cols, float beta);                                                     \
  }

// One row of A quantized as int8_quantize_row does it, bit for bit (int8_gemm.h), plus each
// group's sum: q gets groups * 32 values, scale and sum one per group. The portable path runs
// int8_quantize_row itself (int8_gemm.cpp).
#define LTM_DECLARE_INT8_QUANTIZE(ns)                                                            \
  namespace ns {                                                                                 \
  void quantize_row(const float* a, int64_t k, int8_t* q, float* scale, int32_t* sum);           \
  }

LTM_DECLARE_INT8_KERNELS(portable)
#if defined(__x86_64__) || defined(__i386__)
LTM_DECLARE_INT8_KERNELS(avx2)
LTM_DECLARE_INT8_QUANTIZE(avx2)
namespace avx2 {
// As avx512::gemv_panels below, on AVX2.
void gemv_panels(const QuantRows& a, const uint8_t* panels, int64_t panel_bytes, int n_panels,
                 float* c, int64_t cols, float beta, int64_t ahead_groups);
}  // namespace avx2
LTM_DECLARE_INT8_QUANTIZE(avx512)
LTM_DECLARE_INT8_KERNELS(avx512)  // AVX-512 VNNI
namespace avx512 {
// One row of A (decode) times n_panels <= 4 consecutive panels (panel_bytes apart; C gets `cols`
// <= 64 n_panels columns), streamed together: several sequential reads per core keep the memory
// system busier than one. One walk for both units (int8_gemv.inc). ahead_groups: how many
// group blocks ahead of the one being read the software prefetch runs (0 or 1; int8_gemm.cpp
// chooses).
void gemv_panels(const QuantRows& a, const uint8_t* panels, int64_t panel_bytes, int n_panels,
                 float* c, int64_t cols, float beta, int64_t ahead_groups);
}  // namespace avx512
// AMX-INT8 (int8_kernels_amx.cpp), outside the ISA table: an addition to the AVX-512 path for
// prefill-sized m (int8_gemm.cpp says when).
namespace amx {
struct alignas(64) TileSave {
  uint8_t bytes[64];
};
// Loads this kernel's tile configuration, saving the one loaded before into `saved`; tiles_end
// puts it back (or releases the tiles if none was). One pair around each thread's share of work.
void tiles_begin(TileSave* saved);
void tiles_end(const TileSave* saved);
// The panel's weight bytes (not its scales) xor 0x80, i.e. signed, group after group:
// groups * 2048 bytes to `out`.
void signed_panel(const uint8_t* panel, int64_t groups, int8_t* out);
// C[m, cols] = A @ P + beta * C for one panel: `wsigned` is signed_panel's copy of it, `panel`
// the panel itself (for its scales). A's q must hold whole blocks of 16 rows: rows m .. the next
// multiple of 16 are read (any values) and their products dropped.
void panel_gemm(const QuantRows& a, const int8_t* wsigned, const uint8_t* panel, float* c,
                int64_t ldc, int64_t m, int64_t cols, float beta);
}  // namespace amx
#endif

}  // namespace ltm::kernels::cpu::int8
