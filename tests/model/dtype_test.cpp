// runtime/model/dtype.h (and the safetensors dtype names): names, sizes and the f16/bf16 <-> f32 conversions (round to nearest even,
// every f16 value round-tripped, agreement with the compiler's _Float16).
#include "runtime/model/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "runtime/model/safetensors.h"  // dtype_from_name, safetensors_dtype_size

namespace ltm {
namespace {
// ---------------------------------------------------------------------------------------------
// dtype conversions

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::kF32), "F32");
  EXPECT_EQ(dtype_name(DType::kF16), "F16");
  EXPECT_EQ(dtype_name(DType::kBF16), "BF16");
  EXPECT_EQ(dtype_size(DType::kF32), 4);
  EXPECT_EQ(dtype_size(DType::kF16), 2);
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
  EXPECT_EQ(dtype_from_name("BF16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_name("F64").has_value());
  EXPECT_EQ(safetensors_dtype_size("F64"), 8);
  EXPECT_EQ(safetensors_dtype_size("nope"), 0);
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0400), 0x1p-14f);   // smallest normal
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);   // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie rounds to even = inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);           // tie between 0 and 2^-24: even
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);       // 1.5 ulp: tie to even (2)
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);    // tie: even (1.0)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: even (1 + 2^-9)
  EXPECT_EQ(f32_to_f16(0x1.ffcp-15f), 0x0400);       // rounds up into the normal range
  EXPECT_EQ(f32_to_f16(std::nanf("")) & 0x7e00, 0x7e00);
}

TEST(DTypeTest, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = f16_to_f32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), bits) << std::hex << h;
  }
}

#if defined(__FLT16_MAX__) && (defined(__x86_64__) || defined(__aarch64__))
// The compiler's own _Float16 conversion is an independent reference for rounding.
TEST(DTypeTest, F16MatchesCompilerFloat16) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t x = bits(rng);
    if (i % 2 == 0) x = (x & 0x80ffffffu) | ((0x30u + (x >> 24) % 32) << 23);  // near f16 range
    const float f = std::bit_cast<float>(x);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    ASSERT_EQ(f32_to_f16(f), std::bit_cast<uint16_t>(h)) << f;
    ASSERT_EQ(f16_to_f32(std::bit_cast<uint16_t>(h)), static_cast<float>(h));
  }
}
#endif

TEST(DTypeTest, BF16) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie: even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // overflow: inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), b);
    }
  }
}

}  // namespace
}  // namespace ltm
