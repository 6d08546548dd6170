// Element types of checkpoint tensors and conversions between them and f32.
//
// Header-only and dependency-free (bit manipulation only, no _Float16 / __bf16), so that any
// folder may include it. All conversions round to nearest, ties to even, like PyTorch's
// `tensor.to(torch.float16 / torch.bfloat16)`; NaN stays NaN (quiet), infinities stay infinite,
// f16 subnormals are handled exactly. Thread-safe (pure functions).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ltm {

enum class DType { kF32, kF16, kBF16 };

// The safetensors spelling: "F32", "F16", "BF16".
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

// Bytes per element.
constexpr int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
  }
  return 0;
}

// IEEE binary16 bits -> f32 (exact).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24 is exact in f32.
  const float magnitude = static_cast<float>(mant) * 0x1p-24f;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
}

// f32 -> IEEE binary16 bits, round to nearest even; overflow gives +-inf.
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // nan
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5f puts the rounding point at 2^-24 (the
    // subnormal half's unit) and lets the FPU round to nearest even.
    const float shifted = std::bit_cast<float>(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
  }
  const uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + mant_odd;  // re-bias the exponent (127 -> 15) and round to nearest even
  return static_cast<uint16_t>(sign | (ax >> 13));
}

// bfloat16 bits -> f32 (exact).
inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// f32 -> bfloat16 bits, round to nearest even; overflow gives +-inf.
inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);
}

// Converts `n` little-endian elements of `dtype` at `src` (any alignment) to f32 at `dst`.
inline void convert_to_f32(DType dtype, const void* src, int64_t n, float* dst) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, bytes + 2 * i, 2);
        dst[i] = bf16_to_f32(b);
      }
      return;
  }
}

static_assert(std::endian::native == std::endian::little,
              "checkpoint tensors are little-endian; ltm reads them in place");

}  // namespace ltm
