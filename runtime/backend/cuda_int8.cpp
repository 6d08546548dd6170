#include "runtime/backend/cuda_int8.h"

#include "common/check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/int8_gemm.h"
#include "kernels/cuda/int8_layout.h"

namespace ltm {
namespace {

// The two strided copies of a staging into an int8 weight's buffer, then the wait for them.
void upload(void* w, const kernels::cuda::Int8Staged& st, const std::vector<int8_t>& quants,
            const std::vector<uint16_t>& scales, cudaStream_t stream) {
  auto* base = static_cast<char*>(w);
  LTM_CUDA_CHECK(cudaMemcpy2DAsync(base + st.quants.dst_offset, st.quants.dst_pitch,
                                   quants.data(), st.quants.src_pitch, st.quants.width,
                                   st.quants.height, cudaMemcpyHostToDevice, stream));
  LTM_CUDA_CHECK(cudaMemcpy2DAsync(base + st.scales.dst_offset, st.scales.dst_pitch,
                                   scales.data(), st.scales.src_pitch, st.scales.width,
                                   st.scales.height, cudaMemcpyHostToDevice, stream));
  LTM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

void CudaInt8Uploader::write_rows(void* w, size_t w_bytes, const float* rows, int64_t row_begin,
                                  int64_t row_end, int64_t k, int64_t n, cudaStream_t stream) {
  LTM_ASSERT(0 <= row_begin && row_begin <= row_end && row_end <= k && row_begin % 32 == 0 &&
                 (row_end % 32 == 0 || row_end == k) &&
                 w_bytes >= kernels::cuda::int8_weight_bytes(n, k),
             "int8 weight rows [", row_begin, ", ", row_end, ") of ", k,
             " are not whole groups of 32");
  if (row_end == row_begin) return;
  upload(w, kernels::cuda::int8_stage_rows(rows, row_begin, row_end, k, n, quants_, scales_),
         quants_, scales_, stream);
}

void CudaInt8Uploader::write_table_rows(void* table, size_t table_bytes, const float* e_rows,
                                        int64_t row_begin, int64_t row_end, int64_t rows,
                                        int64_t d, cudaStream_t stream) {
  LTM_ASSERT(0 <= row_begin && row_begin <= row_end && row_end <= rows &&
             table_bytes >= kernels::cuda::int8_weight_bytes(rows, d));
  if (row_end == row_begin) return;
  upload(table,
         kernels::cuda::int8_stage_table_rows(e_rows, row_begin, row_end, rows, d, quants_,
                                              scales_),
         quants_, scales_, stream);
}

}  // namespace ltm
