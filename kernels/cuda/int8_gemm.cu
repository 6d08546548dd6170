#include "kernels/cuda/int8_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/int8_lane.h"
#include "kernels/cuda/int8_mma.h"
#include "kernels/cuda/mma_16816.h"

namespace ltm::kernels::cuda {
static_assert(kInt8MmaMaxRows == int8::kMmaMaxRows, "int8_gemm.h and int8_mma.h disagree");
static_assert(kInt8GemvMaxRows == int8::kMaxRows, "int8_gemm.h and int8_lane.h disagree");
namespace {

constexpr int kColsPerBlock = 8;  // warps a block, one column each
constexpr int kThreads = 256;

// The reads in flight a lane keeps for one row of A (int8_lane.h's kStepsInFlight<1>, 4), or 2
// with LTM_CUDA_INT8_READS=2: the kernel before 2026-12-06, to compare in one run.
int one_row_reads() {
  static const int reads = [] {
    const char* e = std::getenv("LTM_CUDA_INT8_READS");
    return e != nullptr && std::strcmp(e, "2") == 0 ? 2 : int8::kStepsInFlight<1>;
  }();
  return reads;
}

// C[i] (column col) = epilogue(v + beta C[i]): the bias, then GELU, in float32; C rounded once.
__device__ __forceinline__ void store_out(void* c, ElemType c_type, int64_t i, int64_t col,
                                          float v, float beta, const float* bias, bool gelu) {
  if (beta != 0.0f) v = fmaf(beta, load_act(c, i, c_type), v);
  if (bias != nullptr) v += bias[col];
  if (gelu) v = gelu_tanh(v);
  store_act(c, i, v, c_type);
}

template <int MT, bool kVec, typename TA, int kReads = int8::kStepsInFlight<MT>>
__global__ void __launch_bounds__(kColsPerBlock * kWarpSize)
    int8_gemv_kernel(const TA* __restrict__ a, const int8_t* __restrict__ q,
                     const uint16_t* __restrict__ scales, void* __restrict__ c, ElemType c_type,
                     int64_t m, int64_t n, int64_t k, float beta, const float* __restrict__ bias,
                     bool gelu) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColsPerBlock + threadIdx.x / kWarpSize;
  if (col >= n) return;  // a whole warp: no barrier below
  const int64_t kp = int8::padded_k(k);
  float acc[MT];
#pragma unroll
  for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
  int8::lane_dot<MT, kVec, TA, kReads>(q + col * kp, scales + col * int8::groups(k), a, k, m, k,
                                       lane, acc);
#pragma unroll
  for (int r = 0; r < MT; ++r) acc[r] = warp_sum(acc[r]);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < MT; ++r) {
    if (r >= m) break;
    store_out(c, c_type, r * n + col, col, acc[r], beta, bias, gelu);
  }
}

