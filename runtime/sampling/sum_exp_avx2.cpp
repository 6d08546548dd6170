// The sampler's block normalizer for avx2 (flags: runtime/CMakeLists.txt): sum_exp_kernel.inc.
#define LTM_FAST_MATH_NS fm_avx2_nofma
#define LTM_SUM_EXP_NS avx2
#define LTM_SUM_EXP_X86_ONLY 1
#include "runtime/sampling/sum_exp_kernel.inc"
