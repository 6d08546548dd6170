// machine_probe.h's loops for the portable path: plain C++ at the build's baseline. GCC's vector
// extension gives 4-lane float vectors (SSE); the baseline has no FMA, so a chain step is a
// multiply and an add (2 FLOPs a lane, as an FMA counts). Include only probe_kernels.h here.
#include <cstring>

#include "kernels/cpu/probe_kernels.h"

namespace ltm::kernels::cpu::probe::portable {

uint64_t read_fold(const void* p, size_t bytes, int streams) {
  const auto* w = static_cast<const uint64_t*>(p);
  const size_t words = bytes / 8, part = words / streams;
  uint64_t f[8] = {};
  for (size_t i = 0; i < part; ++i)
    for (int s = 0; s < streams; ++s) f[s] ^= w[s * part + i];
  for (size_t i = part * streams; i < words; ++i) f[7] ^= w[i];
  uint64_t r = 0;
  for (uint64_t x : f) r ^= x;
  return r;
}

float fma_chains(int64_t iters) {
  typedef float v4 __attribute__((vector_size(16)));
  v4 acc[kPortableChains];
  for (int k = 0; k < kPortableChains; ++k) {
    const float x = 0.5f + static_cast<float>(k) / 64.0f;
    acc[k] = v4{x, x, x, x};
  }
  const v4 mul = {kMul, kMul, kMul, kMul}, add = {kAdd, kAdd, kAdd, kAdd};
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kPortableChains; ++k) acc[k] = acc[k] * mul + add;
  float sum = 0;
  for (int k = 0; k < kPortableChains; ++k) sum += acc[k][0];
  return sum;
}

}  // namespace ltm::kernels::cpu::probe::portable