template <int MT, int kReads, typename TA>
void launch_reads(const TA* a, Int8Weight w, void* c, ElemType c_type, int64_t m, float beta,
                  const float* bias, bool gelu, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(ceil_div(w.n, kColsPerBlock));
  const bool vec = aligned16(a) && (w.k * static_cast<int64_t>(sizeof(TA))) % 16 == 0;
  if (vec) {
    int8_gemv_kernel<MT, true, TA, kReads><<<blocks, kColsPerBlock * kWarpSize, 0, stream>>>(
        a, w.q, w.scales, c, c_type, m, w.n, w.k, beta, bias, gelu);
  } else {
    int8_gemv_kernel<MT, false, TA, kReads><<<blocks, kColsPerBlock * kWarpSize, 0, stream>>>(
        a, w.q, w.scales, c, c_type, m, w.n, w.k, beta, bias, gelu);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

template <int MT, typename TA>
void launch_rows(const TA* a, Int8Weight w, void* c, ElemType c_type, int64_t m, float beta,
                 const float* bias, bool gelu, cudaStream_t stream) {
  if (MT == 1 && one_row_reads() == 2)
    return launch_reads<MT, 2>(a, w, c, c_type, m, beta, bias, gelu, stream);
  launch_reads<MT, int8::kStepsInFlight<MT>>(a, w, c, c_type, m, beta, bias, gelu, stream);
}

// Accumulators for the next power of two of rows (1, 2, 4, 8, 16).
template <typename TA>
void launch(const TA* a, Int8Weight w, void* c, ElemType c_type, int64_t m, float beta,
            const float* bias, bool gelu, cudaStream_t stream) {
  if (m <= 1) return launch_rows<1>(a, w, c, c_type, m, beta, bias, gelu, stream);
  if (m <= 2) return launch_rows<2>(a, w, c, c_type, m, beta, bias, gelu, stream);
  if (m <= 4) return launch_rows<4>(a, w, c, c_type, m, beta, bias, gelu, stream);
  if (m <= 8) return launch_rows<8>(a, w, c, c_type, m, beta, bias, gelu, stream);
  launch_rows<16>(a, w, c, c_type, m, beta, bias, gelu, stream);
}

// The tensor-core GEMM (int8_mma.h): a warp 16 columns of W and all rows of A over the groups of
// k of its split (blockIdx.y). One split: the epilogue here; more: float32 partial sums
// [split][m][n] for int8_mma_reduce_kernel.
template <int NT>
__global__ void __launch_bounds__(int8::kMmaWarps * kWarpSize, 4)
    int8_mma_kernel(const int8::MmaArgs p, int64_t groups_per_split, void* __restrict__ c,
                    ElemType c_type, float beta, const float* __restrict__ bias, bool gelu,
                    float* __restrict__ partials) {
  const int64_t c0 =
      (static_cast<int64_t>(blockIdx.x) * int8::kMmaWarps + threadIdx.x / kWarpSize) *
      int8::kMmaCols;
  if (c0 >= p.n) return;  // a whole warp: no barrier below
  const int64_t j_begin = blockIdx.y * groups_per_split;
  const int64_t j_end = min(int8::groups(p.k), j_begin + groups_per_split);
  DeviceWarp<int8::MmaLane<NT>> w;
  w.lane = threadIdx.x % kWarpSize;
  int8::mma_columns<NT>(w, p, c0, j_begin, j_end);
  if (gridDim.y == 1) {
    int8::mma_finish<NT>(w, p, c0, [&](int64_t row, int64_t col, float v) {
      store_out(c, c_type, row * p.n + col, col, v, beta, bias, gelu);
    });
  } else {
    float* part = partials + blockIdx.y * p.m * p.n;
    int8::mma_finish<NT>(w, p, c0,
                         [&](int64_t row, int64_t col, float v) { part[row * p.n + col] = v; });
  }
}

// C = epilogue(the splits' partial sums, added in split order, + beta C).
__global__ void int8_mma_reduce_kernel(const float* __restrict__ partials, int64_t splits,
                                       int64_t m, int64_t n, void* __restrict__ c,
                                       ElemType c_type, float beta, const float* __restrict__ bias,
                                       bool gelu) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int64_t s = 0; s < splits; ++s) v += partials[s * total + i];
    store_out(c, c_type, i, i % n, v, beta, bias, gelu);
  }
}

// The current device's compute capability (major) and SM count, asked once a device.
struct DeviceShape {
  int major = 0, sms = 0;
};
DeviceShape device_shape() {
  constexpr int kMaxDevices = 64;
  static DeviceShape known[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return {};
  std::call_once(once[device], [device] {
    DeviceShape d;
    LTM_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
    LTM_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device));
    known[device] = d;
  });
  return known[device];
}

// Blocks of kMmaWarps warps to aim for: 4 an SM (16 warps, ~2 KB of quants in flight each).
int64_t mma_blocks_wanted() { return 4 * static_cast<int64_t>(std::max(device_shape().sms, 1)); }

