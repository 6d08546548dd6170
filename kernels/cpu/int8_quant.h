// The int8 weight quantization rule (--weight-dtype int8), for every backend that holds int8
// weights: the CPU's packed panels (int8_gemm.cpp) and the CUDA backend's [n, k] rows
// (runtime/backend/cuda_backend.cpp). One rule in one place, so that both backends hold the same
// quants and scales for a checkpoint (cuda_int8_gpu_test checks it).
//
// A group is up to 32 weights along the reduction dimension of one column. Its scale is
// max |w| / 127 rounded to fp16 (a non-finite or out-of-range max gets the largest fp16 scale, so
// its weights clamp: such a checkpoint is broken, and loading must not crash on it); each weight
// is then rounded to nearest (ties to even) of w / s and clamped to [-127, 127], so that q * s is
// what the GEMMs use. A NaN weight quantizes to 0.
// Header-only, dependency-free (runtime/model/dtype.h's conversions), host code only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/model/dtype.h"

namespace ltm::kernels {

// fp16 bits of the scale of a group whose largest magnitude is amax.
inline uint16_t int8_weight_scale(float amax) {
  float s = amax / 127.0f;
  if (!(s <= 65504.0f)) s = 65504.0f;  // also NaN
  return f32_to_f16(s);
}

// The quant of x under a scale whose reciprocal is inv (0 for a zero scale).
inline int8_t int8_weight_quant(float x, float inv) {
  float v = x * inv;
  if (!(v == v)) v = 0.0f;
  v = std::min(127.0f, std::max(-127.0f, v));
  return static_cast<int8_t>(static_cast<int>(std::nearbyint(v)));
}

// One group: `rows` (<= 32) weights x[0], x[stride], x[2 stride], ... into q[0 .. rows); returns
// the fp16 bits of the group's scale.
inline uint16_t int8_quantize_group(const float* x, int64_t stride, int64_t rows, int8_t* q) {
  float amax = 0.0f;
  for (int64_t p = 0; p < rows; ++p) {
    const float v = std::fabs(x[p * stride]);
    if (!(v <= amax)) amax = v;  // a NaN makes amax NaN: int8_weight_scale clamps it
  }
  const uint16_t h = int8_weight_scale(amax);
  const float s = f16_to_f32(h);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (int64_t p = 0; p < rows; ++p) q[p] = int8_weight_quant(x[p * stride], inv);
  return h;
}

}  // namespace ltm::kernels
