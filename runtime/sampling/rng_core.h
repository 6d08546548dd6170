// The sampler's random generator, written once for the host and the GPU: xoshiro256** 1.0
// (Blackman & Vigna) seeded through splitmix64, integer arithmetic only, so the same seed gives
// the same stream on every platform and on the device. ltm::Rng (sampler.h) is this struct; a
// CUDA kernel that samples on the device includes this header and draws exactly what the host
// sampler would (rng_core_test checks the host instantiation against fixed draws of the stream).
//
// Header-only, no dependencies; the functions are __host__ __device__ under nvcc and plain
// inline functions otherwise.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LTM_HOST_DEVICE __host__ __device__
#else
#define LTM_HOST_DEVICE
#endif

namespace ltm {

// splitmix64's output function: a bijection of uint64 with good avalanche.
LTM_HOST_DEVICE inline uint64_t rng_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

LTM_HOST_DEVICE inline uint64_t rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Plain data (copyable to the device as is).
struct RngCore {
  uint64_t s[4];

  // The state for `seed`: a splitmix64 stream from it (its outputs are never all zero).
  LTM_HOST_DEVICE static RngCore seeded(uint64_t seed) {
    RngCore r;
    for (int i = 0; i < 4; ++i) {
      seed += 0x9E3779B97F4A7C15ull;
      r.s[i] = rng_mix64(seed);
    }
    return r;
  }
  // The state for a request's `token_index`-th generated token: a pure function of
  // (seed, token_index), so any rank, any device, or a recomputation after preemption draws
  // the same numbers.
  LTM_HOST_DEVICE static RngCore for_token(uint64_t seed, int64_t token_index) {
    return seeded(rng_mix64(rng_mix64(seed) ^ static_cast<uint64_t>(token_index)));
  }

  // The engine's stream for a request's `token_index`-th token (token_rng, runtime/engine/
  // engine.h): a splitmix64 step from (seed, token_index), then seeded(). The CUDA sampler
  // derives each row's state with this same function.
  LTM_HOST_DEVICE static RngCore for_step(uint64_t seed, int32_t token_index) {
    const uint64_t step = 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(token_index) + 1);
    return seeded(rng_mix64(seed ^ step));
  }

  LTM_HOST_DEVICE uint64_t next_u64() {
    const uint64_t result = rng_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return result;
  }
  // [0, 1), multiples of 2^-53 (exact in double; no rounding differs between host and device).
  LTM_HOST_DEVICE double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
};

}  // namespace ltm
