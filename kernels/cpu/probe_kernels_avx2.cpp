// machine_probe.h's loops on AVX2 + FMA (target flags: kernels/CMakeLists.txt): 32-byte loads
// into eight independent XOR accumulators, and 12 chains of 8-lane FMAs held in registers
// (probe_loops.inc). Include only probe_kernels.h and intrinsics here (see isa_kernels.h).
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX2__) && defined(__FMA__))
#error "probe_kernels_avx2.cpp needs -mavx2 -mfma (kernels/CMakeLists.txt)"
#endif

#include <immintrin.h>

#include "kernels/cpu/probe_kernels.h"

namespace ltm::kernels::cpu::probe::avx2 {
#define LTM_PROBE_BYTES 32
#define LTM_PROBE_CHAINS kAvx2Chains
#define LTM_PROBE_FMA _mm256_fmadd_ps
#include "kernels/cpu/probe_loops.inc"
}  // namespace ltm::kernels::cpu::probe::avx2
#endif
