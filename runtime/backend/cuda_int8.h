// The CUDA backend's int8 weights on their way in (--weight-dtype int8): rows of W, or of the tied
// embedding table, quantized on the host by the CPU backend's rule (kernels/cpu/int8_quant.h)
// into columns of quants and their scales (kernels/cuda/int8_gemm.h's layout), staged and put
// in place by two strided copies (kernels/cuda/int8_layout.h's geometry). The GEMMs on them are
// the backend's matmul_int8 (cuda_backend.cpp): kernels/cuda/int8_gemm.h's weight-streaming kernel
// up to kInt8GemvMaxRows rows, its tensor-core kernel up to kInt8MmaMaxRows, a dequantized fp16
// copy on cuBLASLt beyond.
// Threading: one thread at a time (the backend's); each call waits for its copies, since the
// staging is rewritten by the next (loading is not hot).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ltm {

class CudaInt8Uploader {
 public:
  // Rows [row_begin, row_end) of W [k, n] (whole groups of 32; the last may end at k) into the
  // int8 weight at `w` (w_bytes >= int8_weight_bytes(n, k)).
  void write_rows(void* w, size_t w_bytes, const float* rows, int64_t row_begin, int64_t row_end,
                  int64_t k, int64_t n, cudaStream_t stream);
  // Rows [row_begin, row_end) of the table E [rows, d] into the int8 weight of E^T at `table`
  // (n = rows columns of k = d: a row of E is a column of lm_head's weight).
  void write_table_rows(void* table, size_t table_bytes, const float* e_rows, int64_t row_begin,
                        int64_t row_end, int64_t rows, int64_t d, cudaStream_t stream);

 private:
  std::vector<int8_t> quants_;    // the quants of the rows being written
  std::vector<uint16_t> scales_;  // their fp16 scales
};

}  // namespace ltm
