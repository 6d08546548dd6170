// The host side of the CUDA backend's int8 weights (kernels/cuda/int8_gemm.h's layout), plain C++
// (C++20: not for nvcc's C++17 .cu files) without CUDA headers, so that tests/kernels/cuda_int8_lane_test.cpp checks on the CPU what the
// backend uploads: rows of W quantized by the CPU's rule (kernels/cpu/int8_quant.h) into staging
// buffers, and the two strided copies (cudaMemcpy2D's geometry) that put them in place.
//
// Layout: W [k, n] as n columns of kp = ceil(k / 32) * 32 int8 quants (zero past k), then the n
// columns' kp / 32 fp16 scales: bytes [0, n kp) quants, [n kp, n kp + 2 n kp / 32) scales.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/int8_quant.h"

namespace ltm::kernels::cuda {

// `height` rows of `width` bytes from a staging buffer (rows src_pitch apart) to the weight's
// buffer at dst_offset (rows dst_pitch apart): cudaMemcpy2D's arguments.
struct Int8Copy {
  size_t dst_offset = 0, dst_pitch = 0, src_pitch = 0, width = 0, height = 0;
};
struct Int8Staged {
  Int8Copy quants;  // from the quant staging
  Int8Copy scales;  // from the scale staging
};

// Rows [row_begin, row_end) of W [k, n] (fp32, row-major: `rows` holds them) into the staging
// buffers: each column's groups of 32 rows quantized; row_begin a multiple of 32 and row_end one
// too or k (whole groups). The quants of a column are q[c * width + (p - row_begin)], zero past k.
inline Int8Staged int8_stage_rows(const float* rows, int64_t row_begin, int64_t row_end,
                                  int64_t k, int64_t n, std::vector<int8_t>& q,
                                  std::vector<uint16_t>& s) {
  const int64_t kp = (k + 31) / 32 * 32, groups = kp / 32;
  const int64_t g0 = row_begin / 32, g1 = (row_end + 31) / 32, width = (g1 - g0) * 32;
  q.assign(static_cast<size_t>(n * width), 0);
  s.resize(static_cast<size_t>(n * (g1 - g0)));
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t p0 = g * 32, count = std::min<int64_t>(32, row_end - p0);
    for (int64_t c = 0; c < n; ++c)
      s[c * (g1 - g0) + (g - g0)] = int8_quantize_group(rows + (p0 - row_begin) * n + c, n, count,
                                                        q.data() + c * width + (p0 - row_begin));
  }
  Int8Staged out;
  out.quants = {static_cast<size_t>(row_begin), static_cast<size_t>(kp),
                static_cast<size_t>(width), static_cast<size_t>(width), static_cast<size_t>(n)};
  out.scales = {static_cast<size_t>(n * kp + 2 * g0), static_cast<size_t>(2 * groups),
                static_cast<size_t>(2 * (g1 - g0)), static_cast<size_t>(2 * (g1 - g0)),
                static_cast<size_t>(n)};
  return out;
}

// Rows [row_begin, row_end) of a tied embedding E [rows, d] (each row of E is a column of the
// weight E^T: n = rows, k = d): contiguous in both parts, one "row" of bytes each.
inline Int8Staged int8_stage_table_rows(const float* e_rows, int64_t row_begin, int64_t row_end,
                                        int64_t rows, int64_t d, std::vector<int8_t>& q,
                                        std::vector<uint16_t>& s) {
  const int64_t kp = (d + 31) / 32 * 32, groups = kp / 32, count = row_end - row_begin;
  q.assign(static_cast<size_t>(count * kp), 0);
  s.resize(static_cast<size_t>(count * groups));
  for (int64_t r = 0; r < count; ++r)
    for (int64_t g = 0; g < groups; ++g)
      s[r * groups + g] = int8_quantize_group(e_rows + r * d + g * 32, 1,
                                              std::min<int64_t>(32, d - g * 32),
                                              q.data() + r * kp + g * 32);
  const size_t qb = static_cast<size_t>(count * kp), sb = static_cast<size_t>(count * groups * 2);
  Int8Staged out;
  out.quants = {static_cast<size_t>(row_begin * kp), qb, qb, qb, 1};
  out.scales = {static_cast<size_t>(rows * kp + row_begin * groups * 2), sb, sb, sb, 1};
  return out;
}

}  // namespace ltm::kernels::cuda
