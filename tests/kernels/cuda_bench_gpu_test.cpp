// Timings of the CUDA backend's heavy ops on GPT-2/GPT-3 shapes: GEMM (fp32, or TF32 with
// LTM_CUDA_TF32=1 in the environment), int8-weight GEMMs, decode and prefill paged attention,
// layer_norm. Prints achieved TFLOP/s or GB/s; asserts nothing about speed (only that results are
// finite). Skips itself without a CUDA device.
#include <gtest/gtest.h>

#ifdef LTM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/dtype.h"

namespace ltm {
namespace {

bool have_device() {
#ifdef LTM_HAVE_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

class CudaBench : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    std::string error;
    gpu_ = make_cuda_backend(0, &error);
    ASSERT_NE(gpu_, nullptr) << error;
    std::printf("backend: %s\n", gpu_->describe().c_str());
  }

  DeviceBuffer random_buffer(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> host(n);
    for (float& x : host) x = dist(rng);
    return gpu_->upload(host.data(), n * sizeof(float), false);
  }
  template <typename T>
  DeviceBuffer upload(const std::vector<T>& v) {
    return gpu_->upload(v.data(), v.size() * sizeof(T), false);
  }

  // Median seconds per call of `op` over `iters` calls (after 3 warm-ups).
  double time_op(const std::function<void()>& op, int iters = 20) {
    for (int i = 0; i < 3; ++i) op();
    gpu_->synchronize();
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      const auto start = std::chrono::steady_clock::now();
      op();
      gpu_->synchronize();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }

  void expect_finite(const DeviceBuffer& b, size_t n) {
    std::vector<float> host(n);
    gpu_->copy_to_host(host.data(), b.data(), n * sizeof(float));
    gpu_->synchronize();
    for (float v : host) ASSERT_TRUE(std::isfinite(v));
  }

