// The CUDA backend's int8 weights (kernels/cuda/int8_gemm.h) against a float64 reference on the
// same dequantized weights (the quants and scales of kernels/cpu/int8_quant.h, the CPU backend's
// rule; cuda_int8_lane_test checks on the CPU that the two backends hold the same values).
// Skipped without a CUDA device (gpu_test_main.cpp). Each case prints its worst error relative to
// the largest output. Three paths, by rows of A (path_for):
//  - up to kInt8GemvMaxRows: the weight-streaming kernel multiplies the dequantized weights with
//    A as it is (float32 or fp16) in float32: 1e-5 relative.
//  - up to kInt8MmaMaxRows (compute capability 8.0 and up, LTM_CUDA_INT8_MMA not 0): the
//    tensor-core kernel, quants exact, A rounded to fp16, scales applied in float32: 1e-4 of
//    the float64 product of round_f16(A) and the dequantized W. Its k splits (1, 6 and 16 on a
//    132-SM GPU for the shapes below) and their reduction are covered by the shapes.
//  - more rows (or the switch off): W dequantized to fp16 (each q * s rounded once, 2^-11
//    relative) and A rounded to fp16, a cuBLASLt GEMM: the fp16 tolerance of
//    cuda_backend_gpu_test, 2e-3.
//  - matmul_act with fp16 activations (the int8 default, activation_precision()) and the bias and
//    bias + GELU epilogues, C fp16 or fp32: the same, plus C's rounding once.
//  - beta = 1 adds to C; odd n and k (unaligned rows: the kernels' element loads) as well as
//    aligned ones (their vector loads); a row has the same bits in a step of 1 to 16 rows, and in
//    one of 17 to 64 (each row's sum does not depend on the others).
//  - embed: the dequantized rows exactly, zeros for ids outside the rank's rows.
//  - graph replay of int8 GEMMs (the streaming kernel, the tensor-core kernel with its split-k
//    partial sums and the dequantizing path, whose scratch a graph must own) equals the eager
//    run bit for bit.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/int8_quant.h"
#include "runtime/backend/backend.h"
#include "runtime/model/dtype.h"
#include "tests/kernels/random_floats.h"

namespace ltm {
namespace {

constexpr int64_t kStreamRows = 16;  // kernels/cuda/int8_gemm.h's kInt8GemvMaxRows
constexpr int64_t kMmaRows = 64;     // its kInt8MmaMaxRows

enum class Path { kStream, kMma, kDequant };

// The backend's kernel for m rows: int8_gemm.h's rule.
Path path_for(int64_t m) {
  static const bool mma = [] {
    const char* e = std::getenv("LTM_CUDA_INT8_MMA");
    int major = 0, device = 0;
    return (e == nullptr || std::strcmp(e, "0") != 0) && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major >= 8;
  }();
  if (m <= kStreamRows) return Path::kStream;
  return m <= kMmaRows && mma ? Path::kMma : Path::kDequant;
}
float tolerance(Path p) { return p == Path::kStream ? 1e-5f : p == Path::kMma ? 1e-4f : 2e-3f; }

using test::random_floats;

// W [k, n] as the int8 rule leaves it: every weight q * s.
std::vector<float> dequantized(const std::vector<float>& w, int64_t k, int64_t n) {
  std::vector<float> out(w.size());
  int8_t q[32];
  for (int64_t c = 0; c < n; ++c)
    for (int64_t g = 0; g * 32 < k; ++g) {
      const int64_t rows = std::min<int64_t>(32, k - g * 32);
      const float s = f16_to_f32(kernels::int8_quantize_group(w.data() + g * 32 * n + c, n, rows, q));
      for (int64_t p = 0; p < rows; ++p) out[(g * 32 + p) * n + c] = static_cast<float>(q[p]) * s;
    }
  return out;
}

std::vector<float> round_f16(std::vector<float> v) {
  for (float& x : v) x = f16_to_f32(f32_to_f16(x));
  return v;
}

std::vector<uint16_t> as_f16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_f16(v[i]);
  return out;
}

float gelu(double v) {
  return static_cast<float>(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
}

// epilogue(A W + beta C0), float64 sums.
std::vector<float> reference(const std::vector<float>& a, const std::vector<float>& w,
                             const std::vector<float>& c0, const std::vector<float>& bias,
                             int64_t m, int64_t n, int64_t k, float beta, Epilogue e) {
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[r * k + p]) * w[p * n + c];
      if (beta != 0.0f) s += static_cast<double>(beta) * c0[r * n + c];
      if (e != Epilogue::kNone) s += bias[c];
      out[r * n + c] = e == Epilogue::kBiasGelu ? gelu(s) : static_cast<float>(s);
    }
  return out;
}

