// Internal to kernels/cpu: machine_probe.h's loops, one set per ISA (probe_kernels_<isa>.cpp,
// compiled with that ISA's flags; see isa_kernels.h for why those units include nothing but
// this header and intrinsics). Serial: machine_probe.cpp runs them on every thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ltm::kernels::cpu::probe {

// Independent FMA chains each path keeps in registers (enough to cover the FMA latency times
// the FMA ports: 4 cycles x 2 ports = 8 on Zen 3 and Intel cores; more does not hurt).
inline constexpr int kPortableChains = 8, kAvx2Chains = 12, kAvx512Chains = 16;
inline constexpr int kPortableLanes = 4, kAvx2Lanes = 8, kAvx512Lanes = 16;

// The chains' starting values, multiplier and addend: acc[k] = 0.5f + k / 64.0f, then acc =
// acc * kMul + kAdd, which stays within (0.5, 1] (no denormals, no overflow) however long it runs.
// (Written out in each unit: no inline function may be shared with the ISA units.)
inline constexpr float kMul = 0.999f, kAdd = 0.001f;

// bf16 dot chains: acc[k] = k, and every step adds a.lo * b.lo + a.hi * b.hi with every bf16
// element 2^-7 (2^-13 a step: exact in fp32 while the sums stay below 2^10).
inline constexpr int kBf16Chains = 16;
inline constexpr uint16_t kBf16Element = 0x3c00;  // 2^-7 in bf16

#define LTM_PROBE_DECLARE(ns)                                                         \
  namespace ns {                                                                      \
  /* XOR of the 64-bit words of [p, p + bytes) (bytes a multiple of 8), `streams` */  \
  /* (1, 2 or 4) equal parts read at once, eight vector accumulators. */             \
  uint64_t read_fold(const void* p, size_t bytes, int streams);                        \
  /* `iters` steps of every chain; returns the sum of the chains' first lanes. */     \
  float fma_chains(int64_t iters);                                                    \
  }
LTM_PROBE_DECLARE(portable)
LTM_PROBE_DECLARE(avx2)
LTM_PROBE_DECLARE(avx512)
#undef LTM_PROBE_DECLARE

namespace avx512bf16 {
// `iters` vdpbf16ps steps of kBf16Chains chains of 16 lanes; the sum of the chains' first lanes.
float dot_chains(int64_t iters);
}  // namespace avx512bf16

}  // namespace ltm::kernels::cpu::probe