  // n_seqs sequences of `past` cached tokens and `n_new` new rows each, blocks scattered.
  // bf16: the activations and the cache in bf16 (the tensor-core prefill kernel's case, where it
  // applies; LTM_CUDA_PREFILL_MMA=0 times the float32 kernel on the same data).
  void bench_attention(const char* what, int n_seqs, int past, int n_new, int n_head,
                       int head_dim, int block_size, int iters, bool bf16 = false) {
    Backend& gpu = *gpu_;
    const int ctx = past + n_new;
    const int max_blocks = (ctx + block_size - 1) / block_size;
    const int n_blocks = n_seqs * max_blocks;
    std::vector<int32_t> pool(n_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(7));
    std::vector<int32_t> offsets(n_seqs + 1), lens(n_seqs, ctx), tables(pool), slots(n_seqs * n_new);
    for (int s = 0; s <= n_seqs; ++s) offsets[s] = s * n_new;
    for (int s = 0; s < n_seqs; ++s)
      for (int i = 0; i < n_new; ++i) {
        const int pos = past + i;
        slots[s * n_new + i] = tables[s * max_blocks + pos / block_size] * block_size + pos % block_size;
      }
    const int n_tokens = n_seqs * n_new;
    const int64_t d_local = static_cast<int64_t>(n_head) * head_dim;
    const int64_t cache = static_cast<int64_t>(n_blocks) * n_head * block_size * head_dim;
    const size_t elem = bf16 ? 2 : 4;
    DeviceBuffer qkv = random_buffer(n_tokens * 3 * d_local, 8), k = random_buffer(cache, 9),
                v = random_buffer(cache, 10);
    if (bf16) {  // the same kind of values, as bf16 bits (the caches are written below)
      std::mt19937 rng(8);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<uint16_t> q16(static_cast<size_t>(n_tokens * 3 * d_local));
      for (uint16_t& x : q16) x = f32_to_bf16(dist(rng));
      qkv = upload(q16);
    }
    DeviceBuffer out = gpu.alloc(n_tokens * d_local * elem);
    DeviceBuffer d_off = gpu.upload(offsets.data(), offsets.size() * 4, false);
    DeviceBuffer d_len = gpu.upload(lens.data(), lens.size() * 4, false);
    DeviceBuffer d_tab = gpu.upload(tables.data(), tables.size() * 4, false);
    DeviceBuffer d_slot = gpu.upload(slots.data(), slots.size() * 4, false);
    AttentionArgs args;
    args.n_seqs = n_seqs;
    args.n_tokens = n_tokens;
    args.token_offsets = d_off.i32();
    args.context_lens = d_len.i32();
    args.block_tables = d_tab.i32();
    args.slot_mapping = d_slot.i32();
    args.max_blocks_per_seq = max_blocks;
    args.max_context_len = ctx;
    args.max_new_tokens = n_new;
    args.n_head = n_head;
    args.head_dim = head_dim;
    args.block_size = block_size;
    if (bf16) args.act = args.kv = Precision::kBF16;
    gpu.kv_cache_write(args, qkv.data(), k.data(), v.data());
    const double sec =
        time_op([&] { gpu.paged_attention(args, qkv.data(), k.data(), v.data(), out.data()); },
                iters);
    // Keys and values read once per (sequence, head) for decode; per query tile for prefill.
    const double kv_bytes = 2.0 * n_seqs * static_cast<double>(ctx) * d_local * elem;
    const double flops = 4.0 * n_seqs * n_head * head_dim *
                         (static_cast<double>(n_new) * past + 0.5 * n_new * (n_new + 1.0));
    std::printf("[ attention %-30s ] %8.3f ms  KV %6.0f GB/s  %6.2f TFLOP/s\n", what, sec * 1e3,
                kv_bytes / sec / 1e9, flops / sec / 1e12);
    if (bf16) {
      std::vector<uint16_t> host(std::min<size_t>(4096, n_tokens * d_local));
      gpu_->copy_to_host(host.data(), out.data(), host.size() * 2);
      gpu_->synchronize();
      for (uint16_t x : host) ASSERT_TRUE(std::isfinite(bf16_to_f32(x)));
    } else {
      expect_finite(out, std::min<size_t>(4096, n_tokens * d_local));
    }
  }

