// Paged attention for decode: one new query row per sequence, attending to its whole context.
//
// Grid (head, sequence, partition); a block of kWarps warps covers the keys
// [partition * partition_tokens, +partition_tokens) of one (sequence, head). Warp w takes the
// partition's KV blocks w, w + kWarps, ... and, per KV block:
//   1. scores: a group of `lanes_per_key` lanes (a power of two, enough to give each lane up to
//      kMaxVecsPerLane float4 of the head) computes one key's q.k; a warp covers
//      32 / lanes_per_key keys per pass, reading them as one contiguous run of the block (keys of
//      a head are contiguous in the [n_blocks, n_head, block_size, d_k] layout);
//   2. online softmax: new running max m' = max(m, block max); the accumulator and running sum are
//      rescaled by exp(m - m'), the block's weights are exp(s - m');
//   3. acc += sum_k w_k v_k, each lane owning the same float4 columns it used for the scores.
// Then the lane groups (same m) are summed with shuffles, the warps merged through shared memory
// with the exp(m_w - m_max) rescaling, and either the normalised row is written (one partition) or
// the partition's (accumulator, max, sum) go to the workspace for decode_merge_kernel.
// The cache elements (float, bf16 or fp16: the template's C) are converted to float as they are
// loaded; a 16-bit cache halves the bytes each key costs, which is what bounds decode.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"

namespace ltm::kernels::cuda::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMaxVecsPerLane = 4;  // ceil(vecs per head / lanes_per_key) <= this
constexpr int kMergeThreads = 128;

// kVec floats per load: float4 when the head and every pointer allow it, else float.
template <int kVec>
struct VecOf;
template <>
struct VecOf<4> {
  using T = float4;
};
template <>
struct VecOf<1> {
  using T = float;
};

__device__ __forceinline__ float dot_v(float4 a, float4 b) { return dot4(a, b); }
__device__ __forceinline__ float dot_v(float a, float b) { return a * b; }
__device__ __forceinline__ void fma_v(float4& acc, float w, float4 v) { fma4(acc, w, v); }
__device__ __forceinline__ void fma_v(float& acc, float w, float v) { acc = fmaf(w, v, acc); }
__device__ __forceinline__ float4 scale_v(float4 v, float s) { return v * s; }
__device__ __forceinline__ float scale_v(float v, float s) { return v * s; }
__device__ __forceinline__ void zero_v(float4& v) { v = make_float4(0.f, 0.f, 0.f, 0.f); }
__device__ __forceinline__ void zero_v(float& v) { v = 0.0f; }
__device__ __forceinline__ float4 shfl_xor_v(float4 v, int offset) {
  return make_float4(__shfl_xor_sync(kFullMask, v.x, offset), __shfl_xor_sync(kFullMask, v.y, offset),
                     __shfl_xor_sync(kFullMask, v.z, offset), __shfl_xor_sync(kFullMask, v.w, offset));
}
__device__ __forceinline__ float shfl_xor_v(float v, int offset) {
  return __shfl_xor_sync(kFullMask, v, offset);
}
// kVec cache elements at p as float(s).
template <int kVec>
struct CacheLoad;
template <>
struct CacheLoad<4> {
  template <typename C>
  __device__ __forceinline__ static float4 at(const C* p) { return load4_f(p); }
};
template <>
struct CacheLoad<1> {
  template <typename C>
  __device__ __forceinline__ static float at(const C* p) { return to_float(*p); }
};
// kVec activations (qkv, out) at element i of a buffer of element type t.
template <int kVec>
struct ActIo;
template <>
struct ActIo<4> {
  __device__ __forceinline__ static float4 load(const void* p, int64_t i, ElemType t) {
    return load4_act(p, i, t);
  }
  __device__ __forceinline__ static void store(void* p, int64_t i, float4 v, ElemType t) {
    store4_act(p, i, v, t);
  }
};
template <>
struct ActIo<1> {
  __device__ __forceinline__ static float load(const void* p, int64_t i, ElemType t) {
    return load_act(p, i, t);
  }
  __device__ __forceinline__ static void store(void* p, int64_t i, float v, ElemType t) {
    store_act(p, i, v, t);
  }
};

// Lanes cooperating on one key: the smallest power of two giving each lane at most
// `vecs_per_lane` of the head's `vecs` vectors, <= 32. The kernel takes kMaxVecsPerLane: a lane
// then keeps that many independent loads in flight and a warp scores several keys a pass (128
// dims: 8 lanes a key, 4 keys a pass, 3 shuffles a pass), where one vector a lane (the kernel
// before 2026-12-06, LTM_CUDA_DECODE_VECS=1) scored one key a pass with a 5-shuffle reduction
// after one load, 16 dependent rounds a KV block: latency, ~14 us a layer on the H100 at a
// context of ~10 (the first device run's profile).
__host__ __device__ inline int lanes_per_key(int vecs, int vecs_per_lane) {
  int lanes = 1;
  while (lanes * vecs_per_lane < vecs && lanes < kWarpSize) lanes *= 2;
  return lanes;
}

