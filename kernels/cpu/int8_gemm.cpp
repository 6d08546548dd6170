#include "kernels/cpu/int8_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"  // blas_threads
#include "kernels/cpu/int8_kernels.h"
#include "kernels/cpu/int8_quant.h"
#include "kernels/cpu/isa_kernels.h"  // split_rows
#include "kernels/cpu/panel_runs.h"
#include "kernels/cpu/static_for.h"
#include "kernels/cpu/steal_for.h"
#include "kernels/cpu/weight_type.h"

namespace ltm::kernels::cpu {
namespace {

constexpr int64_t kWidth = 64;  // kPanelWidth (packed_gemm.h)

int64_t panels_of(int64_t n) { return (n + kWidth - 1) / kWidth; }

size_t panel_bytes(int64_t k) { return static_cast<size_t>(int8_groups(k) * kInt8GroupBytes); }

// One group of one column: the `rows` values x[0], x[stride], ... (rows <= 32, the rest pad) into
// the panel's group block `blk` at column c, by the rule of int8_quant.h.
void pack_group(const float* x, int64_t stride, int64_t rows, uint8_t* blk, int64_t c) {
  int8_t q[kInt8Group];
  const uint16_t h = int8_quantize_group(x, stride, rows, q);
  blk[2 * c] = static_cast<uint8_t>(h & 0xff);
  blk[2 * c + 1] = static_cast<uint8_t>(h >> 8);
  for (int64_t p = 0; p < kInt8Group; ++p)
    blk[128 + 256 * (p / 4) + 4 * c + p % 4] = static_cast<uint8_t>(p < rows ? q[p] + 128 : 128);
}

// Column c (past n) of a group block: scale 0, weights zero.
void pad_group(uint8_t* blk, int64_t c) {
  blk[2 * c] = blk[2 * c + 1] = 0;
  for (int64_t t = 0; t < 8; ++t) std::memset(blk + 128 + 256 * t + 4 * c, 128, 4);
}

using PanelFn = void (*)(const int8::QuantRows&, const uint8_t*, float*, int64_t, int64_t, int64_t,
                         float);

bool cpu_has_amx_int8() {
#ifdef LTM_CPU_X86
  // amx_available() (cpu_isa.h) has asked Linux for the tile state (AMX-TILE and AMX-BF16).
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("amx-int8") != 0 && amx_available();
  }();
  return ok;
#else
  return false;
#endif
}

bool cpu_has_vnni() {
#ifdef LTM_CPU_X86
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return ok;
#else
  return false;
#endif
}

PanelFn panel_kernel(const char** name = nullptr) {
  const char* dummy;
  if (name == nullptr) name = &dummy;
  switch (isa()) {  // may throw (a bad LTM_CPU_ISA)
#ifdef LTM_CPU_X86
    case Isa::kAvx512:
      if (cpu_has_vnni()) {
        *name = "avx512-vnni";
        return int8::avx512::panel_gemm;
      }
      *name = "avx2";
      return int8::avx2::panel_gemm;
    case Isa::kAvx2: *name = "avx2"; return int8::avx2::panel_gemm;
#endif
    default: *name = "portable"; return int8::portable::panel_gemm;
  }
}

void quantize_row_portable(const float* a, int64_t k, int8_t* q, float* scale, int32_t* sum) {
  int8_quantize_row(a, k, q, scale);
  for (int64_t g = 0; g < int8_groups(k); ++g) {
    int32_t s = 0;
    for (int64_t p = 0; p < kInt8Group; ++p) s += q[g * kInt8Group + p];
    sum[g] = s;
  }
}

using QuantizeFn = void (*)(const float*, int64_t, int8_t*, float*, int32_t*);

QuantizeFn quantize_kernel() {
  switch (isa()) {
#ifdef LTM_CPU_X86
    case Isa::kAvx512: return int8::avx512::quantize_row;
    case Isa::kAvx2: return int8::avx2::quantize_row;
#endif
    default: return quantize_row_portable;
  }
}

#ifdef LTM_CPU_X86
// How many group blocks ahead of the one it reads the decode gemv prefetches (int8_gemv.inc):
// LTM_INT8_PREFETCH_AHEAD=0|1 (for measuring; another value is named in a warning and ignored),
// else 1 on AMD family 1Ah (Zen 5) and 0 elsewhere. Measured (docs/benchmarks.md, "Issue 22 on
// the AMD EPYC Zen 5 VM"): on Zen 5, whose memory reads ~75 GB/s here, one block ahead
// streamed the weights 1.13-1.45x faster in decode than the block being read; on Zen 4 (34-60
// GB/s) the block being read was the fastest of the forms tried then, and no Intel CPU has been
// measured with one block ahead. The choice is logged once.
int64_t int8_gemv_prefetch_ahead() {
  const TuningChoice t =
      tuning_choice("LTM_INT8_PREFETCH_AHEAD", {0, 1}, amd_cpu_family() >= 0x1a ? 1 : 0);
  spdlog::info("cpu kernels: int8 decode prefetches {} group block{} ahead ({})", t.value,
               t.value == 1 ? "" : "s", t.source);
  return t.value;
}
#endif

}  // namespace

