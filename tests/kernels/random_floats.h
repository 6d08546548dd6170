// Uniform random floats in [lo, hi) from a seeded mt19937: the inputs of the kernel and backend
// tests (the same seed gives the same values on every machine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace ltm::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace ltm::test
