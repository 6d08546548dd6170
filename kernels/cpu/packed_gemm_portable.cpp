// packed_gemm's panel kernel in plain C++ for the build's baseline ISA: the compiler vectorizes
// the 64-wide inner loop with whatever the baseline has (SSE at x86-64-v2). Include only
// isa_kernels.h here: see there why. The walk over chunks and the entry points are
// panel_loops.inc's (one row per group; an fp32 panel is one chunk, 16-bit panels are converted
// into an fp32 scratch kKChunk16 rows at a time, by the path's vec_kernels.inc conversions).
#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu::portable {
namespace {

constexpr int64_t kWidth = 64;             // kPanelWidth
constexpr int kMaxRows = 1;
constexpr int64_t kKChunk = int64_t{1} << 40;  // fp32 panels: the whole panel at once
constexpr int64_t kKChunk16 = 64;
constexpr bool kL2Next = false;
constexpr int64_t kL2ShareFrom = 1, kL2ShareTo = 0;  // kL2Next off

inline int64_t min_i(int64_t a, int64_t b) { return a < b ? a : b; }

using Mask = int;  // unused: the rows store their first `cols` columns
constexpr int kMasks = 1;
void column_masks(int64_t, Mask*) {}

// The walk's row group: one row of A, its 64 sums in a vectorizable array. Not inlined: inside
// the walk, GCC kept the sums in memory (16% slower at m = 32).
template <int R, bool kMasked, typename L2>
[[gnu::noinline]] void row_group(const float* a, int64_t, const float* b, float* c, int64_t, int64_t k,
                      float beta, const Mask*, int64_t cols, bool, const L2&) {
  static_assert(R == 1, "one row per group");
  float acc[kWidth] = {};
  for (int64_t p = 0; p < k; ++p) {
    const float x = a[p];
    const float* bp = b + p * kWidth;
    for (int64_t j = 0; j < kWidth; ++j) acc[j] += x * bp[j];
  }
  for (int64_t j = 0; j < cols; ++j) c[j] = beta != 0.0f ? acc[j] + beta * c[j] : acc[j];
}

// No register path for 16-bit panels: every m takes panel_loops.inc's scratch path.
constexpr int64_t kRegRows16 = 0;
template <bool, bool>
void rows16_group(int64_t, const float*, int64_t, const uint16_t*, float*, int64_t, int64_t, float,
                  const Mask*, int64_t, bool, int64_t) {}

}  // namespace
}  // namespace ltm::kernels::cpu::portable

#define LTM_ISA_NS portable
#include "kernels/cpu/panel_loops.inc"
