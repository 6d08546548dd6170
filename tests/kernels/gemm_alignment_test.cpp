// The alignment the CUDA backend's cuBLASLt GEMMs tell the heuristic each operand offers
// (runtime/backend/gemm_alignment.h): the pointer's and the leading dimension's together, so an
// odd leading dimension never gets a kernel that loads 16 bytes per column.
#include "runtime/backend/gemm_alignment.h"

#include <gtest/gtest.h>

namespace ltm {
namespace {

TEST(GemmAlignment, LargestPowerOfTwoUpTo16) {
  EXPECT_EQ(pow2_alignment(0), 16u);
  EXPECT_EQ(pow2_alignment(1), 1u);
  EXPECT_EQ(pow2_alignment(2), 2u);
  EXPECT_EQ(pow2_alignment(6), 2u);
  EXPECT_EQ(pow2_alignment(8), 8u);
  EXPECT_EQ(pow2_alignment(24), 8u);
  EXPECT_EQ(pow2_alignment(32), 16u);
  EXPECT_EQ(pow2_alignment(0x7f0000001000ull), 16u);
}

TEST(GemmAlignment, PointerAndLeadingDimensionTogether) {
  const uintptr_t base = 0x7f0000000000;  // what the device pool hands out: 256-byte aligned
  // bf16 rows of 768 (1536 bytes) and 64 (128 bytes): 16.
  EXPECT_EQ(operand_alignment(base, 768, 2), 16u);
  EXPECT_EQ(operand_alignment(base, 64, 2), 16u);
  // Odd leading dimensions: every other column starts 2 (bf16) or 4 (f32) bytes off.
  EXPECT_EQ(operand_alignment(base, 33, 2), 2u);
  EXPECT_EQ(operand_alignment(base, 97, 4), 4u);
  EXPECT_EQ(operand_alignment(base, 65, 2), 2u);
  // ld 12 bf16 = 24 bytes: 8.
  EXPECT_EQ(operand_alignment(base, 12, 2), 8u);
  // An offset into a buffer: the pointer limits it.
  EXPECT_EQ(operand_alignment(base + 8, 768, 2), 8u);
  EXPECT_EQ(operand_alignment(base + 2, 768, 2), 2u);
  // fp32 D with ld 2304: 16.
  EXPECT_EQ(operand_alignment(base, 2304, 4), 16u);
}

}  // namespace
}  // namespace ltm
