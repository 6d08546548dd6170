// vec_kernels.inc for the avx512 path (target flags: kernels/CMakeLists.txt).
#if defined(__x86_64__) || defined(__i386__)
#define LTM_ISA_NS avx512
#define LTM_ISA_LEVEL 2
#define LTM_FAST_MATH_NS fm_avx512
#include "kernels/cpu/vec_kernels.inc"
#include "kernels/cpu/llama_kernels.inc"
#endif
