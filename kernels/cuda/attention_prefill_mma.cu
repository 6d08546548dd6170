// Paged attention for prefill on the tensor cores: flash-attention style with mma.sync, for
// 16-bit activations and a K/V cache of the same type (bf16 or fp16), head_dim a multiple of 16
// up to 128, compute capability 8.0 and up. attention_mma.h has the warp's arithmetic (and the
// fragment layouts); this file the block around it.
//
// Grid (query tile, head, sequence). A block of 4 warps owns 64 query rows of one (sequence,
// head) and loads them once into shared memory; then, per tile of 64 visible keys: the keys'
// offsets through the block table, K copied as 16-byte chunks and V stored transposed (the B
// operand of P V is V^T, n-major), and each warp whose rows see a key of the tile runs
// attend_tile on it. The tile of the block's last query row bounds the keys read (causality), as
// in the float32 kernel (attention_prefill.cu), which remains for float32 caches and
// activations, mixed 16-bit types, other head sizes, older GPUs and LTM_CUDA_PREFILL_MMA=0 (to
// compare the two in one run).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"

namespace ltm::kernels::cuda::detail {
namespace {

namespace am = ltm::kernels::cuda::mma;

// A lane of a warp on the device (mma_16816.h's DeviceWarp) with the quad reductions of
// attention_mma.h's softmax.
template <int kD>
struct DeviceWarp : ltm::kernels::cuda::DeviceWarp<am::Lane<kD>> {
  using ltm::kernels::cuda::DeviceWarp<am::Lane<kD>>::st;
  // The 4 lanes of a row (a quad: lanes 4 g .. 4 g + 3) end with the same value.
  __device__ __forceinline__ void quad_max() {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      st.red[i] = fmaxf(st.red[i], __shfl_xor_sync(kFullMask, st.red[i], 1));
      st.red[i] = fmaxf(st.red[i], __shfl_xor_sync(kFullMask, st.red[i], 2));
    }
  }
  __device__ __forceinline__ void quad_sum() {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      st.red[i] += __shfl_xor_sync(kFullMask, st.red[i], 1);
      st.red[i] += __shfl_xor_sync(kFullMask, st.red[i], 2);
    }
  }
};

