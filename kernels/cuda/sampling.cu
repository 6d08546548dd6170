// The device sampler (sampling.h): one block per row runs sampling_row.h's sample_row. Compiled
// with --fmad=false (kernels/CMakeLists.txt): no multiply-add is fused, as on the host.
#include "kernels/cuda/sampling.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling_row.h"

namespace ltm::kernels::cuda {
namespace {

__global__ void __launch_bounds__(kThreads)
sample_rows_kernel(SampleRowsArgs a, int32_t first_row, char* workspace, size_t slot_bytes,
                   size_t keys_offset, size_t lanes_offset, size_t sums_offset) {
  __shared__ Shared sh;
  char* slot = workspace + blockIdx.x * slot_bytes;
  const RowWorkspace ws{reinterpret_cast<float*>(slot),
                        reinterpret_cast<int32_t*>(slot + keys_offset),
                        reinterpret_cast<double*>(slot + lanes_offset),
                        reinterpret_cast<double*>(slot + sums_offset)};
  sample_row(a, first_row + static_cast<int32_t>(blockIdx.x), ws, sh);
}

__global__ void __launch_bounds__(kThreads)
select_candidates_kernel(CandidateRowsArgs a, int32_t first_row, char* workspace,
                         size_t slot_bytes, size_t keys_offset, size_t lanes_offset,
                         size_t sums_offset) {
  __shared__ Shared sh;
  char* slot = workspace + blockIdx.x * slot_bytes;
  const RowWorkspace ws{reinterpret_cast<float*>(slot),
                        reinterpret_cast<int32_t*>(slot + keys_offset),
                        reinterpret_cast<double*>(slot + lanes_offset),
                        reinterpret_cast<double*>(slot + sums_offset)};
  local_candidates(a, first_row + static_cast<int32_t>(blockIdx.x), ws, sh);
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

struct Layout {
  size_t keys_offset, lanes_offset, sums_offset, slot_bytes;
};

Layout layout(int64_t vocab) {
  size_t pow2 = 1;
  while (pow2 < static_cast<size_t>(vocab)) pow2 <<= 1;
  const size_t blocks = (static_cast<size_t>(vocab) + kBlock - 1) / kBlock;
  Layout l;
  l.keys_offset = align_up(static_cast<size_t>(vocab) * sizeof(float));
  l.lanes_offset = l.keys_offset + align_up(pow2 * sizeof(int32_t));
  l.sums_offset = l.lanes_offset + align_up(blocks * kLanes * sizeof(double));
  l.slot_bytes = l.sums_offset + align_up(blocks * sizeof(double));
  return l;
}

}  // namespace

size_t sample_rows_workspace_bytes(int64_t vocab, int32_t rows) {
  if (vocab <= 0 || rows <= 0) return 0;
  return layout(vocab).slot_bytes * static_cast<size_t>(std::min(rows, kRowsPerLaunch));
}

void sample_rows(const SampleRowsArgs& args, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
  if (args.rows <= 0) return;
  LTM_KERNEL_ASSERT(args.vocab > 0 && args.vocab <= INT32_MAX / 2 && args.stride >= args.vocab,
                    "sample_rows: vocab %lld, stride %lld", static_cast<long long>(args.vocab),
                    static_cast<long long>(args.stride));
  LTM_KERNEL_ASSERT(workspace_bytes >= sample_rows_workspace_bytes(args.vocab, args.rows),
                    "sample_rows: workspace of %zu bytes", workspace_bytes);
  const Layout l = layout(args.vocab);
  for (int32_t first = 0; first < args.rows; first += kRowsPerLaunch) {
    const int32_t rows = std::min(kRowsPerLaunch, args.rows - first);
    sample_rows_kernel<<<rows, kThreads, 0, stream>>>(args, first, static_cast<char*>(workspace),
                                                      l.slot_bytes, l.keys_offset,
                                                      l.lanes_offset, l.sums_offset);
    LTM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ltm::kernels::cuda

namespace ltm::kernels::cuda {

void select_candidates(const CandidateRowsArgs& args, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream) {
  if (args.rows <= 0) return;
  LTM_KERNEL_ASSERT(args.valid >= 0 && args.valid <= INT32_MAX / 2 && args.stride >= args.valid,
                    "select_candidates: valid %lld, stride %lld",
                    static_cast<long long>(args.valid), static_cast<long long>(args.stride));
  LTM_KERNEL_ASSERT(workspace_bytes >= sample_rows_workspace_bytes(args.valid, args.rows),
                    "select_candidates: workspace of %zu bytes", workspace_bytes);
  const Layout l = layout(args.valid > 0 ? args.valid : 1);
  for (int32_t first = 0; first < args.rows; first += kRowsPerLaunch) {
    const int32_t rows = std::min(kRowsPerLaunch, args.rows - first);
    select_candidates_kernel<<<rows, kThreads, 0, stream>>>(
        args, first, static_cast<char*>(workspace), args.valid > 0 ? l.slot_bytes : 0,
        l.keys_offset, l.lanes_offset, l.sums_offset);
    LTM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ltm::kernels::cuda
