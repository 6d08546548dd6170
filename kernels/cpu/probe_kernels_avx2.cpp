// machine_probe.h's loops on AVX2 + FMA (target flags: kernels/CMakeLists.txt): 32-byte loads
// into eight independent XOR accumulators, and 12 chains of 8-lane FMAs held in registers.
// Include only probe_kernels.h and intrinsics here (see isa_kernels.h).
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX2__) && defined(__FMA__))
#error "probe_kernels_avx2.cpp needs -mavx2 -mfma (kernels/CMakeLists.txt)"
#endif

#include <immintrin.h>

#include "kernels/cpu/probe_kernels.h"

namespace ltm::kernels::cpu::probe::avx2 {
namespace {

// Blocks of 256 bytes: 8 / S vectors from each of S streams per block.
template <int S>
uint64_t fold(const char* p, size_t bytes) {
  constexpr int kPer = 8 / S;
  const size_t part = bytes / S / 256 * 256;
  __m256i f[8];
  for (auto& v : f) v = _mm256_setzero_si256();
  for (size_t off = 0; off < part; off += 256 / S) {
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < kPer; ++j)
        f[s * kPer + j] = _mm256_xor_si256(
            f[s * kPer + j],
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + s * part + off + 32 * j)));
  }
  __m256i x = _mm256_xor_si256(_mm256_xor_si256(f[0], f[1]), _mm256_xor_si256(f[2], f[3]));
  x = _mm256_xor_si256(x, _mm256_xor_si256(_mm256_xor_si256(f[4], f[5]), _mm256_xor_si256(f[6], f[7])));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), x);
  uint64_t r = lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
  const auto* tail = reinterpret_cast<const uint64_t*>(p + S * part);
  for (size_t i = 0; i < (bytes - S * part) / 8; ++i) r ^= tail[i];
  return r;
}

}  // namespace

uint64_t read_fold(const void* p, size_t bytes, int streams) {
  const char* c = static_cast<const char*>(p);
  return streams >= 4 ? fold<4>(c, bytes) : streams == 2 ? fold<2>(c, bytes) : fold<1>(c, bytes);
}

float fma_chains(int64_t iters) {
  __m256 acc[kAvx2Chains];
  for (int k = 0; k < kAvx2Chains; ++k) acc[k] = _mm256_set1_ps(0.5f + static_cast<float>(k) / 64.0f);
  const __m256 mul = _mm256_set1_ps(kMul), add = _mm256_set1_ps(kAdd);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAvx2Chains; ++k) acc[k] = _mm256_fmadd_ps(acc[k], mul, add);
  }
  float sum = 0;
  for (int k = 0; k < kAvx2Chains; ++k) sum += _mm256_cvtss_f32(acc[k]);
  return sum;
}

}  // namespace ltm::kernels::cpu::probe::avx2
#endif
