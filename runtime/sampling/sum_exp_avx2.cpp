// The sampler's block normalizer compiled for avx2 (runtime/CMakeLists.txt sets the flags):
// sum_exp_kernel.inc. On other processors the function is never chosen (sum_exp_isa.cpp).
#include <cstddef>

#include "runtime/sampling/sum_exp_isa.h"

#define LTM_FAST_MATH_NS fm_avx2_nofma
#include "kernels/cpu/fast_math.h"

namespace ltm::sampler_isa::avx2 {
#if defined(__x86_64__) || defined(_M_X64)
#define LTM_SUM_EXP_UNIT 1
#include "runtime/sampling/sum_exp_kernel.inc"
#else
double block_sum_exp(const float*, size_t, float, float) { return 0.0; }
#endif
}  // namespace ltm::sampler_isa::avx2
