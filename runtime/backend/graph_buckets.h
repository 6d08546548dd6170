// Padded batch sizes for replaying captured decode steps (CUDA graphs).
//
// A captured graph has fixed grids and fixed buffers, so a decode step of `batch` sequences runs
// the graph captured for the smallest bucket >= batch, its extra rows padding (no new token:
// slot -1, zero new rows, their outputs ignored). The buckets are 1, 2, 4, then every multiple of
// 8 up to the largest batch served (rounded up to 8): at most 7 padded rows per step above 8, and
// max_batch / 8 + 3 graphs in all. A batch above the largest bucket runs eagerly.
//
// Plain C++ (no CUDA), so the arithmetic is unit-tested on any machine (graph_buckets_test).
// Status: the arithmetic only; capture and replay are not wired into the CUDA backend yet.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ltm {

// Ascending bucket sizes covering batches 1 .. max_batch (empty when max_batch < 1).
inline std::vector<int> graph_bucket_sizes(int max_batch) {
  std::vector<int> sizes;
  if (max_batch < 1) return sizes;
  for (int s : {1, 2, 4}) {
    if (s >= max_batch) {
      sizes.push_back(s);
      return sizes;
    }
    sizes.push_back(s);
  }
  const int top = (max_batch + 7) / 8 * 8;
  for (int s = 8; s <= top; s += 8) sizes.push_back(s);
  return sizes;
}

// The bucket a batch of `batch` rows (>= 1) runs in: the smallest size >= batch, or 0 when it is
// larger than every bucket (run eagerly).
inline int graph_bucket_for(int batch, std::span<const int> sizes) {
  if (batch < 1) return 0;
  for (int s : sizes)
    if (s >= batch) return s;
  return 0;
}

// Bytes of the decode attention workspace a bucket's graph needs, sized for the longest context
// it may meet (the grid of a captured graph cannot grow): per (row, head, partition) a head_dim
// accumulator and (max, sum), as kernels/cuda/attention.h lays it out.
inline size_t graph_attention_workspace_bytes(int bucket, int n_head, int head_dim,
                                              int64_t max_context, int partition_tokens) {
  const int64_t parts = (max_context + partition_tokens - 1) / partition_tokens;
  if (parts <= 1) return 0;
  return static_cast<size_t>(bucket) * n_head * parts * (static_cast<size_t>(head_dim) + 2) *
         sizeof(float);
}

}  // namespace ltm