float worst_rel(const std::vector<float>& want, const std::vector<float>& got) {
  float scale = 1.0f, worst = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) {
    const float d = std::fabs(got[i] - want[i]);
    if (!(d <= worst)) worst = d;  // NaN is the worst
  }
  return worst / scale;
}

class CudaInt8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    gpu_ = make_cuda_backend(0, &error);
    ASSERT_NE(gpu_, nullptr) << error;
  }
  std::vector<float> read_f32(const DeviceBuffer& b, size_t n) {
    std::vector<float> out(n);
    gpu_->copy_to_host(out.data(), b.data(), n * sizeof(float));
    gpu_->synchronize();
    return out;
  }
  std::vector<float> read_f16(const DeviceBuffer& b, size_t n) {
    std::vector<uint16_t> h(n);
    gpu_->copy_to_host(h.data(), b.data(), n * 2);
    gpu_->synchronize();
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(h[i]);
    return out;
  }
  std::unique_ptr<Backend> gpu_;
};

struct Shape {
  int64_t n, k;
};
const Shape kShapes[] = {{2304, 768}, {768, 3072}, {70, 100}, {5, 33}, {97, 65}};
const int64_t kRows[] = {1, 2, 3, 5, 8, 16, 17, 32, 33, 64, 65};

TEST_F(CudaInt8Test, SupportsInt8WeightsWithFp16Activations) {
  EXPECT_TRUE(gpu_->supports(Precision::kInt8, Precision::kF16));
  EXPECT_FALSE(gpu_->supports(Precision::kF16, Precision::kInt8));
  if (std::getenv("LTM_CUDA_F32_ACT") == nullptr) {
    EXPECT_EQ(gpu_->activation_precision(Precision::kInt8), Precision::kF16);
  }
}

TEST_F(CudaInt8Test, MatmulF32Activations) {
  uint32_t seed = 100;
  for (const Shape& s : kShapes) {
    const std::vector<float> w = random_floats(s.k * s.n, ++seed);
    const std::vector<float> wq = dequantized(w, s.k, s.n);
    DeviceBuffer gw = gpu_->upload_weight(w.data(), s.k, s.n, Precision::kInt8);
    ASSERT_EQ(gw.precision(), Precision::kInt8);
    std::vector<float> decode_row, verify_row;  // row 0 of the first step of each kernel
    for (int64_t m : kRows) {
      for (float beta : {0.0f, 1.0f}) {
        const std::vector<float> a = random_floats(m * s.k, 7);  // row r the same for every m
        const std::vector<float> c0 = random_floats(m * s.n, ++seed);
        DeviceBuffer ga = gpu_->upload(a.data(), a.size() * 4, false);
        DeviceBuffer gc = gpu_->upload(c0.data(), c0.size() * 4, false);
        gpu_->matmul(ga.f32(), gw, gc.f32(), m, s.n, s.k, beta);
        const std::vector<float> got = read_f32(gc, c0.size());
        const Path path = path_for(m);
        const std::vector<float> want =
            path == Path::kStream
                ? reference(a, wq, c0, {}, m, s.n, s.k, beta, Epilogue::kNone)
                : reference(round_f16(a), path == Path::kMma ? wq : round_f16(wq), c0, {}, m,
                            s.n, s.k, beta, Epilogue::kNone);
        const float rel = worst_rel(want, got);
        std::printf("[ int8 matmul m=%lld n=%lld k=%lld beta=%g ] %.3g of the largest output\n",
                    static_cast<long long>(m), static_cast<long long>(s.n),
                    static_cast<long long>(s.k), beta, rel);
        EXPECT_LT(rel, tolerance(path)) << "m " << m << " n " << s.n << " k " << s.k;
        if (beta == 0.0f && path != Path::kDequant) {
          const std::vector<float> row0(got.begin(), got.begin() + s.n);
          std::vector<float>& first = path == Path::kStream ? decode_row : verify_row;
          if (first.empty()) first = row0;
          else EXPECT_EQ(row0, first) << "row 0 of " << m << " rows differs from a smaller step";
        }
      }
    }
  }
}