int decode_vecs_per_lane() {
  static const int v = [] {
    const char* e = std::getenv("LTM_CUDA_DECODE_VECS");
    return e != nullptr && std::strcmp(e, "1") == 0 ? 1 : kMaxVecsPerLane;
  }();
  return v;
}

struct DecodeParams : PagedParams {
  float* part_acc;       // [n_seqs, n_head, n_partitions, head_dim]   (n_partitions > 1)
  float* part_stats;     // [n_seqs, n_head, n_partitions, 2]: max, sum
  int partition_tokens;  // a multiple of block_size
  int n_partitions;      // gridDim.z
  int single_only;       // mixed batch: only sequences with exactly one new row are ours
  int group_lanes;       // lanes_per_key(head_dim / kVec, decode_vecs_per_lane())
};

template <int kVec, typename C>
__global__ void __launch_bounds__(kThreads) paged_decode_kernel(const DecodeParams p) {
  using V = typename VecOf<kVec>::T;
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int part = blockIdx.z;
  const int first_row = p.token_offsets[seq];
  const int n_new = p.token_offsets[seq + 1] - first_row;
  if (n_new <= 0 || (p.single_only && n_new != 1)) return;
  const int ctx = p.context_lens[seq];
  const int key_begin = part * p.partition_tokens;
  if (key_begin >= ctx) return;
  const int key_end = min(ctx, key_begin + p.partition_tokens);
  const int row = first_row + n_new - 1;  // at position ctx - 1: every cached key is visible
  const int n_vec = p.head_dim / kVec;

  extern __shared__ float4 smem[];
  V* q_s = reinterpret_cast<V*>(smem);                                   // [n_vec], pre-scaled
  V* warp_acc = q_s + n_vec;                                             // [kWarps][n_vec]
  float* warp_m = reinterpret_cast<float*>(warp_acc + kWarps * n_vec);   // [kWarps]
  float* warp_l = warp_m + kWarps;                                       // [kWarps]
  float* scores = warp_l + kWarps;                                       // [kWarps][block_size]

  const int64_t q_src = static_cast<int64_t>(row) * p.qkv_stride +
                        static_cast<int64_t>(head) * p.head_dim;  // elements of p.act
  for (int i = threadIdx.x; i < n_vec; i += blockDim.x)
    q_s[i] = scale_v(ActIo<kVec>::load(p.qkv, q_src + i * kVec, p.act), p.scale);
  __syncthreads();

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group_lanes = p.group_lanes;
  const int keys_per_pass = kWarpSize / group_lanes;
  const int group = lane / group_lanes;  // which key of the pass
  const int lig = lane % group_lanes;    // lane in group: vectors lig, lig + group_lanes, ...
  float* sc = scores + warp * p.block_size;

  float m = -INFINITY;  // running max of this warp's scores
  float l = 0.0f;       // running sum of exp(score - m)
  V acc[kMaxVecsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxVecsPerLane; ++j) zero_v(acc[j]);

  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int first_block = key_begin / p.block_size;
  const int last_block = (key_end - 1) / p.block_size;
  for (int b = first_block + warp; b <= last_block; b += kWarps) {
    const int64_t base =
        (static_cast<int64_t>(table[b]) * p.n_kv_head + head / p.kv_group) * p.block_size *
        p.head_dim;
    const C* k_block = static_cast<const C*>(p.k_cache) + base;
    const C* v_block = static_cast<const C*>(p.v_cache) + base;
    const int n_keys = min(p.block_size, key_end - b * p.block_size);

    // 1. Scores (the loop bound is uniform over the warp so every lane reaches the shuffles).
    for (int k0 = 0; k0 < n_keys; k0 += keys_per_pass) {
      const int k = k0 + group;
      float dot = 0.0f;
      if (k < n_keys) {
        const C* key = k_block + static_cast<int64_t>(k) * p.head_dim;
        for (int i = lig; i < n_vec; i += group_lanes)
          dot += dot_v(q_s[i], CacheLoad<kVec>::at(key + i * kVec));
      }
      for (int offset = group_lanes / 2; offset > 0; offset >>= 1)
        dot += __shfl_xor_sync(kFullMask, dot, offset);
      if (k < n_keys && lig == 0) sc[k] = dot;
    }
    __syncwarp();

    // 2. Online softmax over the block.
    float block_max = -INFINITY;
    for (int k = lane; k < n_keys; k += kWarpSize) block_max = fmaxf(block_max, sc[k]);
    const float m_new = fmaxf(m, warp_max(block_max));
    const float alpha = expf(m - m_new);  // 0 on the first block (m = -inf)
    float block_sum = 0.0f;
    for (int k = lane; k < n_keys; k += kWarpSize) {
      const float w = expf(sc[k] - m_new);
      sc[k] = w;
      block_sum += w;
    }
    l = l * alpha + warp_sum(block_sum);
    m = m_new;
    __syncwarp();

    // 3. acc = alpha * acc + sum_k w_k v_k over this group's keys.
#pragma unroll
    for (int j = 0; j < kMaxVecsPerLane; ++j) acc[j] = scale_v(acc[j], alpha);
    for (int k = group; k < n_keys; k += keys_per_pass) {
      const float w = sc[k];
      const C* value = v_block + static_cast<int64_t>(k) * p.head_dim;
#pragma unroll
      for (int j = 0; j < kMaxVecsPerLane; ++j) {
        const int i = lig + j * group_lanes;
        if (i < n_vec) fma_v(acc[j], w, CacheLoad<kVec>::at(value + i * kVec));
      }
    }
    __syncwarp();  // sc is rewritten by the next block
  }

  // Merge the lane groups of the warp (they share m and l), then the warps.
  for (int offset = group_lanes; offset < kWarpSize; offset <<= 1) {
#pragma unroll
    for (int j = 0; j < kMaxVecsPerLane; ++j) acc[j] = acc[j] + shfl_xor_v(acc[j], offset);
  }
  if (group == 0) {
#pragma unroll
    for (int j = 0; j < kMaxVecsPerLane; ++j) {
      const int i = lig + j * group_lanes;
      if (i < n_vec) warp_acc[warp * n_vec + i] = acc[j];
    }
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  __syncthreads();

  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
  float weight[kWarps];  // exp(m_w - m_all): 0 for a warp that saw no key (m_w = -inf)
  float l_all = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = expf(warp_m[w] - m_all);
    l_all += weight[w] * warp_l[w];
  }

  if (p.n_partitions == 1) {
    const float inv_l = 1.0f / l_all;
    const int64_t out0 =
        static_cast<int64_t>(row) * p.n_head * p.head_dim +  // out rows: n_head heads
        static_cast<int64_t>(head) * p.head_dim;
    for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
      V o;
      zero_v(o);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) fma_v(o, weight[w], warp_acc[w * n_vec + i]);
      ActIo<kVec>::store(p.out, out0 + i * kVec, scale_v(o, inv_l), p.act);
    }
  } else {
    const int64_t unit = (static_cast<int64_t>(seq) * p.n_head + head) * p.n_partitions + part;
    V* part_acc = reinterpret_cast<V*>(p.part_acc + unit * p.head_dim);
    for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
      V o;
      zero_v(o);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) fma_v(o, weight[w], warp_acc[w * n_vec + i]);
      part_acc[i] = o;
    }
    if (threadIdx.x == 0) {
      p.part_stats[2 * unit] = m_all;
      p.part_stats[2 * unit + 1] = l_all;
    }
  }
}

