// The sampler's block normalizer for avx512 (flags: runtime/CMakeLists.txt): sum_exp_kernel.inc.
#define LTM_FAST_MATH_NS fm_avx512_nofma
#define LTM_SUM_EXP_NS avx512
#define LTM_SUM_EXP_X86_ONLY 1
#include "runtime/sampling/sum_exp_kernel.inc"
