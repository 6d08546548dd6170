// The sampler's block normalizer on the CPU's widest vector path (sum_exp_kernel.inc): the same
// bits on every path, so the choice is only one of speed. For sampler.cpp and its tests.
#pragma once

#include <cstddef>

namespace ltm {

inline constexpr size_t kSumExpBlock = 256;  // ids per block of the row normalizer
inline constexpr size_t kSumExpLanes = 8;    // fixed lanes of each block's sum

using BlockSumExpFn = double (*)(const float* v, size_t n, float m, float t);

// Sum over v[0, n), n <= kSumExpBlock, of exp((v[i] - m) / t): every path's function has the
// same result bit for bit.
// (The avx2 and avx512 namespaces: tests/tools/check_baseline_isa.sh lets only such code use
// the wider registers.)
namespace sampler_isa::baseline {
double block_sum_exp(const float* v, size_t n, float m, float t);
}
namespace sampler_isa::avx2 {
double block_sum_exp(const float* v, size_t n, float m, float t);
}
namespace sampler_isa::avx512 {
double block_sum_exp(const float* v, size_t n, float m, float t);
}

// The widest path this CPU runs (AVX-512F, AVX2, else the baseline), narrowed by LTM_CPU_ISA as
// the kernels are (avx2, portable); chosen once.
BlockSumExpFn block_sum_exp_fn();
// Each path this CPU can run, widest first, with its name ("avx512", "avx2", "baseline").
struct BlockSumExpPath {
  const char* name;
  BlockSumExpFn fn;
};
int block_sum_exp_paths(BlockSumExpPath out[3]);

}  // namespace ltm