// out [n, k]: a thread 8 consecutive quants of a column (one 8-byte read, one scale: 8 never
// straddle a group of 32), columns over grid.y. kVec: k % 8 == 0 and out 16-byte aligned, so the
// 8 outputs go as one 16-byte store (fp16/bf16) or two (fp32); otherwise one at a time.
template <bool kVec, typename TO>
__global__ void int8_dequantize_kernel(const int8_t* __restrict__ q,
                                       const uint16_t* __restrict__ scales, TO* __restrict__ out,
                                       int64_t n, int64_t k) {
  const int64_t kp = int8::padded_k(k), groups = int8::groups(k);
  const int64_t p = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 8;
  if (p >= k) return;
  for (int64_t col = blockIdx.y; col < n; col += gridDim.y) {
    const uint2 raw = *reinterpret_cast<const uint2*>(q + col * kp + p);  // 8-byte aligned
    float w[8];
    int8::unpack4(raw.x, w);
    int8::unpack4(raw.y, w + 4);
    const float s = int8::scale_float(scales[col * groups + p / int8::kGroup]);
    TO* o = out + col * k + p;
    if constexpr (kVec) {
      alignas(16) TO v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = from_float<TO>(w[i] * s);
#pragma unroll
      for (int i = 0; i < 8 * static_cast<int>(sizeof(TO)) / 16; ++i)
        reinterpret_cast<uint4*>(o)[i] = reinterpret_cast<const uint4*>(v)[i];
    } else {
      for (int64_t i = 0; i < 8 && p + i < k; ++i) o[i] = from_float<TO>(w[i] * s);
    }
  }
}

template <typename TO>
void dequantize_as(Int8Weight w, TO* out, cudaStream_t stream) {
  const int64_t threads_per_col = ceil_div(w.k, 8);
  const dim3 grid(static_cast<unsigned>(ceil_div(threads_per_col, kThreads)), grid_rows(w.n));
  if (w.k % 8 == 0 && aligned16(out)) {
    int8_dequantize_kernel<true><<<grid, kThreads, 0, stream>>>(w.q, w.scales, out, w.n, w.k);
  } else {
    int8_dequantize_kernel<false><<<grid, kThreads, 0, stream>>>(w.q, w.scales, out, w.n, w.k);
  }
  LTM_CUDA_CHECK_LAUNCH();
}

__global__ void int8_embedding_kernel(const int32_t* __restrict__ ids, const int8_t* __restrict__ q,
                                      const uint16_t* __restrict__ scales, int64_t row_begin,
                                      int64_t row_end, float* __restrict__ out, int64_t n_tokens,
                                      int64_t d) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= d) return;
  const int64_t kp = int8::padded_k(d), groups = int8::groups(d);
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const int64_t id = ids[t];
    float v = 0.0f;
    if (id >= row_begin && id < row_end) {
      const int64_t row = id - row_begin;
      v = static_cast<float>(q[row * kp + c]) *
          int8::scale_float(scales[row * groups + c / int8::kGroup]);
    }
    out[t * d + c] = v;
  }
}

}  // namespace

void int8_gemv(const void* a, ElemType a_type, Int8Weight w, void* c, ElemType c_type, int64_t m,
               float beta, const float* bias, bool gelu, cudaStream_t stream) {
  if (m <= 0 || w.n <= 0) return;
  LTM_KERNEL_ASSERT(m <= kInt8GemvMaxRows, "int8_gemv of %lld rows (at most %lld)",
                    static_cast<long long>(m), static_cast<long long>(kInt8GemvMaxRows));
  switch (a_type) {
    case ElemType::kF16:
      return launch(static_cast<const __half*>(a), w, c, c_type, m, beta, bias, gelu, stream);
    case ElemType::kBF16:
      return launch(static_cast<const __nv_bfloat16*>(a), w, c, c_type, m, beta, bias, gelu,
                    stream);
    default:
      return launch(static_cast<const float*>(a), w, c, c_type, m, beta, bias, gelu, stream);
  }
}

