// The alignment a cuBLASLt operand offers (runtime/backend/cuda_lt_gemm.cpp), as plain C++ so
// that a CPU test checks it: every column of a column-major operand starts at
// address + j * ld * element_size, so the alignment all of them share is the largest power of two
// (capped at 16 bytes, the most any cuBLASLt kernel asks for) dividing both the address and the
// leading dimension's byte stride. An operand whose pointer is 16-byte aligned but whose ld is odd
// offers 2 bytes, not 16: the heuristic must not pick a kernel that loads 16 bytes at a time.
#pragma once

#include <cstdint>

namespace ltm {

// Largest power of two <= 16 dividing `v` (16 for 0).
inline uint32_t pow2_alignment(uint64_t v) {
  uint32_t a = 1;
  while (a < 16 && v % (2 * a) == 0) a *= 2;
  return a;
}

// What the operand at `address` with leading dimension `ld` elements of `element_bytes` offers.
inline uint32_t operand_alignment(uintptr_t address, int64_t ld, uint32_t element_bytes) {
  const uint32_t a = pow2_alignment(address);
  const uint32_t l = pow2_alignment(static_cast<uint64_t>(ld) * element_bytes);
  return a < l ? a : l;
}

}  // namespace ltm
