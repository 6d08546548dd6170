// kv_cache_write and the dispatch between the decode and prefill attention kernels.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"

namespace ltm::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Tokens walk grid.y; grid.x * blockDim.x covers n_head * vecs_per_head T elements of K (and V).
template <typename T>
__global__ void kv_cache_write_kernel(const T* __restrict__ qkv,
                                      const int32_t* __restrict__ slot_mapping, int64_t n_tokens,
                                      int n_head, int vecs_per_head, int block_size,
                                      T* __restrict__ k_cache, T* __restrict__ v_cache) {
  const int64_t row_vecs = static_cast<int64_t>(n_head) * vecs_per_head;  // one of Q, K, V
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= row_vecs) return;
  const int head = static_cast<int>(i / vecs_per_head);
  const int v = static_cast<int>(i % vecs_per_head);
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    const int64_t dst = ((block * n_head + head) * block_size + offset) * vecs_per_head + v;
    const T* row = qkv + t * 3 * row_vecs;
    k_cache[dst] = row[row_vecs + i];
    v_cache[dst] = row[2 * row_vecs + i];
  }
}

}  // namespace

void kv_cache_write(const float* qkv, const int32_t* slot_mapping, int64_t n_tokens, int n_head,
                    int head_dim, int block_size, float* k_cache, float* v_cache,
                    cudaStream_t stream) {
  if (n_tokens <= 0 || n_head <= 0 || head_dim <= 0) return;
  const bool vec = head_dim % 4 == 0 && aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache);
  const int vecs_per_head = vec ? head_dim / 4 : head_dim;
  const int64_t row_vecs = static_cast<int64_t>(n_head) * vecs_per_head;
  const int threads = threads_for_row(row_vecs, kThreads);
  const dim3 grid(static_cast<unsigned>(ceil_div(row_vecs, threads)), grid_rows(n_tokens));
  if (vec) {
    kv_cache_write_kernel<<<grid, threads, 0, stream>>>(
        reinterpret_cast<const float4*>(qkv), slot_mapping, n_tokens, n_head, vecs_per_head,
        block_size, reinterpret_cast<float4*>(k_cache), reinterpret_cast<float4*>(v_cache));
  } else {
    kv_cache_write_kernel<<<grid, threads, 0, stream>>>(qkv, slot_mapping, n_tokens, n_head,
                                                        vecs_per_head, block_size, k_cache,
                                                        v_cache);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

size_t paged_attention_workspace_bytes(const PagedAttentionShape& s) {
  if (s.max_new_tokens > 1) return 0;  // prefill needs none
  const int parts = detail::decode_partitions(s);
  if (parts <= 1) return 0;
  // Per (sequence, head, partition): head_dim accumulator floats, then (max, sum) after them all.
  const size_t units = static_cast<size_t>(s.n_seqs) * s.n_head * parts;
  return units * (static_cast<size_t>(s.head_dim) + 2) * sizeof(float);
}

void paged_attention(const PagedAttentionShape& s, const float* qkv, const float* k_cache,
                     const float* v_cache, float* out, void* workspace, cudaStream_t stream) {
  if (s.n_seqs <= 0 || s.n_head <= 0 || s.max_new_tokens <= 0) return;
  LTM_KERNEL_ASSERT(s.head_dim > 0 && s.block_size > 0, "paged_attention: head_dim %d, block_size %d",
                    s.head_dim, s.block_size);
  if (s.max_new_tokens == 1) {
    detail::launch_paged_decode(s, qkv, k_cache, v_cache, out, static_cast<float*>(workspace),
                                stream);
  } else {
    detail::launch_paged_prefill(s, qkv, k_cache, v_cache, out, stream);
  }
}

}  // namespace ltm::kernels::cuda
