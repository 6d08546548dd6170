#include "kernels/cpu/llama_ops.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/static_for.h"

namespace ltm::kernels::cpu {

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t cols, float eps) {
  const auto row = kernel_table().rms_norm_row;  // outside the parallel region: may throw
  static_for(rows, rows > 8, [&](int64_t r) { row(x + r * cols, w, y + r * cols, cols, eps); });
}

void add_residual_rms_norm(float* x, const float* residual, const float* bias, const float* w,
                           float* y, int64_t rows, int64_t cols, float eps) {
  const KernelTable& kt = kernel_table();
  static_for(rows, rows > 8, [&](int64_t r) {
    float* xr = x + r * cols;
    if (residual) kt.add(xr, residual + r * cols, cols);
    if (bias) kt.add(xr, bias, cols);
    kt.rms_norm_row(xr, w, y + r * cols, cols, eps);
  });
}

void rope(float* x, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
          int64_t n_heads, int64_t row_stride, int64_t head_dim) {
  const auto row = kernel_table().rope_row;
  const int64_t half = head_dim / 2;
  const auto token = [&](int64_t t, float* cos_sin) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos * inv_freq[i]);  // fp32 product, as HF
      cos_sin[i] = static_cast<float>(std::cos(angle));
      cos_sin[half + i] = static_cast<float>(std::sin(angle));
    }
    row(x + t * row_stride, cos_sin, n_heads, head_dim);
  };
  if (n_tokens <= 4) {  // here, without a region (static_for.h says why)
    std::vector<float> cos_sin(static_cast<size_t>(head_dim));
    for (int64_t t = 0; t < n_tokens; ++t) token(t, cos_sin.data());
    return;
  }
  if (in_step_team()) {  // a small step's team (step_team.h): its threads, no region
    auto job = [&](int t, int nt) {
      std::vector<float> cos_sin(static_cast<size_t>(head_dim));
      for (int64_t i = n_tokens * t / nt; i < n_tokens * (t + 1) / nt; ++i)
        token(i, cos_sin.data());
    };
    step_team_run(job);
    return;
  }
#pragma omp parallel
  {
    std::vector<float> cos_sin(static_cast<size_t>(head_dim));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tokens; ++t) token(t, cos_sin.data());
  }
}

void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t cols) {
  const auto row = kernel_table().silu_mul_row;
  static_for(rows, rows * cols > 8192, [&](int64_t r) {
    const float* g = gate_up + r * 2 * cols;
    row(g, g + cols, out + r * cols, cols);
  });
}

}  // namespace ltm::kernels::cpu
