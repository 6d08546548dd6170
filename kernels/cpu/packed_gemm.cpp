#include "kernels/cpu/packed_gemm.h"

#include <algorithm>
#include <cstring>
#include <omp.h>
#include <vector>

#include <spdlog/spdlog.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/int8_gemm.h"

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/panel_runs.h"
#include "kernels/cpu/steal_for.h"

namespace ltm::kernels::cpu {

void pack_weight(const float* w, int64_t k, int64_t n, float* packed) {
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t c0 = j * kPanelWidth;
    const int64_t cols = std::min(kPanelWidth, n - c0);
    float* panel = packed + static_cast<size_t>(j) * k * kPanelWidth;
    for (int64_t p = 0; p < k; ++p) {
      float* dst = panel + p * kPanelWidth;
      std::memcpy(dst, w + p * n + c0, static_cast<size_t>(cols) * sizeof(float));
      if (cols < kPanelWidth) std::fill(dst + cols, dst + kPanelWidth, 0.0f);
    }
  }
}

void pack_weight_transposed(const float* e, int64_t n, int64_t k, float* packed) {
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t r0 = j * kPanelWidth;
    const int64_t rows = std::min(kPanelWidth, n - r0);
    float* panel = packed + static_cast<size_t>(j) * k * kPanelWidth;
    // Tiles of 64 x 16 so that both the 64 rows of E and the panel stay in L1.
    for (int64_t p0 = 0; p0 < k; p0 += 16) {
      const int64_t p1 = std::min(k, p0 + 16);
      for (int64_t p = p0; p < p1; ++p)
        std::fill(panel + p * kPanelWidth + rows, panel + (p + 1) * kPanelWidth, 0.0f);
      for (int64_t c = 0; c < rows; ++c) {
        const float* src = e + (r0 + c) * k;
        for (int64_t p = p0; p < p1; ++p) panel[p * kPanelWidth + c] = src[p];
      }
    }
  }
}

void packed_column(const float* packed, int64_t k, int64_t col, float* out) {
  const float* panel = packed + static_cast<size_t>(col / kPanelWidth) * k * kPanelWidth;
  const int64_t c = col % kPanelWidth;
  for (int64_t p = 0; p < k; ++p) out[p] = panel[p * kPanelWidth + c];
}

// The work of one GEMM is (panel, block of rows) items. Panels alone are the split while there
// are enough of them (each thread then streams its panels once, with every row); when there are
// too few to keep the threads busy (n = d = 768 is 12 panels; a 64-core socket would idle 52
// cores) the rows are cut into blocks too, of at least 32 rows so each panel pass still reuses
// the weights it reads. Aim: 4 items per thread.
RowSplit split_rows(int64_t m, int64_t panels, int threads) {
  int64_t blocks = 1;
  if (threads > 1 && panels < 4 * threads)
    blocks = std::max<int64_t>(1, std::min((4 * threads + panels - 1) / panels, m / 32));
  const int64_t rows = (m + blocks - 1) / blocks;
  return {(m + rows - 1) / rows, rows};
}

PanelRuns panel_runs(int64_t panels, int threads) {
  const int64_t t = std::max(1, threads);
  const int64_t quads = panels > 4 * t ? (panels - 4 * t + 3) / 4 : 0;
  const int64_t rest = panels - 4 * quads;
  const int64_t pairs = rest > t ? (rest - t + 1) / 2 : 0;
  return {quads, pairs, rest - 2 * pairs};
}

