// The CUDA backend's memory, GEMMs and embedding tables against the CPU backend on the same
// random inputs (the element-wise ops, layer norms and attention: cuda_backend_ops_gpu_test.cpp;
// the fixture and helpers both share: cuda_backend_fixture.h).
//
// Each case prints "max |cuda - cpu|" and asserts it below the tolerance (1e-4 relative to the
// largest output for GEMM, whose outputs grow with k; 1e-4 absolute for the position embedding).
// Skips itself when there is no CUDA device (or ltm was built without CUDA).
//
// 16-bit weights (bf16, fp16), against the CPU backend holding the same 16-bit values:
//  - matmul / lm_head: the GPU also rounds the float32 activations to the weight type before its
//    tensor-core GEMM (the CPU multiplies them in float32), so they differ by that rounding:
//    tolerance 1e-2 (bf16, 8 mantissa bits) and 2e-3 (fp16, 11 bits) relative to the largest
//    output, about 5x the worst error seen for k <= 3072 in theory (2^-9 resp. 2^-12 per element,
//    accumulated as a random walk).
//  - embed: exact (both widen the same 16-bit values).
//
// 16-bit activations (activation_precision(): bf16/fp16 with 16-bit weights; their tolerance,
// tolerance_act, in cuda_backend_fixture.h): GEMMs (matmul_act, with the bias and bias + GELU
// epilogues) are held to tolerance_16 relative to the largest output, as above, plus that
// rounding.
#include <gtest/gtest.h>

#ifdef LTM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/dtype.h"
#include "tests/kernels/cuda_backend_fixture.h"
#include "tests/kernels/random_floats.h"

namespace ltm {
namespace {

using namespace cuda_test;  // NOLINT: the fixture, Twin, kTol, report, the 16-bit helpers ...

TEST_F(CudaBackendTest, DescribesItselfAndMovesMemory) {
  EXPECT_EQ(gpu_->kind(), BackendKind::kCuda);
  EXPECT_TRUE(gpu_->comm_on_device());
  std::printf("backend: %s\n", gpu_->describe().c_str());
  EXPECT_NE(gpu_->describe().find("cuda:0"), std::string::npos);

  const std::vector<float> host = random_floats(1000, 1);
  DeviceBuffer buf = gpu_->upload(host.data(), host.size() * sizeof(float), true);
  ASSERT_FALSE(buf.empty());
  EXPECT_NE(buf.data(), static_cast<const void*>(host.data()));  // upload always copies
  std::vector<float> back(host.size());
  gpu_->copy_to_host(back.data(), buf.data(), back.size() * sizeof(float));
  gpu_->synchronize();
  EXPECT_EQ(back, host);

  gpu_->fill_zero(buf.f32() + 10, 20 * sizeof(float));
  gpu_->copy_to_host(back.data(), buf.data(), back.size() * sizeof(float));
  gpu_->synchronize();
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(back[i], (i >= 10 && i < 30) ? 0.0f : host[i]) << i;

  DeviceBuffer empty = gpu_->alloc(0);
  EXPECT_EQ(empty.bytes(), 0u);
}

TEST_F(CudaBackendTest, Gemm) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1}, {7, 33, 65}, {37, 50, 129}, {1, 768, 768},
                          {64, 2304, 768}, {130, 97, 3072}};
  uint32_t seed = 10;
  for (const Shape& s : shapes) {
    for (bool b_transposed : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        const std::vector<float> a = random_floats(s.m * s.k, ++seed);
        const std::vector<float> b = random_floats(s.k * s.n, ++seed);
        std::vector<float> c0 = random_floats(s.m * s.n, ++seed);
        Twin ta = twin(a), tb = twin(b), tc = twin(c0);
        if (beta == 0.0f) {  // C must not be read: poison the GPU copy
          std::vector<float> nan(c0.size(), std::numeric_limits<float>::quiet_NaN());
          gpu_->copy_to_device(tc.gpu.data(), nan.data(), nan.size() * sizeof(float));
        }
        cpu_->gemm(ta.cpu.f32(), tb.cpu.f32(), tc.cpu.f32(), s.m, s.n, s.k, b_transposed, beta);
        gpu_->gemm(ta.gpu.f32(), tb.gpu.f32(), tc.gpu.f32(), s.m, s.n, s.k, b_transposed, beta);
        auto [c, g] = fetch(tc, s.m * s.n);
        const float d = max_abs_diff(c, g);
        const float scale = std::max(1.0f, max_abs(c));
        report("gemm m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                   " k=" + std::to_string(s.k) + (b_transposed ? " B^T" : "") +
                   " beta=" + std::to_string(static_cast<int>(beta)),
               d);
        EXPECT_LT(d, kTol * scale);
      }
    }
  }
}