void int8_quantize_row_for_path(const float* a, int64_t k, int8_t* q, float* scales,
                                int32_t* sums) {
  quantize_kernel()(a, k, q, scales, sums);
}

size_t int8_packed_bytes(int64_t k, int64_t n) {
  return static_cast<size_t>(panels_of(n)) * panel_bytes(k);
}

void int8_pack_rows(const float* w_rows, int64_t row_begin, int64_t row_end, int64_t k, int64_t n,
                    void* packed) {
  if (row_begin % kInt8Group != 0 || (row_end % kInt8Group != 0 && row_end != k) ||
      row_begin < 0 || row_end > k)
    throw std::invalid_argument("int8_pack_rows: rows [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") of " + std::to_string(k) +
                                " are not whole groups of 32");
  if (row_end <= row_begin) return;
  const int64_t panels = panels_of(n);
  const int64_t g0 = row_begin / kInt8Group, g1 = int8_groups(row_end);
  auto* out = static_cast<uint8_t*>(packed);
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = 0; j < panels; ++j) {
    uint8_t* panel = out + j * panel_bytes(k);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * kInt8Group, rows = std::min(kInt8Group, k - p0);
      uint8_t* blk = panel + g * kInt8GroupBytes;
      for (int64_t c = 0; c < kWidth; ++c) {
        const int64_t col = j * kWidth + c;
        if (col < n) {
          pack_group(w_rows + (p0 - row_begin) * n + col, n, rows, blk, c);
        } else {
          pad_group(blk, c);
        }
      }
    }
  }
}

void int8_pack_transposed_rows(const float* e_rows, int64_t row_begin, int64_t row_end, int64_t n,
                               int64_t k, void* packed) {
  const int64_t groups = int8_groups(k);
  auto* out = static_cast<uint8_t*>(packed);
  const int64_t first = row_begin / kWidth;
  const int64_t last = row_end > row_begin ? (row_end - 1) / kWidth + 1 : first;
#pragma omp parallel for schedule(static) num_threads(std::max(1, blas_threads()))
  for (int64_t j = first; j < last; ++j) {
    uint8_t* panel = out + j * panel_bytes(k);
    const int64_t c0 = std::max(row_begin, j * kWidth), c1 = std::min(row_end, (j + 1) * kWidth);
    for (int64_t col = c0; col < c1; ++col)
      for (int64_t g = 0; g < groups; ++g)
        pack_group(e_rows + (col - row_begin) * k + g * kInt8Group, 1,
                   std::min(kInt8Group, k - g * kInt8Group), panel + g * kInt8GroupBytes,
                   col % kWidth);
  }
  if (row_end == n && n % kWidth != 0) {
    uint8_t* panel = out + (n / kWidth) * panel_bytes(k);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = n % kWidth; c < kWidth; ++c) pad_group(panel + g * kInt8GroupBytes, c);
  }
}

