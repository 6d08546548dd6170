#include "kernels/cpu/weight_type.h"

#include <cstring>

namespace ltm::kernels::cpu {
namespace {

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace

size_t weight_type_size(WeightType t) {
  return t == WeightType::kF32 ? 4 : t == WeightType::kInt8 ? 1 : 2;
}

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kF32: return "f32";
    case WeightType::kBF16: return "bf16";
    case WeightType::kF16: return "f16";
    case WeightType::kInt8: return "int8";
  }
  return "?";
}

uint16_t f32_to_bf16(float x) {
  const uint32_t b = bits_of(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // NaN
  // Round to nearest even on the 16 dropped bits; a carry out of the mantissa bumps the exponent
  // (and past the largest finite value gives inf, as it should).
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

float bf16_to_f32(uint16_t x) { return float_of(static_cast<uint32_t>(x) << 16); }

uint16_t f32_to_f16(float x) {
  const uint32_t b = bits_of(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf (and inf)
  if (a < 0x38800000u) {  // below 2^-14: an f16 subnormal, or zero
    if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 (a tie): zero
    const uint32_t e = a >> 23;                          // 102 .. 112
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;      // value = m * 2^(e - 150)
    const uint32_t shift = 126u - e;                     // to units of 2^-24: 14 .. 24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may become 0x400, the smallest normal
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t r = a - 0x38000000u;  // rebias the exponent: 127 - 15 = 112
  return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
}

float f16_to_f32(uint16_t x) {
  const uint32_t sign = (static_cast<uint32_t>(x) & 0x8000u) << 16;
  const uint32_t e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
  if (e == 0x1f) return float_of(sign | (m == 0 ? 0x7f800000u : 0x7fc00000u | (m << 13)));
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

float round_to(WeightType t, float x) {
  switch (t) {
    case WeightType::kBF16: return bf16_to_f32(f32_to_bf16(x));
    case WeightType::kF16: return f16_to_f32(f32_to_f16(x));
    default: return x;
  }
}

}  // namespace ltm::kernels::cpu