__device__ __forceinline__ uint4 load16(const uint16_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// Blocks an SM should hold at once: 3 on Hopper (3 x 53 KB of shared memory for 128 dims, 168
// registers a thread, no spills); 2 below it, where 3 do not fit the shared memory of an A100
// and the register bound spilled (ptxas for sm_80: 60-68 bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kMinBlocks = 2;
#else
constexpr int kMinBlocks = 3;
#endif

template <int kD, bool kBf16>
__global__ void __launch_bounds__(am::kThreads, kMinBlocks)
    paged_prefill_mma_kernel(const PagedParams p, bool skip_single) {
  constexpr int kStride = am::row_stride(kD);
  const int q_tile = blockIdx.x;
  const int head = blockIdx.y;
  const int seq = blockIdx.z;
  const int first_row = p.token_offsets[seq];
  const int n_new = p.token_offsets[seq + 1] - first_row;
  const int q_begin = q_tile * am::kTileQ;
  if (q_begin >= n_new || (skip_single && n_new == 1)) return;
  const int n_rows = min(am::kTileQ, n_new - q_begin);
  const int pos0 = p.context_lens[seq] - n_new + q_begin;  // position of the tile's row 0
  const int n_keys = pos0 + n_rows;                         // keys visible to its last row

  extern __shared__ uint4 smem_raw[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem_raw);  // [kTileQ][kStride]
  uint16_t* k_s = q_s + am::kTileQ * kStride;             // [kTileK][kStride]
  uint16_t* vt_s = k_s + am::kTileK * kStride;            // [kD][kVtStride]
  int64_t* key_base = reinterpret_cast<int64_t*>(vt_s + kD * am::kVtStride);  // [kTileK]
  const int tid = threadIdx.x;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // The Q tile: rows past the sequence's new rows and columns past the head are zeros.
  const uint16_t* qkv = static_cast<const uint16_t*>(p.qkv);
  const int64_t q_src =
      (first_row + q_begin) * p.qkv_stride + static_cast<int64_t>(head) * p.head_dim;
  for (int i = tid; i < am::kTileQ * (kD / am::kChunk); i += am::kThreads) {
    int r, c;
    am::chunk_place<kD>(i, &r, &c);
    const uint4 v =
        r < n_rows && c < p.head_dim ? load16(qkv + q_src + r * p.qkv_stride + c) : zero;
    *reinterpret_cast<uint4*>(q_s + r * kStride + c) = v;
  }
  __syncthreads();

  const int warp = tid / kWarpSize;
  DeviceWarp<kD> w;
  w.lane = tid % kWarpSize;
  am::start_warp<kD>(w, warp, pos0);
  const bool active = 16 * warp < n_rows;  // warp-uniform, as is every condition below
  const int warp_last_pos = pos0 + min(16 * warp + 15, n_rows - 1);
  const float scale_log2 = p.scale * 1.4426950408889634f;  // log2(e) / sqrt(head_dim)

  const uint16_t* k_cache = static_cast<const uint16_t*>(p.k_cache);
  const uint16_t* v_cache = static_cast<const uint16_t*>(p.v_cache);
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int kv_head = head / p.kv_group;
  for (int k0 = 0; k0 < n_keys; k0 += am::kTileK) {
    __syncthreads();  // every warp is done with the previous tile
    if (tid < am::kTileK) {
      const int key = k0 + tid;
      const int64_t block = key < n_keys ? table[key / p.block_size] : -1;  // not past the table
      key_base[tid] =
          block >= 0
              ? ((block * p.n_kv_head + kv_head) * p.block_size + key % p.block_size) * p.head_dim
              : -1;
    }
    __syncthreads();
    for (int i = tid; i < am::kTileK * (kD / am::kChunk); i += am::kThreads) {
      int j, c;
      am::chunk_place<kD>(i, &j, &c);
      const int64_t base = key_base[j];  // zeros past the visible keys and the head
      const uint4 k = base >= 0 && c < p.head_dim ? load16(k_cache + base + c) : zero;
      *reinterpret_cast<uint4*>(k_s + j * kStride + c) = k;
      am::chunk_place_v(i, &j, &c);
      const int64_t vbase = key_base[j];
      const uint4 v = vbase >= 0 && c < p.head_dim ? load16(v_cache + vbase + c) : zero;
      am::store_transposed(vt_s, j, c, reinterpret_cast<const uint16_t*>(&v));
    }
    __syncthreads();
    if (active && k0 <= warp_last_pos)
      am::attend_tile<kD, kBf16>(w, q_s + 16 * warp * kStride, k_s, vt_s, k0, n_keys,
                                 scale_log2);
  }
  if (!active) return;

  uint16_t* out = static_cast<uint16_t*>(p.out);
  const int64_t out_stride = static_cast<int64_t>(p.n_head) * p.head_dim;
  const int64_t dst = (first_row + q_begin + 16 * warp) * out_stride +
                      static_cast<int64_t>(head) * p.head_dim;
  am::finish_warp<kD, kBf16>(w, p.head_dim, [&](int r, int col, uint32_t bits) {
    if (16 * warp + r < n_rows)
      *reinterpret_cast<uint32_t*>(out + dst + r * out_stride + col) = bits;
  });
}

template <int kD, bool kBf16>
void launch_typed(const PagedAttentionShape& s, const PagedParams& p, bool skip_single,
                  cudaStream_t stream) {
  constexpr int smem = am::smem_bytes(kD);
  if (smem > 48 * 1024) {
    LTM_CUDA_CHECK(cudaFuncSetAttribute(paged_prefill_mma_kernel<kD, kBf16>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(s.max_new_tokens, am::kTileQ)), s.n_head,
                  s.n_seqs);
  paged_prefill_mma_kernel<kD, kBf16><<<grid, am::kThreads, smem, stream>>>(p, skip_single);
  LTM_CUDA_CHECK_LAUNCH();
}

template <int kD>
void launch(const PagedAttentionShape& s, const PagedParams& p, bool skip_single,
            cudaStream_t stream) {
  if (s.kv == ElemType::kBF16) {
    launch_typed<kD, true>(s, p, skip_single, stream);
  } else {
    launch_typed<kD, false>(s, p, skip_single, stream);
  }
}

// Compute capability 8.0 or later on the current device (mma.sync with bf16), asked once a
// device.
bool device_has_mma() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  int v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    LTM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    v = major >= 8 ? 2 : 1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

}  // namespace

bool prefill_mma_applies(const PagedAttentionShape& s, const void* qkv, const void* k_cache,
                         const void* v_cache, const void* out) {
  static const bool enabled = [] {
    const char* e = std::getenv("LTM_CUDA_PREFILL_MMA");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return enabled && s.kv == s.act && (s.kv == ElemType::kBF16 || s.kv == ElemType::kF16) &&
         s.head_dim % 16 == 0 && s.head_dim <= 128 && aligned16(qkv) && aligned16(k_cache) &&
         aligned16(v_cache) && aligned16(out) && device_has_mma();
}

void launch_paged_prefill_mma(const PagedAttentionShape& s, const void* qkv, const void* k_cache,
                              const void* v_cache, void* out, bool skip_single,
                              cudaStream_t stream) {
  LTM_KERNEL_ASSERT(s.n_seqs <= 65535 && s.n_head <= 65535, "n_seqs %d, n_head %d", s.n_seqs,
                    s.n_head);
  const PagedParams p = paged_params(s, qkv, k_cache, v_cache, out);
  if (s.head_dim <= 64) {
    launch<64>(s, p, skip_single, stream);
  } else {
    launch<128>(s, p, skip_single, stream);
  }
}

}  // namespace ltm::kernels::cuda::detail