bool int8_mma_available() {
  static const bool enabled = [] {
    const char* e = std::getenv("LTM_CUDA_INT8_MMA");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return enabled && device_shape().major >= 8;
}

size_t int8_mma_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t splits) {
  const int8::MmaSplit sp = int8::mma_split(n, k, mma_blocks_wanted(), splits);
  return sp.splits > 1 ? static_cast<size_t>(sp.splits * m * n) * sizeof(float) : 0;
}

void int8_gemm_mma(const void* a, Int8Weight w, void* c, ElemType c_type, int64_t m, float beta,
                   const float* bias, bool gelu, void* workspace, cudaStream_t stream,
                   int64_t splits) {
  if (m <= 0 || w.n <= 0) return;
  LTM_KERNEL_ASSERT(m <= kInt8MmaMaxRows, "int8_gemm_mma of %lld rows (at most %lld)",
                    static_cast<long long>(m), static_cast<long long>(kInt8MmaMaxRows));
  int8::MmaArgs p;
  p.q = w.q;
  p.scales = w.scales;
  p.n = w.n;
  p.k = w.k;
  p.a = static_cast<const uint16_t*>(a);
  p.m = m;
  p.a_vec = reinterpret_cast<uintptr_t>(a) % 8 == 0 && w.k % 4 == 0;
  const int8::MmaSplit sp = int8::mma_split(w.n, w.k, mma_blocks_wanted(), splits);
  LTM_KERNEL_ASSERT(sp.splits == 1 || workspace != nullptr,
                    "int8_gemm_mma: %lld splits, no workspace", static_cast<long long>(sp.splits));
  const dim3 grid(static_cast<unsigned>(ceil_div(ceil_div(w.n, int8::kMmaCols), int8::kMmaWarps)),
                  static_cast<unsigned>(sp.splits));
  auto* part = static_cast<float*>(workspace);
  if (m <= 32) {
    int8_mma_kernel<4><<<grid, int8::kMmaWarps * kWarpSize, 0, stream>>>(
        p, sp.groups_per_split, c, c_type, beta, bias, gelu, part);
  } else {
    int8_mma_kernel<8><<<grid, int8::kMmaWarps * kWarpSize, 0, stream>>>(
        p, sp.groups_per_split, c, c_type, beta, bias, gelu, part);
  }
  LTM_CUDA_CHECK_LAUNCH();
  if (sp.splits == 1) return;
  int8_mma_reduce_kernel<<<grid_for(m * w.n, kThreads), kThreads, 0, stream>>>(
      part, sp.splits, m, w.n, c, c_type, beta, bias, gelu);
  LTM_CUDA_CHECK_LAUNCH();
}

void int8_dequantize(Int8Weight w, void* out, ElemType type, cudaStream_t stream) {
  if (w.n <= 0 || w.k <= 0) return;
  switch (type) {
    case ElemType::kF16: return dequantize_as(w, static_cast<__half*>(out), stream);
    case ElemType::kBF16: return dequantize_as(w, static_cast<__nv_bfloat16*>(out), stream);
    default: return dequantize_as(w, static_cast<float*>(out), stream);
  }
}

void int8_embedding(const int32_t* ids, Int8Weight table, int64_t row_begin, int64_t row_end,
                    float* out, int64_t n_tokens, cudaStream_t stream) {
  if (n_tokens <= 0 || table.k <= 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(table.k, kThreads)), grid_rows(n_tokens));
  int8_embedding_kernel<<<grid, kThreads, 0, stream>>>(ids, table.q, table.scales, row_begin,
                                                       row_end, out, n_tokens, table.k);
  LTM_CUDA_CHECK_LAUNCH();
}

}  // namespace ltm::kernels::cuda
