// Element-wise CPU kernels: residual add, bias add, row gather. Threaded with OpenMP.
// Row-major float32; pointers are host memory owned by the caller.
#pragma once

#include <cstdint>

namespace ltm::kernels::cpu {

void add(float* x, const float* y, int64_t n);                                 // x += y
void add_bias(float* x, const float* bias, int64_t rows, int64_t cols);        // x[r,:] += bias
void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t d);

}  // namespace ltm::kernels::cpu
