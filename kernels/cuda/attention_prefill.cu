// Paged attention for prefill (and mixed batches): flash-attention style, float32 on CUDA cores,
// where the tensor-core kernel (attention_prefill_mma.cu) does not apply.
//
// Grid (query tile, head, sequence). A block of 128 threads owns kTileQ = 32 query rows of one
// (sequence, head): it loads them once into shared memory (pre-scaled by 1/sqrt(d_k), zero-padded
// to a multiple of 4 columns), then streams the visible keys in tiles of kTileK = 32, each tile's K
// and V rows gathered through the block table into shared memory. Per tile:
//   S = Q K^T      thread (ty, tx) computes rows 4ty..4ty+3 x keys tx, tx+16 from float4 reads;
//   causal mask    key position > query position -> -inf;
//   online softmax per row: m' = max(m, tile max), l = l exp(m - m') + sum exp(s - m'), the
//                  output accumulator is rescaled by exp(m - m'); row max and sum are reduced
//                  over the 16 threads sharing a row group with shuffles; P goes to shared memory;
//   O += P V       thread (ty, tx) owns rows 4ty..4ty+3 x float4 columns tx, tx+16, ... in
//                  registers (kMaxHeadDim / 64 float4 per row).
// The tile of the last query row bounds the keys read (causality): a tile of rows at the start of
// a long prompt reads only the keys before it. Finally O / l is written for the tile's real rows.
// K and V are converted to float as they are gathered (the template's C: float, bf16 or fp16).
#include <cmath>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"