// Grid (head, sequence): merges the partitions of one (sequence, head) with the same rescaling.
__global__ void __launch_bounds__(kMergeThreads) decode_merge_kernel(const DecodeParams p) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int first_row = p.token_offsets[seq];
  const int n_new = p.token_offsets[seq + 1] - first_row;
  if (n_new <= 0 || (p.single_only && n_new != 1)) return;
  const int ctx = p.context_lens[seq];
  const int n_parts =
      min(p.n_partitions, static_cast<int>(ceil_div(ctx, p.partition_tokens)));
  if (n_parts <= 0) return;
  const int64_t unit0 = (static_cast<int64_t>(seq) * p.n_head + head) * p.n_partitions;
  const float* stats = p.part_stats + 2 * unit0;

  extern __shared__ float weight[];  // [n_partitions]: exp(m_p - m_all) / l_all
  __shared__ float m_all_s;
  if (threadIdx.x == 0) {
    float m_all = -INFINITY;
    for (int q = 0; q < n_parts; ++q) m_all = fmaxf(m_all, stats[2 * q]);
    m_all_s = m_all;
  }
  __syncthreads();
  float l_part = 0.0f;
  for (int q = threadIdx.x; q < n_parts; q += blockDim.x) {
    weight[q] = expf(stats[2 * q] - m_all_s);
    l_part += weight[q] * stats[2 * q + 1];
  }
  __shared__ float scratch[32];
  const float inv_l = 1.0f / block_sum(l_part, scratch);  // block_sum synchronises: weight[] ready

  const int row = first_row + n_new - 1;
  const int64_t out0 = static_cast<int64_t>(row) * p.n_head * p.head_dim +
                      static_cast<int64_t>(head) * p.head_dim;  // elements of p.act
  const float* acc = p.part_acc + unit0 * p.head_dim;
  for (int c = threadIdx.x; c < p.head_dim; c += blockDim.x) {
    float o = 0.0f;
    for (int q = 0; q < n_parts; ++q)
      o = fmaf(weight[q], acc[static_cast<int64_t>(q) * p.head_dim + c], o);
    store_act(p.out, out0 + c, o * inv_l, p.act);
  }
}