void int8_packed_column(const void* packed, int64_t k, int64_t col, float* out) {
  const auto* panel = static_cast<const uint8_t*>(packed) + (col / kWidth) * panel_bytes(k);
  const int64_t c = col % kWidth;
  for (int64_t g = 0; g < int8_groups(k); ++g) {
    const uint8_t* blk = panel + g * kInt8GroupBytes;
    const float s = f16_to_f32(static_cast<uint16_t>(blk[2 * c] | (blk[2 * c + 1] << 8)));
    for (int64_t p = g * kInt8Group; p < std::min(k, (g + 1) * kInt8Group); ++p) {
      const int64_t i = p - g * kInt8Group;
      out[p] = static_cast<float>(static_cast<int>(blk[128 + 256 * (i / 4) + 4 * c + i % 4]) - 128) * s;
    }
  }
}

void int8_quantize_row(const float* a, int64_t k, int8_t* q, float* scales) {
  const int64_t groups = int8_groups(k);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * kInt8Group, rows = std::min(kInt8Group, k - p0);
    float amax = 0.0f;
    for (int64_t p = 0; p < rows; ++p) amax = std::max(amax, std::fabs(a[p0 + p]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[g] = amax / 127.0f;
    for (int64_t p = 0; p < kInt8Group; ++p)
      q[p0 + p] = p < rows ? int8_weight_quant(a[p0 + p], inv) : int8_t{0};
  }
}

const char* int8_kernel_name() {
  const char* name = "portable";
  panel_kernel(&name);
  return name;
}

bool int8_amx_enabled() {
  return cpu_has_amx_int8() && isa() == Isa::kAvx512 && amx_enabled();
}

const char* int8_kernel_name(int64_t m) {
  if (m >= kInt8AmxMinRows && int8_amx_enabled()) return "amx-int8";
  return int8_kernel_name();
}

void int8_gemm(const float* a, const void* packed, float* c, int64_t m, int64_t n, int64_t k,
               float beta) {
  if (m == 0 || n == 0) return;
  const PanelFn kernel = panel_kernel();  // outside the parallel regions: may throw
  const int64_t groups = int8_groups(k), kq = groups * kInt8Group, panels = panels_of(n);
  const int threads = std::max(1, blas_threads());
  // A quantized once per call, in buffers kept per calling thread.
  static thread_local std::vector<int8_t> q_store;
  static thread_local std::vector<float> scale_store;
  static thread_local std::vector<int32_t> sum_store;
  const int64_t m16 = (m + 15) / 16 * 16;  // the AMX kernel reads whole blocks of 16 rows
  if (q_store.size() < static_cast<size_t>(m16 * kq)) q_store.resize(static_cast<size_t>(m16 * kq));
  if (scale_store.size() < static_cast<size_t>(m * groups)) {
    scale_store.resize(static_cast<size_t>(m * groups));
    sum_store.resize(static_cast<size_t>(m * groups));
  }
  int8_t* q = q_store.data();
  float* scale = scale_store.data();
  int32_t* sum = sum_store.data();
  const QuantizeFn quantize = quantize_kernel();
  static_for(
      m, m >= 8,
      [&](int64_t r) { quantize(a + r * k, k, q + r * kq, scale + r * groups, sum + r * groups); },
      threads);
  const auto* w = static_cast<const uint8_t*>(packed);
#ifdef LTM_CPU_X86
  if (m >= kInt8AmxMinRows && kernel == int8::avx512::panel_gemm && int8_amx_enabled()) {
    // Prefill on AMX: (panel, block of rows) items in panel order, so that a thread's items of
    // one panel share its signed copy (amx::signed_panel); blocks are whole tiles of 16 rows.
    const RowSplit s0 = split_rows(m, panels, threads);
    const int64_t rows = (s0.rows + 15) / 16 * 16, blocks = (m + rows - 1) / rows;
    const int8::QuantRows all{q, scale, sum, groups};
#pragma omp parallel num_threads(threads)
    {
      static thread_local std::vector<int8_t> ws_store;
      if (ws_store.size() < static_cast<size_t>(groups * 2048))
        ws_store.resize(static_cast<size_t>(groups * 2048));
      int8::amx::TileSave saved;
      int8::amx::tiles_begin(&saved);
      int64_t have = -1;
#pragma omp for schedule(dynamic)  // see below
      for (int64_t item = 0; item < panels * blocks; ++item) {
        const int64_t j = item / blocks, r0 = (item % blocks) * rows;
        const int64_t nr = std::min(rows, m - r0), c0 = j * kWidth;
        const uint8_t* panel = w + j * panel_bytes(k);
        if (have != j) {
          int8::amx::signed_panel(panel, groups, ws_store.data());
          have = j;
        }
        const int8::QuantRows ar{all.q + r0 * kq, all.scale + r0 * groups, all.sum + r0 * groups,
                                 groups};
        int8::amx::panel_gemm(ar, ws_store.data(), panel, c + r0 * n + c0, n, nr,
                              std::min(kWidth, n - c0), beta);
      }
      int8::amx::tiles_end(&saved);
    }
    return;
  }
  static const bool gemv_on = [] {
    const char* e = std::getenv("LTM_INT8_GEMV");
    return !(e != nullptr && std::string(e) == "0");
  }();
  using GemvFn = void (*)(const int8::QuantRows&, const uint8_t*, int64_t, int, float*, int64_t,
                         float, int64_t);
  static const int64_t ahead = int8_gemv_prefetch_ahead();
  const GemvFn gemv = kernel == int8::avx512::panel_gemm ? int8::avx512::gemv_panels
                      : kernel == int8::avx2::panel_gemm ? int8::avx2::gemv_panels
                                                         : nullptr;
  if (m == 1 && gemv != nullptr && gemv_on) {
    // Decode: runs of consecutive panels, 4 at a time then fewer, as threads free up (panel_runs).
    const int nt_max = static_cast<int>(std::min<int64_t>(threads, panels));
    const int8::QuantRows ar{q, scale, sum, groups};
    for_each_panel_run(panels, nt_max, [&](int64_t j, int np) {
      gemv(ar, w + j * panel_bytes(k), static_cast<int64_t>(panel_bytes(k)), np, c + j * kWidth,
           std::min(np * kWidth, n - j * kWidth), beta, ahead);
    });
    return;
  }
#endif
  // A thread whose range is done takes items from the back of the others' (steal_for): on a host
  // whose other jobs take a core from one of the threads for a while, the others carry on with
  // the GEMM instead of spinning at its end (measured under load average 10: two thirds of a
  // prefill's samples in libgomp's spin with a static split), and unlike schedule(dynamic), which
  // this replaced, each thread walks its panels in memory order (forced AVX2, Zen 4 VM: batch-32
  // decode 1.20x, 6 alternating rounds; AVX-512 prefill of 512 tokens 1.03x, 10 rounds).
  const bool team = in_step_team();  // a small step's team (step_team.h): its threads, no region
  const RowSplit split = split_rows(m, panels, team ? step_team_size() : threads);
  auto item_gemm = [&](int64_t item) {
    const int64_t j = item % panels, r0 = (item / panels) * split.rows;
    const int64_t rows = std::min(split.rows, m - r0), c0 = j * kWidth;
    if (rows <= 0) return;
    const int8::QuantRows ar{q + r0 * kq, scale + r0 * groups, sum + r0 * groups, groups};
    kernel(ar, w + j * panel_bytes(k), c + r0 * n + c0, n, rows, std::min(kWidth, n - c0), beta);
  };
  steal_for(panels * split.blocks, threads, item_gemm);  // on the step team inside one
}

}  // namespace ltm::kernels::cpu