TEST_F(CudaInt8Test, MatmulActFp16ActivationsAndEpilogues) {
  uint32_t seed = 300;
  for (const Shape& s : kShapes) {
    const std::vector<float> w = random_floats(s.k * s.n, ++seed);
    const std::vector<float> wq = dequantized(w, s.k, s.n);
    DeviceBuffer gw = gpu_->upload_weight(w.data(), s.k, s.n, Precision::kInt8);
    const std::vector<float> bias = random_floats(s.n, ++seed, -0.5f, 0.5f);
    DeviceBuffer gb = gpu_->upload(bias.data(), bias.size() * 4, false);
    for (int64_t m : kRows) {
      for (Epilogue e : {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasGelu}) {
        for (bool c_f32 : {false, true}) {
          const float beta = c_f32 && e == Epilogue::kNone ? 1.0f : 0.0f;
          const std::vector<float> a = round_f16(random_floats(m * s.k, ++seed));
          const std::vector<float> c0 = round_f16(random_floats(m * s.n, ++seed));
          const std::vector<uint16_t> a16 = as_f16(a);
          DeviceBuffer ga = gpu_->upload(a16.data(), a16.size() * 2, false);
          DeviceBuffer gc;
          if (c_f32) {
            gc = gpu_->upload(c0.data(), c0.size() * 4, false);
          } else {
            const std::vector<uint16_t> c16 = as_f16(c0);
            gc = gpu_->upload(c16.data(), c16.size() * 2, false);
          }
          gpu_->matmul_act(Act(ga.data(), Precision::kF16), gw,
                           Act(gc.data(), c_f32 ? Precision::kF32 : Precision::kF16), m, s.n, s.k,
                           beta, e == Epilogue::kNone ? nullptr : gb.f32(), e);
          const std::vector<float> got = c_f32 ? read_f32(gc, c0.size()) : read_f16(gc, c0.size());
          const Path path = path_for(m);
          const std::vector<float> want = reference(
              a, path == Path::kDequant ? round_f16(wq) : wq, c0, bias, m, s.n, s.k, beta, e);
          const float rel = worst_rel(want, got);
          // C rounded once to fp16: half an ulp, 2^-11 of the output.
          const float tol = tolerance(path) + (c_f32 ? 0.0f : 4.9e-4f);
          std::printf("[ int8 matmul_act fp16 m=%lld n=%lld k=%lld epilogue %d C %s ] %.3g\n",
                      static_cast<long long>(m), static_cast<long long>(s.n),
                      static_cast<long long>(s.k), static_cast<int>(e), c_f32 ? "f32" : "fp16",
                      rel);
          EXPECT_LT(rel, tol) << "m " << m << " n " << s.n << " k " << s.k;
        }
      }
    }
  }
}