namespace ltm::kernels::cuda::detail {
namespace {

constexpr int kTileQ = 32;
constexpr int kTileK = 32;
constexpr int kThreads = 128;
constexpr int kRowsPerThread = 4;     // kTileQ / (kThreads / 16)
constexpr int kThreadsPerRow = 16;    // threads sharing a row group (one half-warp)
constexpr int kPStride = kTileK + 4;  // shared row stride of P, floats (16-byte aligned rows)
static_assert(kTileQ == kRowsPerThread * (kThreads / kThreadsPerRow));
static_assert(kTileK == 2 * kThreadsPerRow);

struct PrefillParams : PagedParams {
  bool vec;          // head_dim % 4 == 0 and every pointer 16-byte aligned: float4 global I/O
  bool skip_single;  // mixed batch: sequences with one new row are the decode kernel's
};

// Shared row stride (floats) of Q, K and V for a head of `head_dim`: padded to a multiple of 4,
// plus 4 so that the float4 reads of 8 consecutive rows fall in distinct banks.
__host__ __device__ inline int smem_stride(int head_dim) { return (head_dim + 3) / 4 * 4 + 4; }

inline size_t prefill_smem_bytes(int head_dim) {
  return (static_cast<size_t>(kTileQ + 2 * kTileK) * smem_stride(head_dim) +
          static_cast<size_t>(kTileQ) * kPStride) * sizeof(float) +
         kTileK * sizeof(int64_t);
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// Columns [c, c + 4) of a global row of `head_dim` elements, as floats (zeros beyond it).
template <typename C>
__device__ __forceinline__ float4 load_cols(const C* row, int c, int head_dim, bool vec) {
  if (vec) return load4_f(row + c);
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = c + i < head_dim ? to_float(row[c + i]) : 0.0f;
  return make_float4(v[0], v[1], v[2], v[3]);
}

// The same for a row of activations of element type t, starting at element `row` of base.
__device__ __forceinline__ float4 load_cols_act(const void* base, int64_t row, int c, int head_dim,
                                                bool vec, ElemType t) {
  switch (t) {
    case ElemType::kBF16:
      return load_cols(static_cast<const __nv_bfloat16*>(base) + row, c, head_dim, vec);
    case ElemType::kF16:
      return load_cols(static_cast<const __half*>(base) + row, c, head_dim, vec);
    default: return load_cols(static_cast<const float*>(base) + row, c, head_dim, vec);
  }
}

template <int kMaxHeadDim, typename C>
__global__ void __launch_bounds__(kThreads) paged_prefill_kernel(const PrefillParams p) {
  constexpr int kColVecs = kMaxHeadDim / (4 * kThreadsPerRow);  // float4 columns per thread
  const int q_tile = blockIdx.x;
  const int head = blockIdx.y;
  const int seq = blockIdx.z;
  const int first_row = p.token_offsets[seq];
  const int n_new = p.token_offsets[seq + 1] - first_row;
  const int q_begin = q_tile * kTileQ;
  if (q_begin >= n_new || (p.skip_single && n_new == 1)) return;
  const int n_rows = min(kTileQ, n_new - q_begin);
  const int pos0 = p.context_lens[seq] - n_new + q_begin;  // position of the tile's row 0
  const int n_keys = pos0 + n_rows;                         // keys visible to its last row
  const int n_dvec = (p.head_dim + 3) / 4;                  // float4 columns, zero padded
  const int stride = smem_stride(p.head_dim);

  extern __shared__ float4 smem[];
  float* q_s = reinterpret_cast<float*>(smem);  // [kTileQ][stride]
  float* k_s = q_s + kTileQ * stride;           // [kTileK][stride]
  float* v_s = k_s + kTileK * stride;           // [kTileK][stride]
  float* p_s = v_s + kTileK * stride;           // [kTileQ][kPStride]
  int64_t* key_base = reinterpret_cast<int64_t*>(p_s + kTileQ * kPStride);  // [kTileK]

  const int tid = threadIdx.x;
  const int ty = tid / kThreadsPerRow;  // rows ty * 4 .. ty * 4 + 3
  const int tx = tid % kThreadsPerRow;  // keys tx, tx + 16; float4 columns tx, tx + 16, ...
  const int64_t qkv_stride = p.qkv_stride;
  const int64_t out_stride = static_cast<int64_t>(p.n_head) * p.head_dim;

  // Q tile, pre-scaled; rows past the sequence's new rows are zeros (their results are dropped).
  const int64_t q_src =  // elements of p.act
      (first_row + q_begin) * qkv_stride + static_cast<int64_t>(head) * p.head_dim;
  for (int i = tid; i < kTileQ * n_dvec; i += kThreads) {
    const int r = i / n_dvec;
    const int c = (i % n_dvec) * 4;
    const float4 q = r < n_rows
                         ? load_cols_act(p.qkv, q_src + r * qkv_stride, c, p.head_dim, p.vec, p.act)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
    store4(q_s + r * stride + c, q * p.scale);
  }

  float m[kRowsPerThread], l[kRowsPerThread];
  float4 acc[kRowsPerThread][kColVecs];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kColVecs; ++c) acc[i][c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  for (int k0 = 0; k0 < n_keys; k0 += kTileK) {
    __syncthreads();  // the previous tile's K, V and P are consumed
    if (tid < kTileK) {
      const int key = k0 + tid;
      key_base[tid] =
          key < n_keys ? ((static_cast<int64_t>(table[key / p.block_size]) * p.n_kv_head +
                           head / p.kv_group) *
                              p.block_size +
                          key % p.block_size) *
                             p.head_dim
                       : -1;
    }
    __syncthreads();
    for (int i = tid; i < kTileK * n_dvec; i += kThreads) {
      const int j = i / n_dvec;
      const int c = (i % n_dvec) * 4;
      const int64_t base = key_base[j];
      float4 k = make_float4(0.f, 0.f, 0.f, 0.f), v = k;  // zeros past the visible keys
      if (base >= 0) {
        k = load_cols(static_cast<const C*>(p.k_cache) + base, c, p.head_dim, p.vec);
        v = load_cols(static_cast<const C*>(p.v_cache) + base, c, p.head_dim, p.vec);
      }
      store4(k_s + j * stride + c, k);
      store4(v_s + j * stride + c, v);
    }
    __syncthreads();

    // S = Q K^T for this thread's 4 rows x 2 keys.
    float s[kRowsPerThread][2] = {};
    for (int c = 0; c < n_dvec * 4; c += 4) {
      float4 q[kRowsPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) q[i] = load4(q_s + (ty * kRowsPerThread + i) * stride + c);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float4 k = load4(k_s + (tx + j * kThreadsPerRow) * stride + c);
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) s[i][j] += dot4(q[i], k);
      }
    }

    // Causal mask and online softmax, row by row.
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = ty * kRowsPerThread + i;
      const int q_pos = pos0 + r;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = k0 + tx + j * kThreadsPerRow;
        if (key > q_pos || key >= n_keys) s[i][j] = -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
#pragma unroll
      for (int offset = kThreadsPerRow / 2; offset > 0; offset >>= 1)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, offset));
      const float m_new = fmaxf(m[i], tile_max);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // a row with no visible key yet
      const float alpha = expf(m[i] - m_ref);
      float tile_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float w = expf(s[i][j] - m_ref);
        p_s[r * kPStride + tx + j * kThreadsPerRow] = w;
        tile_sum += w;
      }
