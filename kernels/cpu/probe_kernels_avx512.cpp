// machine_probe.h's loops on AVX-512 (target flags: kernels/CMakeLists.txt): 64-byte loads into
// eight independent XOR accumulators, 16 chains of 16-lane FMAs held in registers, and (in its
// own namespace, run only where the CPU has AVX512-BF16) chains of vdpbf16ps.
// Include only probe_kernels.h and intrinsics here (see isa_kernels.h).
#if defined(__x86_64__) || defined(__i386__)
#if !(defined(__AVX512F__) && defined(__AVX512BF16__))
#error "probe_kernels_avx512.cpp needs -mavx512f -mavx512bf16 (kernels/CMakeLists.txt)"
#endif

#include <immintrin.h>

#include "kernels/cpu/probe_kernels.h"

namespace ltm::kernels::cpu::probe {
namespace avx512 {
namespace {

// Blocks of 512 bytes: 8 / S vectors from each of S streams per block.
template <int S>
uint64_t fold(const char* p, size_t bytes) {
  constexpr int kPer = 8 / S;
  const size_t part = bytes / S / 512 * 512;
  __m512i f[8];
  for (auto& v : f) v = _mm512_setzero_si512();
  for (size_t off = 0; off < part; off += 512 / S) {
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < kPer; ++j)
        f[s * kPer + j] = _mm512_xor_si512(
            f[s * kPer + j], _mm512_loadu_si512(p + s * part + off + 64 * j));
  }
  __m512i x = _mm512_xor_si512(_mm512_xor_si512(f[0], f[1]), _mm512_xor_si512(f[2], f[3]));
  x = _mm512_xor_si512(x, _mm512_xor_si512(_mm512_xor_si512(f[4], f[5]), _mm512_xor_si512(f[6], f[7])));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, x);
  uint64_t r = 0;
  for (uint64_t l : lanes) r ^= l;
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
  __m512 acc[kAvx512Chains];
  for (int k = 0; k < kAvx512Chains; ++k) acc[k] = _mm512_set1_ps(0.5f + static_cast<float>(k) / 64.0f);
  const __m512 mul = _mm512_set1_ps(kMul), add = _mm512_set1_ps(kAdd);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kAvx512Chains; ++k) acc[k] = _mm512_fmadd_ps(acc[k], mul, add);
  }
  float sum = 0;
  for (int k = 0; k < kAvx512Chains; ++k) sum += _mm512_cvtss_f32(acc[k]);
  return sum;
}

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
