// Internal to kernels/cpu: the per-ISA kernel bodies and the dispatch table over them.
//
// Every ISA-specific function lives in a namespace named after its ISA (avx512::, avx2::,
// portable::) and is compiled only in that ISA's translation units, which include nothing but
// this header, <immintrin.h> and the ISA's own code: no inline function or template that a
// baseline translation unit could also instantiate (that copy could be the one the linker keeps,
// and run AVX instructions on a CPU without them). The threading (OpenMP) stays in the baseline
// callers; the table entries are serial.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace ltm::kernels::cpu {

struct KernelTable {
  // One 64-column panel: C[m, cols] = A[m, k] @ P + beta * C for P [k, 64] (lda = k); only the
  // first `cols` columns of C are written. beta == 0: C is not read.
  void (*panel_gemm)(const float* a, const float* panel, float* c, int64_t ldc, int64_t m,
                     int64_t k, int64_t cols, float beta);
  // x[r, :] = gelu_tanh(x[r, :] + bias) for rows r in [0, rows); bias may be null.
  void (*bias_gelu)(float* x, const float* bias, int64_t rows, int64_t cols);
  // One row of LayerNorm (x and y may alias).
  void (*layer_norm_row)(const float* x, const float* gamma, const float* beta, float* y,
                         int64_t cols, float eps);
  void (*add)(float* x, const float* y, int64_t n);                           // x += y
  void (*add_bias)(float* x, const float* bias, int64_t rows, int64_t cols);  // x[r,:] += bias
  // One (sequence, head, tile of up to kQueryTile query rows) of decode attention; `scores`
  // holds kQueryTile * context floats. head < 0: every head of the tile's rows (each row's heads
  // a cache block at a time on the vector paths, the same bits as head by head); `scores` then
  // holds max(n_head, kQueryTile) * context floats.
  void (*attend_tile)(const PagedAttentionShape& s, int seq, int head, int row_begin, int n_rows,
                      const float* qkv, const float* k_cache, const float* v_cache, float* out,
                      float* scores);
  // sc[p] = exp(sc[p] - mx) for p < n, returns the sum (the matrix attention's softmax rows).
  float (*exp_shift_sum)(float* sc, int64_t n, float mx);

  // 16-bit weights (weight_type.h): panel_gemm for a panel of bf16 / fp16 elements, same layout
  // (row p of the panel = 64 elements), converted to fp32 as read; fp32 accumulation.
  void (*panel_gemm_bf16)(const float* a, const uint16_t* panel, float* c, int64_t ldc,
                          int64_t m, int64_t k, int64_t cols, float beta);
  void (*panel_gemm_f16)(const float* a, const uint16_t* panel, float* c, int64_t ldc,
                         int64_t m, int64_t k, int64_t cols, float beta);
  // attend_tile over caches of bf16 / fp16 elements (s.kv_type says which; these ignore it).
  void (*attend_tile_bf16)(const PagedAttentionShape& s, int seq, int head, int row_begin,
                           int n_rows, const float* qkv, const uint16_t* k_cache,
                           const uint16_t* v_cache, float* out, float* scores);
  void (*attend_tile_f16)(const PagedAttentionShape& s, int seq, int head, int row_begin,
                          int n_rows, const float* qkv, const uint16_t* k_cache,
                          const uint16_t* v_cache, float* out, float* scores);
  // n elements converted, bit-identical to weight_type.h's scalar functions on every path.
  void (*bf16_to_f32_n)(const uint16_t* src, float* dst, int64_t n);
  void (*f16_to_f32_n)(const uint16_t* src, float* dst, int64_t n);
  void (*f32_to_bf16_n)(const float* src, uint16_t* dst, int64_t n);
  void (*f32_to_f16_n)(const float* src, uint16_t* dst, int64_t n);
  // The Llama family's rows (llama_kernels.inc): one row of RMSNorm (in and out may alias);
  // out = silu(gate) * up over cols; rotate-half RoPE in place on n_heads consecutive heads with
  // cos_sin = [cos of head_dim / 2 angles | their sin].
  void (*rms_norm_row)(const float* in, const float* w, float* out, int64_t cols, float eps);
  void (*silu_mul_row)(const float* gate, const float* up, float* out, int64_t cols);
  void (*rope_row)(float* x, const float* cos_sin, int64_t n_heads, int64_t head_dim);
  // out[j] = x . a[j, :] for j < rows, a [rows, k] row-major: one row of X A^T (gemm_rows_nt),
  // each sum in the order of `dot` (vec_kernels.inc), whatever the caller's row count.
  void (*dot_rows)(const float* x, const float* a, float* out, int64_t k, int64_t rows);
};

// How a GEMM over `panels` column panels and m rows of A is cut into (panel, block of rows)
// items for `threads` threads (packed_gemm.cpp; int8_gemm.cpp uses it too).
struct RowSplit {
  int64_t blocks;
  int64_t rows;  // rows per block
};
RowSplit split_rows(int64_t m, int64_t panels, int threads);

inline constexpr int kQueryTile = 4;  // attention query rows computed together

// The table in use (chosen on the first call).
const KernelTable& kernel_table();