int partition_tokens(int block_size) {
  const int blocks = kDecodePartitionTokens / block_size;
  return block_size * (blocks < 1 ? 1 : blocks);
}

bool partitions_fit_grid(const PagedAttentionShape& s) {  // grid.z
  return ceil_div(s.max_context_len, partition_tokens(s.block_size)) <= 65535;
}

}  // namespace

int decode_partitions(const PagedAttentionShape& s) {
  const int parts = static_cast<int>(ceil_div(s.max_context_len, partition_tokens(s.block_size)));
  return parts < 1 ? 1 : parts;
}

namespace {

template <int kVec>
void launch_decode_kernel(const dim3& grid, size_t smem, ElemType kv, const DecodeParams& p,
                          cudaStream_t stream) {
  switch (kv) {
    case ElemType::kF32:
      paged_decode_kernel<kVec, float><<<grid, kThreads, smem, stream>>>(p);
      break;
    case ElemType::kBF16:
      paged_decode_kernel<kVec, __nv_bfloat16><<<grid, kThreads, smem, stream>>>(p);
      break;
    case ElemType::kF16:
      paged_decode_kernel<kVec, __half><<<grid, kThreads, smem, stream>>>(p);
      break;
  }
}

}  // namespace

void launch_paged_decode(const PagedAttentionShape& s, const void* qkv, const void* k_cache,
                         const void* v_cache, void* out, float* workspace, bool single_only,
                         cudaStream_t stream) {
  const bool vec = s.head_dim % 4 == 0 && aligned16(qkv) && aligned16(k_cache) &&
                   aligned16(v_cache) && aligned16(out) && aligned16(workspace);
  const int kvec = vec ? 4 : 1;
  const int n_vec = s.head_dim / kvec;
  LTM_KERNEL_ASSERT(s.n_seqs <= 65535 && partitions_fit_grid(s), "decode attention: %d sequences, "
                    "context %d", s.n_seqs, s.max_context_len);
  const int group_lanes = lanes_per_key(n_vec, decode_vecs_per_lane());
  LTM_KERNEL_ASSERT(ceil_div(n_vec, group_lanes) <= kMaxVecsPerLane,
                    "decode attention supports head_dim <= 512 (multiple of 4) or <= 128; got %d",
                    s.head_dim);
  DecodeParams p{};
  static_cast<PagedParams&>(p) = paged_params(s, qkv, k_cache, v_cache, out);
  p.partition_tokens = partition_tokens(s.block_size);
  p.n_partitions = decode_partitions(s);
  p.single_only = single_only ? 1 : 0;
  p.group_lanes = group_lanes;
  if (p.n_partitions > 1) {
    LTM_KERNEL_ASSERT(workspace != nullptr, "decode attention over %d partitions needs a workspace",
                      p.n_partitions);
    const int64_t units = static_cast<int64_t>(s.n_seqs) * s.n_head * p.n_partitions;
    p.part_acc = workspace;
    p.part_stats = workspace + units * s.head_dim;
  }
  const size_t vec_bytes = static_cast<size_t>(kvec) * sizeof(float);
  const size_t smem = static_cast<size_t>(n_vec) * (1 + kWarps) * vec_bytes +
                      (2 * kWarps + static_cast<size_t>(kWarps) * s.block_size) * sizeof(float);
  LTM_KERNEL_ASSERT(smem <= 48 * 1024, "decode attention block_size %d too large", s.block_size);
  const dim3 grid(s.n_head, s.n_seqs, p.n_partitions);
  if (vec) {
    launch_decode_kernel<4>(grid, smem, s.kv, p, stream);
  } else {
    launch_decode_kernel<1>(grid, smem, s.kv, p, stream);
  }
  LTM_CUDA_CHECK_LAUNCH();
  if (p.n_partitions > 1) {
    decode_merge_kernel<<<dim3(s.n_head, s.n_seqs), kMergeThreads,
                          static_cast<size_t>(p.n_partitions) * sizeof(float), stream>>>(p);
    LTM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ltm::kernels::cuda::detail
