// The Llama family's CUDA ops (kernels/cuda/llama_ops.h through the CUDA backend) against the
// CPU backend's (kernels/cpu/llama_ops.h) on the same inputs: RMSNorm (in place too), its fusion
// with the residual block's end, rotate-half RoPE (head dims 64, 80, 128; positions up to 32k;
// a row stride wider than the rotated heads, as Q inside a qkv row) and the gated SiLU; fp32
// within 1e-4 (RoPE: 1e-4 of |x|; its cos and sin come from the same double functions, the
// products differ by fused multiply-adds) and 16-bit activations within half an ulp of the fp32
// result (tolerance_act, as cuda_backend_fixture.h). Grouped-query attention is in
// cuda_backend_ops_gpu_test's attention cases. Skipped (exit 77) without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/dtype.h"
#include "tests/kernels/cuda_backend_fixture.h"
#include "tests/kernels/random_floats.h"

namespace ltm {
namespace {

using cuda_test::rounded;
using test::random_floats;

// The CUDA and CPU backends of cuda_backend_fixture.h, the CUDA one with the Llama ops.
class LlamaOpsGpuTest : public cuda_test::CudaBackendTest {
 protected:
  void SetUp() override {
    cuda_test::CudaBackendTest::SetUp();
    if (gpu_ == nullptr) return;  // the fixture's SetUp has failed the test
    ASSERT_TRUE(gpu_->supports_llama());
  }
  DeviceBuffer up(Backend& b, const std::vector<float>& v) {
    return b.upload(v.data(), v.size() * sizeof(float), false);
  }
  std::vector<float> down(Backend& b, const DeviceBuffer& buf, size_t n) {
    std::vector<float> out(n);
    b.copy_to_host(out.data(), buf.data(), n * sizeof(float));
    b.synchronize();
    return out;
  }
  // 16-bit elements of type p at `buf`, widened.
  std::vector<float> down16(const DeviceBuffer& buf, size_t n, Precision p) {
    return cuda_test::fetch_16(*gpu_, buf.data(), n, p);
  }
  DeviceBuffer up16(const std::vector<float>& v, Precision p) {
    const std::vector<uint16_t> h = cuda_test::as_16(v, p);
    return gpu_->upload(h.data(), h.size() * 2, false);
  }
  // The largest |got - want| relative to `scale` (absolute when scale is 0).
  static float worst(const std::vector<float>& want, const std::vector<float>& got, float rel,
                     float abs_tol) {
    EXPECT_EQ(want.size(), got.size());
    float w = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
      const float tol = rel * std::fabs(want[i]) + abs_tol;
      const float r = std::fabs(got[i] - want[i]) / tol;
      if (!(r <= w)) w = r;  // NaN is the worst
    }
    return w;
  }
  static float ulp_half(Precision p) { return p == Precision::kBF16 ? 0x1p-8f : 0x1p-11f; }
};

TEST_F(LlamaOpsGpuTest, RmsNormMatchesCpu) {
  struct Shape {
    int64_t rows, cols;
  };
  uint32_t seed = 1;
  for (const Shape s : {Shape{1, 1}, Shape{3, 5}, Shape{17, 4096}, Shape{4, 1023}, Shape{300, 64}}) {
    for (bool in_place : {false, true}) {
      const size_t n = static_cast<size_t>(s.rows * s.cols);
      const std::vector<float> x = random_floats(n, ++seed, -3.0f, 3.0f);
      const std::vector<float> w = random_floats(s.cols, ++seed, 0.5f, 1.5f);
      DeviceBuffer cx = up(*cpu_, x), gx = up(*gpu_, x), cw = up(*cpu_, w), gw = up(*gpu_, w);
      DeviceBuffer cy = in_place ? DeviceBuffer{} : cpu_->alloc(n * 4);
      DeviceBuffer gy = in_place ? DeviceBuffer{} : gpu_->alloc(n * 4);
      float* co = in_place ? cx.f32() : cy.f32();
      float* go = in_place ? gx.f32() : gy.f32();
      cpu_->rms_norm(cx.f32(), cw.f32(), co, s.rows, s.cols, 1e-6f);
      gpu_->rms_norm(gx.f32(), gw.f32(), go, s.rows, s.cols, 1e-6f);
      const float r = worst(down(*cpu_, in_place ? cx : cy, n), down(*gpu_, in_place ? gx : gy, n),
                            1e-5f, 1e-5f);
      std::printf("rms_norm %lldx%lld%s: worst / tolerance %.3g\n", static_cast<long long>(s.rows),
                  static_cast<long long>(s.cols), in_place ? " in place" : "", r);
      EXPECT_LE(r, 1.0f);
    }
  }
}

TEST_F(LlamaOpsGpuTest, AddResidualRmsNormMatchesCpu) {
  const int64_t rows = 37, cols = 4096;
  const size_t n = rows * cols;
  for (int variant = 0; variant < 3; ++variant) {
    const bool with_residual = variant != 1, with_bias = variant != 0;
    const std::vector<float> x = random_floats(n, 10 + variant, -3.0f, 3.0f);
    const std::vector<float> res = random_floats(n, 20 + variant);
    const std::vector<float> bias = random_floats(cols, 30 + variant);
    const std::vector<float> w = random_floats(cols, 40 + variant, 0.5f, 1.5f);
    DeviceBuffer cx = up(*cpu_, x), gx = up(*gpu_, x), cr = up(*cpu_, res), gr = up(*gpu_, res),
                 cb = up(*cpu_, bias), gb = up(*gpu_, bias), cw = up(*cpu_, w), gw = up(*gpu_, w),
                 cy = cpu_->alloc(n * 4), gy = gpu_->alloc(n * 4);
    cpu_->add_residual_rms_norm(cx.f32(), with_residual ? cr.f32() : nullptr,
                                with_bias ? cb.f32() : nullptr, cw.f32(), cy.f32(), rows, cols,
                                1e-5f);
    gpu_->add_residual_rms_norm(gx.f32(), with_residual ? gr.f32() : nullptr,
                                with_bias ? gb.f32() : nullptr, gw.f32(), gy.f32(), rows, cols,
                                1e-5f);
    EXPECT_EQ(down(*cpu_, cx, n), down(*gpu_, gx, n)) << "x: the same float adds in the same order";
    const float r = worst(down(*cpu_, cy, n), down(*gpu_, gy, n), 1e-5f, 1e-5f);
    std::printf("add_residual_rms_norm variant %d: worst / tolerance %.3g\n", variant, r);
    EXPECT_LE(r, 1.0f);
  }
}

TEST_F(LlamaOpsGpuTest, RopeMatchesCpu) {
  struct Shape {
    int64_t n_tokens, n_heads, head_dim, row_stride;
  };
  uint32_t seed = 100;
  for (const Shape s : {Shape{5, 4, 64, 4 * 64}, Shape{9, 3, 80, 5 * 80}, Shape{33, 8, 128, 12 * 128},
                        Shape{1, 1, 2, 2}}) {
    const size_t n = static_cast<size_t>(s.n_tokens * s.row_stride);
    const std::vector<float> x = random_floats(n, ++seed, -2.0f, 2.0f);
    std::vector<int32_t> pos(s.n_tokens);
    for (int64_t t = 0; t < s.n_tokens; ++t) pos[t] = static_cast<int32_t>((t * 997) % 32768);
    std::vector<float> inv(s.head_dim / 2);
    for (size_t i = 0; i < inv.size(); ++i)
      inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / s.head_dim));
    DeviceBuffer cx = up(*cpu_, x), gx = up(*gpu_, x), ci = up(*cpu_, inv), gi = up(*gpu_, inv);
    DeviceBuffer cp = cpu_->upload(pos.data(), pos.size() * 4, false);
    DeviceBuffer gp = gpu_->upload(pos.data(), pos.size() * 4, false);
    cpu_->rope(cx.f32(), cp.i32(), ci.f32(), s.n_tokens, s.n_heads, s.row_stride, s.head_dim);
    gpu_->rope(gx.f32(), gp.i32(), gi.f32(), s.n_tokens, s.n_heads, s.row_stride, s.head_dim);
    const std::vector<float> want = down(*cpu_, cx, n), got = down(*gpu_, gx, n);
    const float r = worst(want, got, 1e-4f, 1e-5f);
    std::printf("rope %lld tokens x %lld heads of %lld: worst / tolerance %.3g\n",
                static_cast<long long>(s.n_tokens), static_cast<long long>(s.n_heads),
                static_cast<long long>(s.head_dim), r);
    EXPECT_LE(r, 1.0f);
    // Columns past the rotated heads are untouched.
    for (int64_t t = 0; t < s.n_tokens; ++t)
      for (int64_t c = s.n_heads * s.head_dim; c < s.row_stride; ++c)
        ASSERT_EQ(got[t * s.row_stride + c], x[t * s.row_stride + c]);
    // 16-bit activations: the GPU rotates the rounded values and rounds once.
    for (Precision p : {Precision::kBF16, Precision::kF16}) {
      const std::vector<float> xr = rounded(x, p);
      DeviceBuffer cx2 = up(*cpu_, xr), g16 = up16(xr, p);
      cpu_->rope(cx2.f32(), cp.i32(), ci.f32(), s.n_tokens, s.n_heads, s.row_stride, s.head_dim);
      gpu_->rope_act(Act(g16.data(), p), gp.i32(), gi.f32(), s.n_tokens, s.n_heads, s.row_stride,
                     s.head_dim);
      const float r16 = worst(down(*cpu_, cx2, n), down16(g16, n, p), ulp_half(p) * 1.01f, 1e-4f);
      std::printf("  %s: worst / tolerance %.3g\n", precision_name(p), r16);
      EXPECT_LE(r16, 1.0f);
    }
  }
}