  std::unique_ptr<Backend> gpu_;
};

TEST_F(CudaBench, Gemm) {
  struct Shape {
    const char* what;
    int64_t m, n, k;
  };
  const Shape shapes[] = {{"gpt2 decode qkv  64x2304x768", 64, 2304, 768},
                          {"gpt2 prefill fc 2048x3072x768", 2048, 3072, 768},
                          {"gpt3-175B/8 fc  512x6144x12288", 512, 6144, 12288}};
  for (const Shape& s : shapes) {
    DeviceBuffer a = random_buffer(s.m * s.k, 1), b = random_buffer(s.k * s.n, 2);
    DeviceBuffer c = gpu_->alloc(s.m * s.n * sizeof(float));
    const double sec = time_op([&] { gpu_->gemm(a.f32(), b.f32(), c.f32(), s.m, s.n, s.k, false, 0.0f); });
    std::printf("[ gemm %-34s ] %8.3f ms  %6.1f TFLOP/s\n", s.what, sec * 1e3,
                2.0 * s.m * s.n * s.k / sec / 1e12);
    expect_finite(c, 1024);
  }
}

// int8 weights (--weight-dtype int8) with fp16 activations, GPT-3 6.7B's QKV and FC2 shapes, by
// rows of A: the weight-streaming kernel (1-16), the tensor-core kernel (17-64; with
// LTM_CUDA_INT8_MMA=0 in the environment the dequantizing path instead, to compare) and the
// dequantize + cuBLASLt path (128). Weight GB/s counts the 1.0625 bytes a weight once: against
// the device's copy bandwidth it says how near a GEMM is to its memory limit.
TEST_F(CudaBench, Int8Gemm) {
  struct Shape {
    const char* what;
    int64_t n, k;
  };
  const Shape shapes[] = {{"6.7B qkv 12288x4096", 12288, 4096},
                          {"6.7B fc2 4096x16384", 4096, 16384}};
  for (const Shape& s : shapes) {
    std::vector<float> w(static_cast<size_t>(s.k * s.n));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    for (float& x : w) x = dist(rng);
    DeviceBuffer gw = gpu_->upload_weight(w.data(), s.k, s.n, Precision::kInt8);
    for (int64_t m : {1, 16, 17, 32, 64, 128}) {
      std::vector<uint16_t> a16(static_cast<size_t>(m * s.k));
      for (uint16_t& x : a16) x = f32_to_f16(dist(rng) * 20.0f);
      DeviceBuffer a = upload(a16), c = gpu_->alloc(m * s.n * 2);
      const double sec = time_op([&] {
        gpu_->matmul_act(Act(a.data(), Precision::kF16), gw, Act(c.data(), Precision::kF16), m,
                         s.n, s.k, 0.0f, nullptr, Epilogue::kNone);
      });
      std::printf("[ int8 gemm %-20s m=%-3ld ] %8.3f ms  weight %6.0f GB/s  %6.1f TFLOP/s\n",
                  s.what, static_cast<long>(m), sec * 1e3, 1.0625 * s.n * s.k / sec / 1e9,
                  2.0 * m * s.n * s.k / sec / 1e12);
      std::vector<uint16_t> host(std::min<size_t>(4096, m * s.n));
      gpu_->copy_to_host(host.data(), c.data(), host.size() * 2);
      gpu_->synchronize();
      for (uint16_t x : host) ASSERT_TRUE(std::isfinite(f16_to_f32(x)));
    }
  }
}

TEST_F(CudaBench, LayerNorm) {
  for (int64_t cols : {768, 12288}) {
    const int64_t rows = 4096;
    DeviceBuffer x = random_buffer(rows * cols, 3), g = random_buffer(cols, 4), b = random_buffer(cols, 5);
    DeviceBuffer y = gpu_->alloc(rows * cols * sizeof(float));
    const double sec =
        time_op([&] { gpu_->layer_norm(x.f32(), g.f32(), b.f32(), y.f32(), rows, cols, 1e-5f); });
    std::printf("[ layer_norm %5ldx%-6ld ] %8.3f ms  %6.0f GB/s\n", static_cast<long>(rows),
                static_cast<long>(cols), sec * 1e3, 2.0 * rows * cols * 4 / sec / 1e9);
  }
}

TEST_F(CudaBench, DecodeAttention) {
  bench_attention("decode 64 x ctx 1024, 12h d64", 64, 1023, 1, 12, 64, 16, 20);
  bench_attention("decode 8 x ctx 8192, 12h d128", 8, 8191, 1, 12, 128, 16, 20);
  bench_attention("decode 256 x ctx 512, 16h d64", 256, 511, 1, 16, 64, 32, 20);
}

TEST_F(CudaBench, PrefillAttention) {
  bench_attention("prefill 1 x 2048, 12h d64", 1, 0, 2048, 12, 64, 16, 5);
  bench_attention("prefill 8 x 512, 12h d128", 8, 0, 512, 12, 128, 16, 5);
  // GPT-3 6.7B's heads (32 x 128) over gpu_check's 2046-token prompt, float32 and bf16.
  bench_attention("prefill 1 x 2046, 32h d128 f32", 1, 0, 2046, 32, 128, 16, 5);
  bench_attention("prefill 1 x 2046, 32h d128 bf16", 1, 0, 2046, 32, 128, 16, 5, true);
  bench_attention("prefill 8 x 512, 12h d128 bf16", 8, 0, 512, 12, 128, 16, 5, true);
  bench_attention("prefill 1 x 2048, 12h d64 bf16", 1, 0, 2048, 12, 64, 16, 5, true);
}

}  // namespace
}  // namespace ltm