float tolerance_16(Precision p) { return p == Precision::kBF16 ? 1e-2f : 2e-3f; }

TEST_F(CudaBackendTest, Matmul16BitWeights) {
  struct Shape {
    int64_t m, n, k;
  };
  // Odd leading dimensions (n = 33, 97; k = 65) take cuBLASLt's unaligned algorithms.
  const Shape shapes[] = {{1, 768, 768}, {7, 33, 65}, {37, 64, 128}, {64, 2304, 768},
                          {130, 97, 3072}, {1, 3072, 768}};
  uint32_t seed = 300;
  for (Precision p : {Precision::kBF16, Precision::kF16}) {
    for (const Shape& s : shapes) {
      for (float beta : {0.0f, 1.0f}) {
        const std::vector<float> a = random_floats(s.m * s.k, ++seed);
        const std::vector<float> w = random_floats(s.k * s.n, ++seed);
        const std::vector<float> c0 = random_floats(s.m * s.n, ++seed);
        Twin ta = twin(a), tc = twin(c0);
        DeviceBuffer w_cpu = cpu_->upload_weight(w.data(), s.k, s.n, p);
        DeviceBuffer w_gpu = gpu_->upload_weight(w.data(), s.k, s.n, p);
        EXPECT_EQ(w_gpu.precision(), p);
        EXPECT_EQ(w_gpu.bytes(), static_cast<size_t>(s.k * s.n) * 2);
        if (beta == 0.0f) {  // C must not be read
          std::vector<float> nan(c0.size(), std::numeric_limits<float>::quiet_NaN());
          gpu_->copy_to_device(tc.gpu.data(), nan.data(), nan.size() * sizeof(float));
        }
        cpu_->matmul(ta.cpu.f32(), w_cpu, tc.cpu.f32(), s.m, s.n, s.k, beta);
        gpu_->matmul(ta.gpu.f32(), w_gpu, tc.gpu.f32(), s.m, s.n, s.k, beta);
        auto [c, g] = fetch(tc, s.m * s.n);
        const float d = max_abs_diff(c, g);
        const float scale = std::max(1.0f, max_abs(c));
        report(std::string("matmul ") + precision_name(p) + " m=" + std::to_string(s.m) +
                   " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                   " beta=" + std::to_string(static_cast<int>(beta)),
               d / scale);
        EXPECT_LT(d, tolerance_16(p) * scale);
        // The same shape again (the cached algorithm) gives the same bits.
        if (beta == 0.0f) {
          gpu_->matmul(ta.gpu.f32(), w_gpu, tc.gpu.f32(), s.m, s.n, s.k, beta);
          auto [c2, g2] = fetch(tc, s.m * s.n);
          EXPECT_EQ(g, g2);
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, ActivationPrecisionFollows16BitWeights) {
  EXPECT_EQ(gpu_->activation_precision(Precision::kF32), Precision::kF32);
  // LTM_CUDA_F32_ACT=1 keeps fp32 activations (for comparisons); by default they follow.
  const bool f32_act = std::getenv("LTM_CUDA_F32_ACT") != nullptr;
  for (Precision p : {Precision::kBF16, Precision::kF16})
    EXPECT_EQ(gpu_->activation_precision(p), f32_act ? Precision::kF32 : p);
}

TEST_F(CudaBackendTest, MatmulAct16BitActivationsAndEpilogues) {
  struct Shape {
    int64_t m, n, k;
  };
  // Odd n (33, 97) and k (65) leave the 16-bit rows unaligned to 16 bytes: cuBLASLt's unaligned
  // algorithms, or no epilogue algorithm (the GEMM and a kernel then).
  const Shape shapes[] = {{1, 768, 768}, {7, 33, 65}, {37, 64, 128}, {64, 2304, 768},
                          {130, 97, 3072}, {1, 3072, 768}, {16, 4096, 1024}};
  uint32_t seed = 700;
  for (Precision p : {Precision::kBF16, Precision::kF16}) {
    for (const Shape& s : shapes) {
      for (Epilogue e : {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasGelu}) {
        for (bool c_f32 : {false, true}) {  // C of the activations' type, or fp32 (hidden)
          const float beta = c_f32 && e == Epilogue::kNone ? 1.0f : 0.0f;  // the residual GEMM
          const std::vector<float> a = rounded(random_floats(s.m * s.k, ++seed), p);
          const std::vector<float> w = random_floats(s.k * s.n, ++seed);
          const std::vector<float> bias = random_floats(s.n, ++seed, -0.5f, 0.5f);
          const std::vector<float> c0 = c_f32 ? random_floats(s.m * s.n, ++seed)
                                              : rounded(random_floats(s.m * s.n, ++seed), p);
          DeviceBuffer w_cpu = cpu_->upload_weight(w.data(), s.k, s.n, p);
          DeviceBuffer w_gpu = gpu_->upload_weight(w.data(), s.k, s.n, p);
          Twin tbias = twin(bias);
          // CPU: fp32 activations of the same values.
          Twin ta = twin(a), tc = twin(c0);
          cpu_->matmul(ta.cpu.f32(), w_cpu, tc.cpu.f32(), s.m, s.n, s.k, beta);
          if (e == Epilogue::kBias) cpu_->add_bias(tc.cpu.f32(), tbias.cpu.f32(), s.m, s.n);
          if (e == Epilogue::kBiasGelu) cpu_->bias_gelu(tc.cpu.f32(), tbias.cpu.f32(), s.m, s.n);
          std::vector<float> want(s.m * s.n);
          cpu_->copy_to_host(want.data(), tc.cpu.data(), want.size() * sizeof(float));
          // GPU: A 16-bit, C 16-bit or fp32.
          const std::vector<uint16_t> a16 = as_16(a, p);
          DeviceBuffer ga = gpu_->upload(a16.data(), a16.size() * 2, false);
          DeviceBuffer gc;
          if (c_f32) {
            gc = gpu_->upload(c0.data(), c0.size() * sizeof(float), false);
          } else {
            const std::vector<uint16_t> c16 = as_16(c0, p);
            gc = gpu_->upload(c16.data(), c16.size() * 2, false);
          }
          const Act c_act(gc.data(), c_f32 ? Precision::kF32 : p);
          const float* b = e == Epilogue::kNone ? nullptr : tbias.gpu.f32();
          gpu_->matmul_act(Act(ga.data(), p), w_gpu, c_act, s.m, s.n, s.k, beta, b, e);
          std::vector<float> got(s.m * s.n);
          if (c_f32) {
            gpu_->copy_to_host(got.data(), gc.data(), got.size() * sizeof(float));
            gpu_->synchronize();
          } else {
            got = fetch_16(*gpu_, gc.data(), got.size(), p);
          }
          const float d = max_abs_diff(want, got);
          const float scale = std::max(1.0f, max_abs(want));
          const char* en[] = {"", " bias", " bias+gelu"};
          report(std::string("matmul_act ") + precision_name(p) + " m=" + std::to_string(s.m) +
                     " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                     en[static_cast<int>(e)] + (c_f32 ? " C f32" : ""),
                 d / scale);
          EXPECT_LT(d, (tolerance_16(p) + (c_f32 ? 0.0f : tolerance_act(p, 1.0f))) * scale);
          for (float v : got) ASSERT_TRUE(std::isfinite(v));
          // The same call again (the cached plan) gives the same bits.
          if (beta == 0.0f) {
            gpu_->matmul_act(Act(ga.data(), p), w_gpu, c_act, s.m, s.n, s.k, beta, b, e);
            std::vector<float> again(s.m * s.n);
            if (c_f32) {
              gpu_->copy_to_host(again.data(), gc.data(), again.size() * sizeof(float));
              gpu_->synchronize();
            } else {
              again = fetch_16(*gpu_, gc.data(), again.size(), p);
            }
            EXPECT_EQ(got, again);
          }
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, EmbedAndLmHead16Bit) {
  const int64_t rows = 1000, row_begin = 2000;  // a vocab-parallel rank's rows
  for (Precision p : {Precision::kBF16, Precision::kF16}) {
    for (int64_t d : std::vector<int64_t>{64, 80, 768}) {
      const std::vector<float> e = random_floats(rows * d, 400 + static_cast<uint32_t>(d));
      DeviceBuffer e_cpu = cpu_->upload_embedding(e.data(), rows, d, p);
      DeviceBuffer e_gpu = gpu_->upload_embedding(e.data(), rows, d, p);
      const int64_t n_tokens = 9;
      std::vector<int32_t> ids = {2000, 2999, 3000, 1999, 2500, 2001, 0, 2777, 2998};
      Twin tids = twin(ids), out = twin_alloc(n_tokens * d);
      cpu_->embed(tids.cpu.i32(), e_cpu, row_begin, row_begin + rows, out.cpu.f32(), n_tokens, d);
      gpu_->embed(tids.gpu.i32(), e_gpu, row_begin, row_begin + rows, out.gpu.f32(), n_tokens, d);
      const float de = diff(out, n_tokens * d);
      report(std::string("embed ") + precision_name(p) + " d=" + std::to_string(d), de);
      EXPECT_EQ(de, 0.0f);

      for (int64_t m : std::vector<int64_t>{1, 5, 64}) {
        Twin x = twin(random_floats(m * d, 410 + static_cast<uint32_t>(m)));
        Twin logits = twin_alloc(m * rows);
        cpu_->lm_head(x.cpu.f32(), e_cpu, logits.cpu.f32(), m, rows, d);
        gpu_->lm_head(x.gpu.f32(), e_gpu, logits.gpu.f32(), m, rows, d);
        auto [c, g] = fetch(logits, m * rows);
        const float dl = max_abs_diff(c, g);
        const float scale = std::max(1.0f, max_abs(c));
        report(std::string("lm_head ") + precision_name(p) + " m=" + std::to_string(m) +
                   " d=" + std::to_string(d),
               dl / scale);
        EXPECT_LT(dl, tolerance_16(p) * scale);
      }
    }
  }
}
TEST_F(CudaBackendTest, EmbeddingAndGather) {
  const int64_t vocab = 400, row_begin = 100, row_end = 300;
  for (int64_t d : std::vector<int64_t>{1, 13, 768}) {
    const int64_t n_tokens = 57;
    std::mt19937 rng(60);
    std::vector<int32_t> ids(n_tokens);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
    ids[0] = row_begin;
    ids[1] = row_end - 1;
    ids[2] = row_end;
    Twin tids = twin(ids), table = twin(random_floats((row_end - row_begin) * d, 61));
    Twin out = twin_alloc(n_tokens * d);
    cpu_->embedding(tids.cpu.i32(), table.cpu.f32(), row_begin, row_end, out.cpu.f32(), n_tokens,
                    d);
    gpu_->embedding(tids.gpu.i32(), table.gpu.f32(), row_begin, row_end, out.gpu.f32(), n_tokens,
                    d);
    float diff_e = diff(out, n_tokens * d);
    report("embedding d=" + std::to_string(d), diff_e);
    EXPECT_EQ(diff_e, 0.0f);

    std::vector<int32_t> rows(n_tokens);
    for (auto& r : rows) r = static_cast<int32_t>(rng() % (row_end - row_begin));
    Twin trows = twin(rows), gathered = twin_alloc(n_tokens * d);
    cpu_->gather_rows(table.cpu.f32(), trows.cpu.i32(), gathered.cpu.f32(), n_tokens, d);
    gpu_->gather_rows(table.gpu.f32(), trows.gpu.i32(), gathered.gpu.f32(), n_tokens, d);
    float diff_g = diff(gathered, n_tokens * d);
    report("gather_rows d=" + std::to_string(d), diff_g);
    EXPECT_EQ(diff_g, 0.0f);
  }
}

TEST_F(CudaBackendTest, PositionEmbedding) {
  const int64_t n_positions = 2048;
  for (int64_t d : std::vector<int64_t>{1, 13, 768}) {
    const int64_t n_tokens = 45;
    std::mt19937 rng(70);
    std::vector<int32_t> positions(n_tokens);
    for (auto& p : positions) p = static_cast<int32_t>(rng() % n_positions);
    positions[0] = 0;
    positions[1] = n_positions - 1;
    Twin tpos = twin(positions), table = twin(random_floats(n_positions * d, 71));
    for (bool learned : {true, false}) {
      Twin x = twin(random_floats(n_tokens * d, 72));
      cpu_->add_position_embedding(x.cpu.f32(), learned ? table.cpu.f32() : nullptr,
                                   tpos.cpu.i32(), n_tokens, d);
      gpu_->add_position_embedding(x.gpu.f32(), learned ? table.gpu.f32() : nullptr,
                                   tpos.gpu.i32(), n_tokens, d);
      const float dd = diff(x, n_tokens * d);
      report(std::string("add_position_embedding ") + (learned ? "learned" : "sinusoidal") +
                 " d=" + std::to_string(d),
             dd);
      EXPECT_LT(dd, kTol);
    }
  }
}

}  // namespace
}  // namespace ltm
