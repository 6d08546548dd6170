// Element types of weight matrices and KV caches on the CPU: fp32, or 16-bit (bf16, fp16) to
// halve the bytes a memory-bound decode step reads. Activations and accumulation stay fp32; the
// 16-bit values are converted to fp32 as they are read (packed_gemm.h, attention.h).
//
// The scalar conversions here are the reference: every kernel path's vector conversion
// (kernels/cpu/vec_kernels.inc) gives bit-identical results (tests/kernels/cpu_isa_test.cpp).
// Rounding is to nearest, ties to even. A NaN stays a NaN (quiet, sign and the top payload bits
// kept: bf16 = the f32's top 16 bits | 0x0040; f16 = sign | 0x7e00 | f32 payload bits 22..13, as
// F16C's vcvtps2ph does); f16 overflow (|x| >= 65520) gives inf; values below the f16 normal
// range round to f16 subnormals. Widening is exact (an f16 signalling NaN comes back quiet, as
// vcvtph2ps does; bf16 -> f32 is the 16-bit shift).
//
// Declarations only: the ISA units (kernels/cpu/*_avx512.cpp, ...) see this header through
// isa_kernels.h and must find no inline function here (see isa_kernels.h why).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ltm::kernels::cpu {

// kInt8: weights only (never a KV cache), symmetric int8 in groups of 32 with fp16 scales, not an
// element type but a packed layout of its own (kernels/cpu/int8_gemm.h); packed_gemm.h's
// WeightType-generic functions hand it to int8_gemm.h's.
enum class WeightType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kInt8 = 3 };

size_t weight_type_size(WeightType t);       // 4, 2, 2, 1 (int8: the quants, scales apart)
const char* weight_type_name(WeightType t);  // "f32", "bf16", "f16", "int8"

uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t x);
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t x);

// Addition: the value x takes after a round trip through t (x itself for kF32 and for kInt8,
// whose rounding depends on the group: int8_gemm.h).
float round_to(WeightType t, float x);

}  // namespace ltm::kernels::cpu