#pragma unroll
      for (int offset = kThreadsPerRow / 2; offset > 0; offset >>= 1)
        tile_sum += __shfl_xor_sync(kFullMask, tile_sum, offset);
      l[i] = l[i] * alpha + tile_sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < kColVecs; ++c) acc[i][c] = acc[i][c] * alpha;
    }
    __syncthreads();  // P complete

    // O += P V.
    const int tile_keys = min(kTileK, n_keys - k0);
    for (int k = 0; k < tile_keys; k += 4) {  // P and V are zero past tile_keys
      float w[kRowsPerThread][4];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const float4 pw = load4(p_s + (ty * kRowsPerThread + i) * kPStride + k);
        w[i][0] = pw.x;
        w[i][1] = pw.y;
        w[i][2] = pw.z;
        w[i][3] = pw.w;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int c = 0; c < kColVecs; ++c) {
          const int col = (tx + c * kThreadsPerRow) * 4;
          if (col < n_dvec * 4) {
            const float4 v = load4(v_s + (k + kk) * stride + col);
#pragma unroll
            for (int i = 0; i < kRowsPerThread; ++i) fma4(acc[i][c], w[i][kk], v);
          }
        }
      }
    }
  }

  // O / l for the tile's real rows.
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = ty * kRowsPerThread + i;
    if (r >= n_rows) continue;
    const float inv_l = 1.0f / l[i];
    const int64_t dst = (first_row + q_begin + r) * out_stride +
                        static_cast<int64_t>(head) * p.head_dim;  // elements of p.act
#pragma unroll
    for (int c = 0; c < kColVecs; ++c) {
      const int col = (tx + c * kThreadsPerRow) * 4;
      if (col >= n_dvec * 4) continue;
      const float4 o = acc[i][c] * inv_l;
      if (p.vec) {
        store4_act(p.out, dst + col, o, p.act);
      } else {
        const float v[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (col + e < p.head_dim) store_act(p.out, dst + col + e, v[e], p.act);
      }
    }
  }
}

template <int kMaxHeadDim, typename C>
void launch_typed(const PagedAttentionShape& s, const PrefillParams& p, cudaStream_t stream) {
  const size_t smem = prefill_smem_bytes(s.head_dim);
  if (smem > 48 * 1024) {
    LTM_CUDA_CHECK(cudaFuncSetAttribute(paged_prefill_kernel<kMaxHeadDim, C>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(s.max_new_tokens, kTileQ)), s.n_head, s.n_seqs);
  paged_prefill_kernel<kMaxHeadDim, C><<<grid, kThreads, smem, stream>>>(p);
  LTM_CUDA_CHECK_LAUNCH();
}

template <int kMaxHeadDim>
void launch(const PagedAttentionShape& s, const PrefillParams& p, cudaStream_t stream) {
  switch (s.kv) {
    case ElemType::kF32: return launch_typed<kMaxHeadDim, float>(s, p, stream);
    case ElemType::kBF16: return launch_typed<kMaxHeadDim, __nv_bfloat16>(s, p, stream);
    case ElemType::kF16: return launch_typed<kMaxHeadDim, __half>(s, p, stream);
  }
}

}  // namespace

void launch_paged_prefill(const PagedAttentionShape& s, const void* qkv, const void* k_cache,
                          const void* v_cache, void* out, bool skip_single, cudaStream_t stream) {
  if (prefill_mma_applies(s, qkv, k_cache, v_cache, out))
    return launch_paged_prefill_mma(s, qkv, k_cache, v_cache, out, skip_single, stream);
  LTM_KERNEL_ASSERT(s.head_dim <= 256, "prefill attention supports head_dim <= 256; got %d",
                    s.head_dim);
  LTM_KERNEL_ASSERT(s.n_seqs <= 65535 && s.n_head <= 65535, "n_seqs %d, n_head %d", s.n_seqs,
                    s.n_head);
  PrefillParams p{};
  static_cast<PagedParams&>(p) = paged_params(s, qkv, k_cache, v_cache, out);
  p.vec = s.head_dim % 4 == 0 && aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache) &&
          aligned16(out);
  p.skip_single = skip_single;
  if (s.head_dim <= 128) {
    launch<128>(s, p, stream);
  } else {
    launch<256>(s, p, stream);
  }
}

}  // namespace ltm::kernels::cuda::detail
