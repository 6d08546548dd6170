// The Llama family's element-wise kernels (llama_ops.h). RMSNorm: one block per row (rows beyond
// the grid loop), the sum of squares by block_sum, then one pass that scales; x and y may alias
// (every thread has read its elements for the sum before block_sum returns, and writes only
// those). RoPE and the gated SiLU: one thread per output pair or element.
#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.h"
#include "kernels/cuda/llama_ops.h"

namespace ltm::kernels::cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kThreads = 256;

__global__ void rms_norm_kernel(float* x, const float* __restrict__ residual,
                                const float* __restrict__ bias, const float* __restrict__ w,
                                void* y, ElemType y_type, int64_t rows, int64_t cols, float eps) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* in = x + r * cols;
    float sq = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float v = in[c];
      if (residual) v += residual[r * cols + c];
      if (bias) v += bias[c];
      if (residual || bias) in[c] = v;
      sq += v * v;
    }
    const float rstd = 1.0f / sqrtf(block_sum(sq, scratch) / static_cast<float>(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      store_act(y, r * cols + c, in[c] * rstd * w[c], y_type);
  }
}

__global__ void rope_kernel(void* x, ElemType type, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, int64_t n_tokens,
                            int64_t n_heads, int64_t row_stride, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t n = n_tokens * n_heads * half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = (k / half) % n_heads, t = k / (half * n_heads);
    const float angle = static_cast<float>(positions[t]) * inv_freq[i];  // fp32, as HF
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float s = static_cast<float>(sin(static_cast<double>(angle)));
    const int64_t at = t * row_stride + h * head_dim + i;
    const float a = load_act(x, at, type), b = load_act(x, at + half, type);
    store_act(x, at, a * c - b * s, type);
    store_act(x, at + half, b * c + a * s, type);
  }
}

__global__ void silu_mul_kernel(const void* gate_up, void* out, ElemType type, int64_t rows,
                                int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / cols, j = k % cols;
    const float g = load_act(gate_up, r * 2 * cols + j, type);
    const float u = load_act(gate_up, r * 2 * cols + cols + j, type);
    store_act(out, k, g / (1.0f + expf(-g)) * u, type);
  }
}

int grid_for(int64_t n) {
  return static_cast<int>(std::min<int64_t>(ceil_div(n, kThreads), 65535));
}

}  // namespace

void rms_norm(const float* x, const float* w, void* y, ElemType y_type, int64_t rows,
              int64_t cols, float eps, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int grid = static_cast<int>(std::min<int64_t>(rows, 65535));
  rms_norm_kernel<<<grid, kNormThreads, 0, stream>>>(const_cast<float*>(x), nullptr, nullptr, w,
                                                     y, y_type, rows, cols, eps);
  LTM_CUDA_CHECK_LAUNCH();
}

void add_residual_rms_norm(float* x, const float* residual, const float* bias, const float* w,
                           void* y, ElemType y_type, int64_t rows, int64_t cols, float eps,
                           cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int grid = static_cast<int>(std::min<int64_t>(rows, 65535));
  rms_norm_kernel<<<grid, kNormThreads, 0, stream>>>(x, residual, bias, w, y, y_type, rows, cols,
                                                     eps);
  LTM_CUDA_CHECK_LAUNCH();
}

void rope(void* x, ElemType type, const int32_t* positions, const float* inv_freq,
          int64_t n_tokens, int64_t n_heads, int64_t row_stride, int64_t head_dim,
          cudaStream_t stream) {
  const int64_t n = n_tokens * n_heads * (head_dim / 2);
  if (n <= 0) return;
  LTM_KERNEL_ASSERT(head_dim % 2 == 0 && n_heads * head_dim <= row_stride,
                    "rope: head_dim %lld, %lld heads in rows of %lld",
                    static_cast<long long>(head_dim), static_cast<long long>(n_heads),
                    static_cast<long long>(row_stride));
  rope_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, type, positions, inv_freq, n_tokens,
                                                    n_heads, row_stride, head_dim);
  LTM_CUDA_CHECK_LAUNCH();
}

void silu_mul(const void* gate_up, void* out, ElemType type, int64_t rows, int64_t cols,
              cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  silu_mul_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate_up, out, type, rows, cols);
  LTM_CUDA_CHECK_LAUNCH();
}

}  // namespace ltm::kernels::cuda