TEST_F(LlamaOpsGpuTest, SiluMulMatchesCpu) {
  const int64_t rows = 19, cols = 11008 / 4;
  const size_t n = rows * cols;
  std::vector<float> gu = random_floats(2 * n, 200, -8.0f, 8.0f);
  gu[0] = -90.0f;  // e^90 overflows: silu -> -0
  gu[1] = 90.0f;
  DeviceBuffer c_in = up(*cpu_, gu), g_in = up(*gpu_, gu), co = cpu_->alloc(n * 4),
               go = gpu_->alloc(n * 4);
  cpu_->silu_mul(c_in.f32(), co.f32(), rows, cols);
  gpu_->silu_mul(g_in.f32(), go.f32(), rows, cols);
  const std::vector<float> want = down(*cpu_, co, n);
  const float r = worst(want, down(*gpu_, go, n), 1e-5f, 1e-5f);
  std::printf("silu_mul %lldx%lld: worst / tolerance %.3g\n", static_cast<long long>(rows),
              static_cast<long long>(cols), r);
  EXPECT_LE(r, 1.0f);
  for (Precision p : {Precision::kBF16, Precision::kF16}) {
    const std::vector<float> gr = rounded(gu, p);
    DeviceBuffer c2 = up(*cpu_, gr), g16 = up16(gr, p), o16 = gpu_->alloc(n * 2);
    cpu_->silu_mul(c2.f32(), co.f32(), rows, cols);
    gpu_->silu_mul_act(Act(g16.data(), p), Act(o16.data(), p), rows, cols);
    const float r16 = worst(down(*cpu_, co, n), down16(o16, n, p), ulp_half(p) * 1.01f, 1e-4f);
    std::printf("  %s: worst / tolerance %.3g\n", precision_name(p), r16);
    EXPECT_LE(r16, 1.0f);
  }
}

}  // namespace
}  // namespace ltm