#ifdef LTM_CPU_X86
namespace {
// How far ahead the AVX2 decode gemv prefetches a 16-bit panel's stream, in bytes:
// LTM_GEMV16_PREFETCH_BYTES=512|1024|2048|4096 (for measuring; another value is named in a
// warning and ignored), else 2048 on AMD family 1Ah (Zen 5) and 512 elsewhere. Measured with the
// AVX2 path forced on a Zen 5 VM (docs/benchmarks.md, "The AVX2 16-bit decode's prefetch
// distance"): bf16 decode 1.26-1.32x and fp16 1.27x faster with 2048 bytes than with 512 (12 of
// 12 alternating rounds each), 4096 no better than 2048; on a Zen 4 (family 19h, as the AVX2-only
// Zen 3) 512 was the fastest of the forms tried then, and no Intel CPU has been measured with
// 2048. Logged once.
int64_t gemv16_prefetch_bytes() {
  const TuningChoice t = tuning_choice("LTM_GEMV16_PREFETCH_BYTES", {512, 1024, 2048, 4096},
                                       amd_cpu_family() >= 0x1a ? 2048 : 512);
  spdlog::info("cpu kernels: 16-bit decode on the AVX2 path prefetches {} bytes ahead ({})",
               t.value, t.source);
  return t.value;
}

// m == 1 on the AVX-512 path, m <= 2 on the AVX2 path: runs of consecutive panels as threads
// free up, 4 at a time while there are many (gemv_panels: several streams per core), then fewer
// (panel_runs). true when it ran.
bool gemv_multi_stream(const float* a, const void* packed, int type, size_t elem_bytes, float* c,
                       int64_t m, int64_t n, int64_t k, float beta) {
  const bool avx2 = isa() == Isa::kAvx2 && m <= 2;
  if (!avx2 && (m != 1 || isa() != Isa::kAvx512)) return false;
  int64_t ahead16 = 0;  // the AVX-512 path chooses its own distance
  if (avx2) {  // chosen (and logged) the first time the AVX2 path runs one
    static const int64_t chosen = gemv16_prefetch_bytes();
    ahead16 = chosen;
  }
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blas_threads(), panels)));
  const char* base = static_cast<const char*>(packed);
  const int64_t rows = type == 1 ? (k + 1) / 2 * 2 : k;  // panel_rows: bf16 pairs
  const size_t panel_bytes = static_cast<size_t>(rows * kPanelWidth) * elem_bytes;
  for_each_panel_run(panels, threads, [&](int64_t j, int np) {
    const int64_t c0 = j * kPanelWidth;
    const int64_t cols = std::min<int64_t>(np * kPanelWidth, n - c0);
    if (avx2)
      avx2::gemv_panels(a, m, base + j * panel_bytes, type, c + c0, n, k, cols, beta, ahead16);
    else
      avx512::gemv_panels(a, base + j * panel_bytes, type, c + c0, k, cols, beta);
  });
  return true;
}
}  // namespace
#endif

namespace {
// The (panel, block of rows) items of one GEMM over the threads, each one call of a table
// kernel (fp32 or 16-bit panels, Elem the element type).
template <typename Elem, typename PanelGemm>
void run_panels(PanelGemm panel_gemm, const float* a, const Elem* packed, float* c, int64_t m,
                int64_t n, int64_t k, float beta, int64_t panels, int64_t panel_rows) {
  const bool team = in_step_team();  // a small step's team (step_team.h): its threads, no region
  const int threads = team ? step_team_size() : std::max(1, blas_threads());
  const RowSplit split = split_rows(m, panels, threads);
  auto item_gemm = [&](int64_t item) {
    const int64_t j = item % panels, r0 = (item / panels) * split.rows;
    const int64_t rows = std::min(split.rows, m - r0);
    const int64_t c0 = j * kPanelWidth;
    if (rows > 0)
      panel_gemm(a + r0 * k, packed + static_cast<size_t>(j) * panel_rows * kPanelWidth, c + r0 * n + c0,
                 n, rows, k, std::min(kPanelWidth, n - c0), beta);
  };
  steal_for(panels * split.blocks, threads, item_gemm);  // on the step team inside one
}
}  // namespace

void packed_gemm(const float* a, const float* packed, float* c, int64_t m, int64_t n, int64_t k,
                 float beta) {
  if (m == 0 || n == 0) return;
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
  const auto panel_gemm = kernel_table().panel_gemm;  // outside the parallel region: may throw
#ifdef LTM_CPU_X86
  if (gemv_multi_stream(a, packed, 0, sizeof(float), c, m, n, k, beta)) return;
#endif
  run_panels(panel_gemm, a, packed, c, m, n, k, beta, panels, k);
}

// ---- WeightType-generic packing and GEMM ----

