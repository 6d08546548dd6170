// kv_cache_write and the dispatch between the decode and prefill attention kernels.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"

namespace ltm::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Tokens walk grid.y; grid.x * blockDim.x covers n_kv_head * vecs_per_head groups of kVec
// elements of K (and V) of type `act`, converted to the cache's element type C.
template <typename C, int kVec>
__global__ void kv_cache_write_kernel(const void* __restrict__ qkv, ElemType act,
                                      const int32_t* __restrict__ slot_mapping, int64_t n_tokens,
                                      int n_head, int n_kv_head, int head_dim, int block_size,
                                      C* __restrict__ k_cache, C* __restrict__ v_cache) {
  const int vecs_per_head = head_dim / kVec;
  const int64_t row_vecs = static_cast<int64_t>(n_kv_head) * vecs_per_head;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= row_vecs) return;
  const int head = static_cast<int>(i / vecs_per_head);  // a KV head
  const int col = static_cast<int>(i % vecs_per_head) * kVec;
  const int64_t q_floats = static_cast<int64_t>(n_head) * head_dim;
  const int64_t kv_floats = static_cast<int64_t>(n_kv_head) * head_dim;  // one of K, V
  const int64_t row_stride = q_floats + 2 * kv_floats;
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    const int64_t dst = ((block * n_kv_head + head) * block_size + offset) * head_dim + col;
    const int64_t k_src = t * row_stride + q_floats + head * head_dim + col;
    const int64_t v_src = k_src + kv_floats;
    if constexpr (kVec == 4) {
      store4_f(k_cache + dst, load4_act(qkv, k_src, act));
      store4_f(v_cache + dst, load4_act(qkv, v_src, act));
    } else {
      k_cache[dst] = from_float<C>(load_act(qkv, k_src, act));
      v_cache[dst] = from_float<C>(load_act(qkv, v_src, act));
    }
  }
}

template <typename C>
void launch_kv_cache_write(const void* qkv, ElemType act, const int32_t* slot_mapping,
                           int64_t n_tokens, int n_head, int n_kv_head, int head_dim,
                           int block_size, void* k_cache, void* v_cache, cudaStream_t stream) {
  const bool vec = head_dim % 4 == 0 && aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache);
  const int vecs_per_head = vec ? head_dim / 4 : head_dim;
  const int64_t row_vecs = static_cast<int64_t>(n_kv_head) * vecs_per_head;
  const int threads = threads_for_row(row_vecs, kThreads);
  const dim3 grid(static_cast<unsigned>(ceil_div(row_vecs, threads)), grid_rows(n_tokens));
  C* k = static_cast<C*>(k_cache);
  C* v = static_cast<C*>(v_cache);
  if (vec) {
    kv_cache_write_kernel<C, 4><<<grid, threads, 0, stream>>>(
        qkv, act, slot_mapping, n_tokens, n_head, n_kv_head, head_dim, block_size, k, v);
  } else {
    kv_cache_write_kernel<C, 1><<<grid, threads, 0, stream>>>(
        qkv, act, slot_mapping, n_tokens, n_head, n_kv_head, head_dim, block_size, k, v);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void kv_cache_write(const void* qkv, ElemType act, const int32_t* slot_mapping, int64_t n_tokens,
                    int n_head, int n_kv_head, int head_dim, int block_size, void* k_cache,
                    void* v_cache, ElemType kv, cudaStream_t stream) {
  if (n_tokens <= 0 || n_head <= 0 || head_dim <= 0) return;
  if (n_kv_head <= 0) n_kv_head = n_head;
  LTM_KERNEL_ASSERT(n_head % n_kv_head == 0, "kv_cache_write: %d KV heads for %d query heads",
                    n_kv_head, n_head);
  switch (kv) {
    case ElemType::kF32:
      return launch_kv_cache_write<float>(qkv, act, slot_mapping, n_tokens, n_head, n_kv_head,
                                          head_dim, block_size, k_cache, v_cache, stream);
    case ElemType::kBF16:
      return launch_kv_cache_write<__nv_bfloat16>(qkv, act, slot_mapping, n_tokens, n_head,
                                                  n_kv_head, head_dim, block_size, k_cache,
                                                  v_cache, stream);
    case ElemType::kF16:
      return launch_kv_cache_write<__half>(qkv, act, slot_mapping, n_tokens, n_head, n_kv_head,
                                           head_dim, block_size, k_cache, v_cache, stream);
  }
}

size_t paged_attention_workspace_bytes(const PagedAttentionShape& s) {
  // Decode rows of a mixed batch use the decode kernel's partitions too.
  const int parts = detail::decode_partitions(s);
  if (parts <= 1) return 0;
  // Per (sequence, head, partition): head_dim accumulator floats, then (max, sum) after them all.
  const size_t units = static_cast<size_t>(s.n_seqs) * s.n_head * parts;
  return units * (static_cast<size_t>(s.head_dim) + 2) * sizeof(float);
}

void paged_attention(const PagedAttentionShape& s, const void* qkv, const void* k_cache,
                     const void* v_cache, void* out, void* workspace, cudaStream_t stream) {
  if (s.n_seqs <= 0 || s.n_head <= 0 || s.max_new_tokens <= 0) return;
  LTM_KERNEL_ASSERT(s.head_dim > 0 && s.block_size > 0, "paged_attention: head_dim %d, block_size %d",
                    s.head_dim, s.block_size);
  LTM_KERNEL_ASSERT(s.n_kv_head >= 0 && s.n_head % (s.n_kv_head > 0 ? s.n_kv_head : s.n_head) == 0,
                    "paged_attention: %d KV heads for %d query heads", s.n_kv_head, s.n_head);
  float* ws = static_cast<float*>(workspace);
  if (s.max_new_tokens == 1) {
    detail::launch_paged_decode(s, qkv, k_cache, v_cache, out, ws, /*single_only=*/false, stream);
  } else {
    // Mixed: the two kernels write disjoint rows, so their order does not matter.
    detail::launch_paged_prefill(s, qkv, k_cache, v_cache, out, /*skip_single=*/true, stream);
    detail::launch_paged_decode(s, qkv, k_cache, v_cache, out, ws, /*single_only=*/true, stream);
  }
}

}  // namespace ltm::kernels::cuda
