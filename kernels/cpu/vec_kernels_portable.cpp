// vec_kernels.inc for the portable path (target flags: kernels/CMakeLists.txt).

#define LTM_ISA_NS portable
#define LTM_ISA_LEVEL 0
#define LTM_FAST_MATH_NS fm_portable
#include "kernels/cpu/vec_kernels.inc"
#include "kernels/cpu/llama_kernels.inc"