#ifdef LTM_CPU_X86
namespace {

// The bf16 dot-product paths of packed_gemm for bf16 weights (cpu_isa.h): A rounded to bf16
// once, in whole AMX tiles (rows padded to 16, k to 32), then (panel, block of rows) items as the
// other paths, on AMX tiles (amx) or with AVX512-BF16's vdpbf16ps.
void packed_gemm_bf16_rounded(const float* a, const uint16_t* w, float* c, int64_t m, int64_t n,
                              int64_t k, float beta, int64_t panels, bool amx) {
  const int64_t kpad = (k + 31) / 32 * 32, mpad = (m + 15) / 16 * 16;
  const size_t panel_elems = static_cast<size_t>(panel_rows(k, WeightType::kBF16) * kPanelWidth);
  // Rows on 64-byte boundaries (kpad * 2 bytes apart from an aligned start): a tile row that
  // straddled two cache lines would cost both. The buffer is kept per thread (no allocation, page
  // faults or clearing per call); round_rows_bf16 writes every real row whole, and only the pad
  // rows below m are cleared.
  static thread_local std::vector<uint16_t> a16_store;
  if (a16_store.size() < static_cast<size_t>(mpad * kpad + 32))
    a16_store.resize(static_cast<size_t>(mpad * kpad + 32));
  uint16_t* const a16 = reinterpret_cast<uint16_t*>(
      (reinterpret_cast<uintptr_t>(a16_store.data()) + 63) & ~uintptr_t{63});
  std::memset(a16 + m * kpad, 0, static_cast<size_t>((mpad - m) * kpad) * sizeof(uint16_t));
  const int threads = std::max(1, blas_threads());
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r0 = 0; r0 < m; r0 += 16)
    avx512::bf16dot::round_rows_bf16(a + r0 * k, std::min<int64_t>(16, m - r0), k, kpad,
                                     a16 + r0 * kpad);
  RowSplit split = split_rows(m, panels, threads);
  split.rows = (split.rows + 15) / 16 * 16;  // whole tiles
  split.blocks = (m + split.rows - 1) / split.rows;
  // Each thread runs its items in order and knows the one it takes next, whose panel it
  // prefetches (amx::panel_gemm_bf16); steal_for.
  steal_for(panels * split.blocks, threads, [&](int64_t item, int64_t next_item) {
    alignas(64) uint16_t tail[16 * 2 * kPanelWidth];  // the last pair rows, zero-padded to a tile
    alignas(64) float c_tile[16 * kPanelWidth];
    const int64_t j = item % panels, r0 = (item / panels) * split.rows;
    const int64_t rows = std::min(split.rows, m - r0);
    const int64_t c0 = j * kPanelWidth;
    if (!amx) {
      avx512::bf16dot::panel_gemm_bf16(a16 + r0 * kpad, kpad, w + j * panel_elems,
                                       c + r0 * n + c0, n, rows, k,
                                       std::min(kPanelWidth, n - c0), beta);
      return;
    }
    const uint16_t* next = next_item >= 0 ? w + (next_item % panels) * panel_elems : nullptr;
    amx::panel_gemm_bf16(a16 + r0 * kpad, kpad, w + j * panel_elems, c + r0 * n + c0, n, rows, k,
                         std::min(kPanelWidth, n - c0), beta, tail, c_tile, next);
  });
}

}  // namespace
#endif

size_t packed_bytes(int64_t k, int64_t n, WeightType t) {
  if (t == WeightType::kInt8) return int8_packed_bytes(k, n);
  return packed_floats(panel_rows(k, t), n) * weight_type_size(t);
}

namespace {

// Converts n fp32 values to t at dst + offset elements (a buffer of t).
struct Converter {
  WeightType t;
  void (*to16)(const float*, uint16_t*, int64_t);  // null for kF32
  void operator()(const float* src, void* dst, int64_t offset, int64_t n) const {
    if (to16 == nullptr) {
      std::memcpy(static_cast<float*>(dst) + offset, src, static_cast<size_t>(n) * sizeof(float));
    } else {
      to16(src, static_cast<uint16_t*>(dst) + offset, n);
    }
  }
  void zero(void* dst, int64_t offset, int64_t n) const {
    const size_t es = weight_type_size(t);
    std::memset(static_cast<char*>(dst) + offset * es, 0, static_cast<size_t>(n) * es);
  }
};

Converter converter(WeightType t) {
  const KernelTable& kt = kernel_table();
  switch (t) {
    case WeightType::kBF16: return {t, kt.f32_to_bf16_n};
    case WeightType::kF16: return {t, kt.f32_to_f16_n};
    default: return {WeightType::kF32, nullptr};
  }
}

}  // namespace

