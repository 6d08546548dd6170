// The fixture and helpers the CUDA backend tests share (cuda_backend_gpu_test.cpp: memory, GEMMs
// and the embedding tables; cuda_backend_ops_gpu_test.cpp: element-wise ops, layer norms and
// attention): the same data on both backends (Twin), the CUDA and the CPU backend
// (CudaBackendTest), max |cuda - cpu| and its report line, and the 16-bit activations' helpers.
//
// 16-bit activations (activation_precision(): bf16/fp16 with 16-bit weights): the GPU op reads
// 16-bit inputs, computes in float32 and rounds its 16-bit output once; the CPU reference runs the
// float32 op on the same values widened. An output rounded once is within half an ulp of the
// float32 result: |gpu - cpu| <= 2^-8 |cpu| (bf16, 8 significant bits) or 2^-11 |cpu| (fp16, 11
// bits), plus 1e-4 for the float32 arithmetic's own differences (tolerance_act below).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/dtype.h"
#include "tests/kernels/random_floats.h"

namespace ltm::cuda_test {

inline constexpr float kTol = 1e-4f;

using test::random_floats;

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= worst)) worst = d;  // NaN propagates as the worst
  }
  return worst;
}

inline float max_abs(const std::vector<float>& a) {
  float m = 0.0f;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

inline void report(const std::string& what, float diff) {
  std::printf("[ %-58s ] max |cuda - cpu| = %.3g\n", what.c_str(), diff);
}

// The same data on both backends.
struct Twin {
  DeviceBuffer cpu;
  DeviceBuffer gpu;
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Without a device main() (gpu_test_main.cpp) reports the binary skipped before any test.
    std::string error;
    gpu_ = make_cuda_backend(0, &error);
    ASSERT_NE(gpu_, nullptr) << error;
    cpu_ = make_cpu_backend(1);
  }

  template <typename T>
  Twin twin(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    return Twin{cpu_->upload(host.data(), bytes, false), gpu_->upload(host.data(), bytes, false)};
  }
  Twin twin_alloc(size_t n_floats) {
    return Twin{cpu_->alloc(n_floats * sizeof(float)), gpu_->alloc(n_floats * sizeof(float))};
  }
  // Reads n floats from each side; `offset` floats into the buffers.
  std::pair<std::vector<float>, std::vector<float>> fetch(const Twin& t, size_t n,
                                                          size_t offset = 0) {
    std::vector<float> c(n), g(n);
    cpu_->copy_to_host(c.data(), t.cpu.f32() + offset, n * sizeof(float));
    gpu_->copy_to_host(g.data(), t.gpu.f32() + offset, n * sizeof(float));
    cpu_->synchronize();
    gpu_->synchronize();
    return {std::move(c), std::move(g)};
  }
  float diff(const Twin& t, size_t n, size_t offset = 0) {
    auto [c, g] = fetch(t, n, offset);
    return max_abs_diff(c, g);
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
};

// --- 16-bit activations ---

// n floats rounded to p (nearest even) and back: the values a 16-bit buffer holds.
inline std::vector<float> rounded(const std::vector<float>& v, Precision p) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = p == Precision::kBF16 ? bf16_to_f32(f32_to_bf16(v[i])) : f16_to_f32(f32_to_f16(v[i]));
  return out;
}
inline std::vector<uint16_t> as_16(const std::vector<float>& v, Precision p) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = p == Precision::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return out;
}
// n 16-bit elements of a GPU buffer, widened.
inline std::vector<float> fetch_16(Backend& gpu, const void* src, size_t n, Precision p) {
  std::vector<uint16_t> h(n);
  gpu.copy_to_host(h.data(), src, n * 2);
  gpu.synchronize();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = p == Precision::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  return out;
}
// Half an ulp of a value rounded once to p, relative, plus the float32 arithmetic's slack.
inline float tolerance_act(Precision p, float ref) {
  return (p == Precision::kBF16 ? 1.0f / 256 : 1.0f / 2048) * std::fabs(ref) + 1e-4f;
}
// The worst |got - ref| / tolerance_act(ref) (<= 1 passes).
inline float worst_act_ratio(const std::vector<float>& ref, const std::vector<float>& got,
                             Precision p) {
  EXPECT_EQ(ref.size(), got.size());
  float worst = 0.0f;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const float r = std::fabs(got[i] - ref[i]) / tolerance_act(p, ref[i]);
    if (!(r <= worst)) worst = r;
  }
  return worst;
}

}  // namespace ltm::cuda_test