TEST_F(CudaInt8Test, EmbedAndLmHead) {
  constexpr int64_t rows = 333, d = 100, row_begin = 1000;
  const std::vector<float> e = random_floats(rows * d, 900);
  // E [rows, d] is the weight E^T [d, rows]: its columns are E's rows.
  std::vector<float> et(e.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) et[c * rows + r] = e[r * d + c];
  const std::vector<float> etq = dequantized(et, d, rows);
  DeviceBuffer table = gpu_->upload_embedding(e.data(), rows, d, Precision::kInt8);
  // embed: exact rows, zeros outside [row_begin, row_begin + rows).
  const std::vector<int32_t> ids = {1000, 1332, 999, 1333, 1100, 0};
  DeviceBuffer gids = gpu_->upload(ids.data(), ids.size() * 4, false);
  DeviceBuffer out = gpu_->alloc(ids.size() * d * 4);
  gpu_->embed(static_cast<const int32_t*>(gids.data()), table, row_begin, row_begin + rows,
              out.f32(), static_cast<int64_t>(ids.size()), d);
  const std::vector<float> got = read_f32(out, ids.size() * d);
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t r = ids[t] - row_begin;
    for (int64_t c = 0; c < d; ++c)
      ASSERT_EQ(got[t * d + c], r >= 0 && r < rows ? etq[c * rows + r] : 0.0f)
          << "token " << t << " column " << c;
  }
  // lm_head: logits = x E^T.
  for (int64_t m : {1, 4, 16, 40, 100}) {
    const std::vector<float> x = random_floats(m * d, 901);
    DeviceBuffer gx = gpu_->upload(x.data(), x.size() * 4, false);
    DeviceBuffer logits = gpu_->alloc(m * rows * 4);
    gpu_->lm_head(gx.f32(), table, logits.f32(), m, rows, d);
    const Path path = path_for(m);
    const std::vector<float> want =
        path == Path::kStream
            ? reference(x, etq, {}, {}, m, rows, d, 0.0f, Epilogue::kNone)
            : reference(round_f16(x), path == Path::kMma ? etq : round_f16(etq), {}, {}, m, rows,
                        d, 0.0f, Epilogue::kNone);
    const float rel = worst_rel(want, read_f32(logits, m * rows));
    std::printf("[ int8 lm_head m=%lld rows=%lld d=%lld ] %.3g\n", static_cast<long long>(m),
                static_cast<long long>(rows), static_cast<long long>(d), rel);
    EXPECT_LT(rel, tolerance(path)) << "m " << m;
  }
}

TEST_F(CudaInt8Test, Int8GraphReplayEqualsEager) {
  constexpr int64_t n = 512, k = 768;
  const std::vector<float> w = random_floats(k * n, 50);
  DeviceBuffer gw = gpu_->upload_weight(w.data(), k, n, Precision::kInt8);
  // The streaming kernel; the tensor-core kernel (6 splits of k on a 132-SM GPU: its partial
  // sums in the scratch); the dequantizing path's scratch.
  for (int64_t m : {1, 48, 100}) {
    const std::vector<float> a = random_floats(m * k, 51);
    DeviceBuffer ga = gpu_->upload(a.data(), a.size() * 4, false);
    DeviceBuffer eager = gpu_->alloc(m * n * 4), replayed = gpu_->alloc(m * n * 4);
    gpu_->matmul(ga.f32(), gw, eager.f32(), m, n, k, 0.0f);
    const std::vector<float> want = read_f32(eager, m * n);
    std::unique_ptr<BackendGraph> graph =
        gpu_->capture([&] { gpu_->matmul(ga.f32(), gw, replayed.f32(), m, n, k, 0.0f); });
    gpu_->fill_zero(replayed.data(), m * n * 4);
    gpu_->replay(*graph);
    EXPECT_EQ(read_f32(replayed, m * n), want) << m << " rows";
  }
}

}  // namespace
}  // namespace ltm