void pack_weight_rows(const float* w_rows, int64_t row_begin, int64_t row_end, int64_t k,
                      int64_t n, WeightType t, void* packed) {
  if (t == WeightType::kInt8) return int8_pack_rows(w_rows, row_begin, row_end, k, n, packed);
  if (row_end <= row_begin) return;
  const Converter cv = converter(t);  // outside the parallel region: may throw
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
  if (t == WeightType::kBF16) {  // pairs of rows interleaved (panel_rows)
    auto* out = static_cast<uint16_t*>(packed);
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
    for (int64_t j = 0; j < panels; ++j) {
      const int64_t c0 = j * kPanelWidth;
      const int64_t cols = std::min(kPanelWidth, n - c0);
      uint16_t row[kPanelWidth];
      for (int64_t p = row_begin; p < row_end; ++p) {
        cv(w_rows + (p - row_begin) * n + c0, row, 0, cols);
        std::fill(row + cols, row + kPanelWidth, uint16_t{0});
        uint16_t* dst = out + packed_index(k, p, c0, t);
        for (int64_t c = 0; c < kPanelWidth; ++c) dst[2 * c] = row[c];
      }
      if (row_end == k && k % 2 != 0) {  // the pad row of the last pair
        uint16_t* dst = out + packed_index(k, k, c0, t);
        for (int64_t c = 0; c < kPanelWidth; ++c) dst[2 * c] = 0;
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t c0 = j * kPanelWidth;
    const int64_t cols = std::min(kPanelWidth, n - c0);
    const int64_t panel = j * k * kPanelWidth;  // element offset
    for (int64_t p = row_begin; p < row_end; ++p) {
      const int64_t dst = panel + p * kPanelWidth;
      cv(w_rows + (p - row_begin) * n + c0, packed, dst, cols);
      if (cols < kPanelWidth) cv.zero(packed, dst + cols, kPanelWidth - cols);
    }
  }
}

void pack_weight_transposed_rows(const float* e_rows, int64_t row_begin, int64_t row_end,
                                 int64_t n, int64_t k, WeightType t, void* packed) {
  if (t == WeightType::kInt8)
    return int8_pack_transposed_rows(e_rows, row_begin, row_end, n, k, packed);
  const Converter cv = converter(t);
  const size_t es = weight_type_size(t);
  const int64_t first = row_begin / kPanelWidth;
  const int64_t last = row_end > row_begin ? (row_end - 1) / kPanelWidth + 1 : first;
  constexpr int64_t kTile = 256;  // k values of one E row converted at a time
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = first; j < last; ++j) {
    const int64_t c0 = std::max(row_begin, j * kPanelWidth);
    const int64_t c1 = std::min(row_end, (j + 1) * kPanelWidth);
    char* out = static_cast<char*>(packed);
    alignas(64) unsigned char tmp[kTile * 4];
    for (int64_t p0 = 0; p0 < k; p0 += kTile) {
      const int64_t kt = std::min(kTile, k - p0);
      for (int64_t c = c0; c < c1; ++c) {
        cv(e_rows + (c - row_begin) * k + p0, tmp, 0, kt);
        for (int64_t p = 0; p < kt; ++p)
          std::memcpy(out + packed_index(k, p0 + p, c, t) * es, tmp + p * es, es);
      }
    }
    if (panel_rows(k, t) > k)  // the pad row of the last pair, for these columns
      for (int64_t c = c0; c < c1; ++c) std::memset(out + packed_index(k, k, c, t) * es, 0, es);
  }
  if (row_end == n && n % kPanelWidth != 0) {  // the last range zeroes the pad columns
    char* out = static_cast<char*>(packed);
    for (int64_t p = 0; p < panel_rows(k, t); ++p)
      for (int64_t c = n; c < (n / kPanelWidth + 1) * kPanelWidth; ++c)
        std::memset(out + packed_index(k, p, c, t) * es, 0, es);
  }
}

void packed_column(const void* packed, WeightType t, int64_t k, int64_t col, float* out) {
  if (t == WeightType::kInt8) return int8_packed_column(packed, k, col, out);
  const auto* f = static_cast<const float*>(packed);
  const auto* h = static_cast<const uint16_t*>(packed);
  for (int64_t p = 0; p < k; ++p) {
    const size_t i = packed_index(k, p, col, t);
    out[p] = t == WeightType::kF32 ? f[i] : t == WeightType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  }
}

void packed_gemm(const float* a, const void* packed, WeightType t, float* c, int64_t m,
                 int64_t n, int64_t k, float beta) {
  if (t == WeightType::kF32) {
    packed_gemm(a, static_cast<const float*>(packed), c, m, n, k, beta);
    return;
  }
  if (t == WeightType::kInt8) return int8_gemm(a, packed, c, m, n, k, beta);
  if (m == 0 || n == 0) return;
  const int64_t panels = (n + kPanelWidth - 1) / kPanelWidth;
#ifdef LTM_CPU_X86
  if (t == WeightType::kBF16 && m >= kAmxMinRows && (amx_enabled() || dpbf16_enabled())) {
    packed_gemm_bf16_rounded(a, static_cast<const uint16_t*>(packed), c, m, n, k, beta, panels,
                             amx_enabled());
    return;
  }
#endif
  const KernelTable& kt = kernel_table();  // outside the parallel region: may throw
#ifdef LTM_CPU_X86
  if (gemv_multi_stream(a, packed, t == WeightType::kBF16 ? 1 : 2, 2, c, m, n, k, beta)) return;
#endif
  const auto panel_gemm = t == WeightType::kBF16 ? kt.panel_gemm_bf16 : kt.panel_gemm_f16;
  run_panels(panel_gemm, a, static_cast<const uint16_t*>(packed), c, m, n, k, beta, panels,
             panel_rows(k, t));
}

}  // namespace ltm::kernels::cpu
