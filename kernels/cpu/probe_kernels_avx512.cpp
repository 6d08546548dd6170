// machine_probe.h's loops on AVX-512 (target flags: kernels/CMakeLists.txt): 64-byte loads into
// eight independent XOR accumulators, 16 chains of 16-lane FMAs held in registers (both
// probe_loops.inc), and (in its own namespace, run only where the CPU has AVX512-BF16) chains of
// vdpbf16ps.
// Include only probe_kernels.h and intrinsics here (see isa_kernels.h).
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX512F__) && defined(__AVX512BF16__))
#error "probe_kernels_avx512.cpp needs -mavx512f -mavx512bf16 (kernels/CMakeLists.txt)"
#endif

#include <immintrin.h>

#include "kernels/cpu/probe_kernels.h"

namespace ltm::kernels::cpu::probe {
namespace avx512 {
#define LTM_PROBE_BYTES 64
#define LTM_PROBE_CHAINS kAvx512Chains
#define LTM_PROBE_FMA _mm512_fmadd_ps
#include "kernels/cpu/probe_loops.inc"
}  // namespace avx512

namespace avx512bf16 {

float dot_chains(int64_t iters) {
  __m512 acc[kBf16Chains];
  for (int k = 0; k < kBf16Chains; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512bh x = (__m512bh)_mm512_set1_epi16(static_cast<short>(kBf16Element));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kBf16Chains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], x, x);
  }
  float sum = 0;
  for (int k = 0; k < kBf16Chains; ++k) sum += _mm512_cvtss_f32(acc[k]);
  return sum;
}

}  // namespace avx512bf16
}  // namespace ltm::kernels::cpu::probe
#endif