#define LTM_DECLARE_ISA_KERNELS(ns)                                                              \
  namespace ns {                                                                                 \
  void panel_gemm(const float* a, const float* panel, float* c, int64_t ldc, int64_t m,          \
                  int64_t k, int64_t cols, float beta);                                          \
  void bias_gelu(float* x, const float* bias, int64_t rows, int64_t cols);                       \
  void layer_norm_row(const float* x, const float* gamma, const float* beta, float* y,           \
                      int64_t cols, float eps);                                                  \
  void add(float* x, const float* y, int64_t n);                                                 \
  void add_bias(float* x, const float* bias, int64_t rows, int64_t cols);                        \
  void attend_tile(const PagedAttentionShape& s, int seq, int head, int row_begin, int n_rows,   \
                   const float* qkv, const float* k_cache, const float* v_cache, float* out,     \
                   float* scores);                                                               \
  float exp_shift_sum(float* sc, int64_t n, float mx);                                           \
  void panel_gemm_bf16(const float* a, const uint16_t* panel, float* c, int64_t ldc, int64_t m,  \
                       int64_t k, int64_t cols, float beta);                                     \
  void panel_gemm_f16(const float* a, const uint16_t* panel, float* c, int64_t ldc, int64_t m,   \
                      int64_t k, int64_t cols, float beta);                                      \
  void attend_tile_bf16(const PagedAttentionShape& s, int seq, int head, int row_begin,          \
                        int n_rows, const float* qkv, const uint16_t* k_cache,                   \
                        const uint16_t* v_cache, float* out, float* scores);                     \
  void attend_tile_f16(const PagedAttentionShape& s, int seq, int head, int row_begin,           \
                       int n_rows, const float* qkv, const uint16_t* k_cache,                    \
                       const uint16_t* v_cache, float* out, float* scores);                      \
  void bf16_to_f32_n(const uint16_t* src, float* dst, int64_t n);                                \
  /* rows [2q0, 2q0 + rows) of a bf16 panel (pairs of rows, packed_gemm.h) as fp32 [rows][64]; */\
  /* src = the pair row q0, rows may be odd (the last pair's second row is then not written) */  \
  void bf16_pairs_to_f32(const uint16_t* src, float* dst, int64_t rows);                         \
  void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n);                                 \
  void f32_to_bf16_n(const float* src, uint16_t* dst, int64_t n);                                \
  void f32_to_f16_n(const float* src, uint16_t* dst, int64_t n);                                 \
  void rms_norm_row(const float* in, const float* w, float* out, int64_t cols, float eps);       \
  void silu_mul_row(const float* gate, const float* up, float* out, int64_t cols);               \
  void rope_row(float* x, const float* cos_sin, int64_t n_heads, int64_t head_dim);              \
  void dot_rows(const float* x, const float* a, float* out, int64_t k, int64_t rows);            \
  }

LTM_DECLARE_ISA_KERNELS(portable)
#if defined(__x86_64__) || defined(__i386__)
#define LTM_CPU_X86 1
LTM_DECLARE_ISA_KERNELS(avx2)
LTM_DECLARE_ISA_KERNELS(avx512)
namespace avx512 {
// One row of A (decode) times up to 4 consecutive panels (cols <= 256; C gets `cols` columns):
// the panels are streamed together. type: 0 fp32, 1 bf16, 2 fp16 panels. packed_gemm uses it for
// m == 1 on the AVX-512 path.
void gemv_panels(const float* a, const void* panels, int type, float* c, int64_t k, int64_t cols,
                 float beta);
}  // namespace avx512
namespace avx2 {
// The same on the AVX2 path for m = 1 or 2 rows of A (k apart; C's rows ldc apart): the panels
// take turns, their accumulators in L1 between turns. ahead16: bytes a 16-bit panel's stream is
// prefetched ahead (a multiple of its 256-byte unit; packed_gemm.cpp chooses).
void gemv_panels(const float* a, int64_t m, const void* panels, int type, float* c, int64_t ldc,
                 int64_t k, int64_t cols, float beta, int64_t ahead16);
}  // namespace avx2
// AMX (packed_gemm_amx.cpp), outside the table: an addition to the AVX-512 path (cpu_isa.h).
namespace amx {
bool request_amx();  // asks Linux for the tile state; false when refused
// C[m, cols] = A16 @ P + beta * C for one bf16 panel P (pairs of rows, packed_gemm.h); A16 from
// avx512::bf16dot::round_rows_bf16 with its rows padded to a multiple of 16. Scratch: tail
// 16 * 128, c_tile 16 * 64 elements.
// next_panel (may be null): the panel this thread multiplies next, pulled into L2 while the first
// 16 rows of this one run, so that its read from memory overlaps this one's tiles.
void panel_gemm_bf16(const uint16_t* a16, int64_t kpad, const uint16_t* panel, float* c,
                     int64_t ldc, int64_t m, int64_t k, int64_t cols, float beta,
                     uint16_t* tail, float* c_tile, const uint16_t* next_panel = nullptr);
}  // namespace amx
// AVX512-BF16 (packed_gemm_avx512bf16.cpp), outside the table: the bf16 dot-product path of
// packed_gemm on CPUs without AMX (cpu_isa.h: dpbf16_enabled), and A's rounding for both.
namespace avx512::bf16dot {
// A [m, k] fp32 rows to bf16 rows of kpad (a multiple of 32) elements, zero past k.
void round_rows_bf16(const float* a, int64_t m, int64_t k, int64_t kpad, uint16_t* out);
// C[m, cols] = A16 @ P + beta * C for one bf16 panel P (pairs of rows, packed_gemm.h) with
// vdpbf16ps; A16 from round_rows_bf16 (m rows, no padding rows needed).
void panel_gemm_bf16(const uint16_t* a16, int64_t kpad, const uint16_t* panel, float* c,
                     int64_t ldc, int64_t m, int64_t k, int64_t cols, float beta);
}  // namespace avx512::bf16dot
#endif

}  // namespace ltm::kernels::cpu
