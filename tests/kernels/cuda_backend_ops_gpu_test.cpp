// The CUDA backend's element-wise ops, layer norms, KV cache write and paged attention against the
// CPU backend on the same random inputs (memory, GEMMs and embedding tables:
// cuda_backend_gpu_test.cpp; the fixture and helpers both share: cuda_backend_fixture.h).
//
// Each case prints "max |cuda - cpu|" and asserts it below the tolerance (1e-4 absolute for the
// element-wise ops, layer_norm and attention). Skips itself when there is no CUDA device (or ltm
// was built without CUDA).
//
// 16-bit caches (bf16, fp16), against the CPU backend holding the same 16-bit values:
//  - kv_cache_write: bit-exact caches (both round to nearest even); paged_attention on them 1e-4.
//
// 16-bit activations: within tolerance_act (cuda_backend_fixture.h) of the float32 op on the same
// values widened.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/dtype.h"
#include "tests/kernels/cuda_backend_fixture.h"
#include "tests/kernels/random_floats.h"

namespace ltm {
namespace {

using namespace cuda_test;  // NOLINT: the fixture, Twin, kTol, report, the 16-bit helpers ...

TEST_F(CudaBackendTest, LayerNormAnd16BitElementwiseActivations) {
  struct Shape {
    int64_t rows, cols;
  };
  uint32_t seed = 800;
  for (Precision p : {Precision::kBF16, Precision::kF16}) {
    for (const Shape& s : {Shape{1, 768}, Shape{37, 4096}, Shape{5, 13}, Shape{64, 80},
                           Shape{3, 1027}, Shape{2, 12288}}) {
      const int64_t n = s.rows * s.cols;
      const std::string shape = " " + std::string(precision_name(p)) + " " +
                                std::to_string(s.rows) + "x" + std::to_string(s.cols);
      std::vector<float> x = random_floats(n, ++seed, -4.0f, 4.0f);
      for (float& v : x) v += 3.0f;
      Twin gamma = twin(random_floats(s.cols, ++seed, 0.5f, 1.5f));
      Twin beta = twin(random_floats(s.cols, ++seed));
      Twin bias = twin(random_floats(s.cols, ++seed));
      Twin res = twin(random_floats(n, ++seed));
      DeviceBuffer y16 = gpu_->alloc(n * 2);
      // layer_norm_act: fp32 in, 16-bit out.
      {
        Twin tx = twin(x), ty = twin_alloc(n);
        cpu_->layer_norm(tx.cpu.f32(), gamma.cpu.f32(), beta.cpu.f32(), ty.cpu.f32(), s.rows,
                         s.cols, 1e-5f);
        gpu_->layer_norm_act(tx.gpu.f32(), gamma.gpu.f32(), beta.gpu.f32(), Act(y16.data(), p),
                             s.rows, s.cols, 1e-5f);
        std::vector<float> want(n);
        cpu_->copy_to_host(want.data(), ty.cpu.data(), n * sizeof(float));
        const float r = worst_act_ratio(want, fetch_16(*gpu_, y16.data(), n, p), p);
        report("layer_norm_act" + shape + " (ratio to tolerance)", r);
        EXPECT_LE(r, 1.0f);
      }
      // add_bias_residual_layer_norm_act: x (fp32 residual stream) exact, y 16-bit.
      for (bool with_residual : {false, true}) {
        Twin tx = twin(x), ty = twin_alloc(n);
        float* r_cpu = with_residual ? res.cpu.f32() : nullptr;
        float* r_gpu = with_residual ? res.gpu.f32() : nullptr;
        cpu_->add_bias_residual_layer_norm(tx.cpu.f32(), r_cpu, bias.cpu.f32(), gamma.cpu.f32(),
                                           beta.cpu.f32(), ty.cpu.f32(), s.rows, s.cols, 1e-5f);
        gpu_->add_bias_residual_layer_norm_act(tx.gpu.f32(), r_gpu, bias.gpu.f32(),
                                               gamma.gpu.f32(), beta.gpu.f32(), Act(y16.data(), p),
                                               s.rows, s.cols, 1e-5f);
        // (The CPU default leaves residual + bias in `res`; with_residual is the last case.)
        const float dx = diff(tx, n);
        std::vector<float> want(n);
        cpu_->copy_to_host(want.data(), ty.cpu.data(), n * sizeof(float));
        const float r = worst_act_ratio(want, fetch_16(*gpu_, y16.data(), n, p), p);
        const std::string name = "add_bias_residual_layer_norm_act" + shape +
                                 (with_residual ? " residual" : "");
        report(name + " x", dx);
        report(name + " y (ratio to tolerance)", r);
        EXPECT_EQ(dx, 0.0f);
        EXPECT_LE(r, 1.0f);
      }
      // add_bias_act, bias_gelu_act, add_f32_to_act on 16-bit x; act_to_f32 exact.
      const std::vector<float> xr = rounded(random_floats(n, ++seed, -6.0f, 6.0f), p);
      const std::vector<uint16_t> x16 = as_16(xr, p);
      const std::vector<float> y = random_floats(n, ++seed);
      Twin ty = twin(y);
      std::vector<float> bias_h(s.cols);
      cpu_->copy_to_host(bias_h.data(), bias.cpu.data(), s.cols * sizeof(float));
      for (int op = 0; op < 4; ++op) {
        DeviceBuffer g = gpu_->upload(x16.data(), n * 2, false);
        Twin tx = twin(xr);
        const char* names[] = {"add_bias_act", "bias_gelu_act", "add_f32_to_act", "act_to_f32"};
        std::vector<float> want(n), got(n);
        if (op == 0) {
          cpu_->add_bias(tx.cpu.f32(), bias.cpu.f32(), s.rows, s.cols);
          gpu_->add_bias_act(Act(g.data(), p), bias.gpu.f32(), s.rows, s.cols);
        } else if (op == 1) {
          cpu_->bias_gelu(tx.cpu.f32(), bias.cpu.f32(), s.rows, s.cols);
          gpu_->bias_gelu_act(Act(g.data(), p), bias.gpu.f32(), s.rows, s.cols);
        } else if (op == 2) {
          cpu_->add(tx.cpu.f32(), ty.cpu.f32(), n);
          gpu_->add_f32_to_act(Act(g.data(), p), ty.gpu.f32(), n);
        }
        cpu_->copy_to_host(want.data(), tx.cpu.data(), n * sizeof(float));
        if (op == 3) {
          Twin out = twin_alloc(n);
          gpu_->act_to_f32(Act(g.data(), p), out.gpu.f32(), n);
          gpu_->copy_to_host(got.data(), out.gpu.data(), n * sizeof(float));
          gpu_->synchronize();
          EXPECT_EQ(got, xr) << "act_to_f32 widens exactly";
          continue;
        }
        got = fetch_16(*gpu_, g.data(), n, p);
        const float r = worst_act_ratio(want, got, p);
        report(std::string(names[op]) + shape + " (ratio to tolerance)", r);
        EXPECT_LE(r, 1.0f);
      }
    }
  }
}


TEST_F(CudaBackendTest, AddAndAddBias) {
  for (int64_t n : std::vector<int64_t>{1, 3, 1000, 4099, int64_t{1} << 20}) {
    Twin x = twin(random_floats(n + 1, 20)), y = twin(random_floats(n + 1, 21));
    cpu_->add(x.cpu.f32(), y.cpu.f32(), n);
    gpu_->add(x.gpu.f32(), y.gpu.f32(), n);
    const float d = diff(x, n + 1);
    report("add n=" + std::to_string(n), d);
    EXPECT_LT(d, kTol);
    // Unaligned (scalar path): one float into the buffers.
    cpu_->add(x.cpu.f32() + 1, y.cpu.f32(), n);
    gpu_->add(x.gpu.f32() + 1, y.gpu.f32(), n);
    const float du = diff(x, n + 1);
    report("add n=" + std::to_string(n) + " unaligned", du);
    EXPECT_LT(du, kTol);
  }
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape s : {Shape{1, 1}, Shape{5, 33}, Shape{17, 768}, Shape{3, 1027}, Shape{70000, 4}}) {
    Twin x = twin(random_floats(s.rows * s.cols, 30)), bias = twin(random_floats(s.cols, 31));
    cpu_->add_bias(x.cpu.f32(), bias.cpu.f32(), s.rows, s.cols);
    gpu_->add_bias(x.gpu.f32(), bias.gpu.f32(), s.rows, s.cols);
    const float d = diff(x, s.rows * s.cols);
    report("add_bias " + std::to_string(s.rows) + "x" + std::to_string(s.cols), d);
    EXPECT_LT(d, kTol);
  }
}

TEST_F(CudaBackendTest, BiasGelu) {
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape s : {Shape{1, 1}, Shape{5, 33}, Shape{17, 3072}, Shape{3, 1027}}) {
    for (bool with_bias : {true, false}) {
      Twin x = twin(random_floats(s.rows * s.cols, 40, -6.0f, 6.0f));
      Twin bias = twin(random_floats(s.cols, 41));
      cpu_->bias_gelu(x.cpu.f32(), with_bias ? bias.cpu.f32() : nullptr, s.rows, s.cols);
      gpu_->bias_gelu(x.gpu.f32(), with_bias ? bias.gpu.f32() : nullptr, s.rows, s.cols);
      const float d = diff(x, s.rows * s.cols);
      report("bias_gelu " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                 (with_bias ? "" : " no bias"),
             d);
      EXPECT_LT(d, kTol);
    }
  }
}

TEST_F(CudaBackendTest, LayerNorm) {
  struct Shape {
    int64_t rows, cols;
  };
  uint32_t seed = 50;
  for (const Shape s : {Shape{1, 1}, Shape{3, 5}, Shape{17, 768}, Shape{4, 1023}, Shape{2, 12288},
                        Shape{1000, 64}}) {
    for (bool in_place : {false, true}) {
      // An offset mean and a spread like real activations.
      std::vector<float> x = random_floats(s.rows * s.cols, ++seed, -4.0f, 4.0f);
      for (float& v : x) v += 3.0f;
      Twin tx = twin(x), gamma = twin(random_floats(s.cols, ++seed, 0.5f, 1.5f)),
           beta = twin(random_floats(s.cols, ++seed));
      Twin ty = in_place ? Twin{} : twin_alloc(s.rows * s.cols);
      Twin& out = in_place ? tx : ty;
      cpu_->layer_norm(tx.cpu.f32(), gamma.cpu.f32(), beta.cpu.f32(), out.cpu.f32(), s.rows,
                       s.cols, 1e-5f);
      gpu_->layer_norm(tx.gpu.f32(), gamma.gpu.f32(), beta.gpu.f32(), out.gpu.f32(), s.rows,
                       s.cols, 1e-5f);
      const float d = diff(out, s.rows * s.cols);
      report("layer_norm " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                 (in_place ? " in place" : ""),
             d);
      EXPECT_LT(d, kTol);
    }
  }
}

TEST_F(CudaBackendTest, AddBiasResidualLayerNormFused) {
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape& s : {Shape{1, 768}, Shape{37, 4096}, Shape{5, 13}, Shape{64, 80}}) {
    for (bool with_residual : {false, true}) {
      const uint32_t seed = 500 + static_cast<uint32_t>(s.cols);
      Twin x = twin(random_floats(s.rows * s.cols, seed, -3.0f, 3.0f));
      Twin res = twin(random_floats(s.rows * s.cols, seed + 1));
      Twin bias = twin(random_floats(s.cols, seed + 2));
      Twin gamma = twin(random_floats(s.cols, seed + 3, 0.5f, 1.5f));
      Twin beta = twin(random_floats(s.cols, seed + 4));
      Twin y = twin_alloc(s.rows * s.cols);
      cpu_->add_bias_residual_layer_norm(x.cpu.f32(), with_residual ? res.cpu.f32() : nullptr,
                                         bias.cpu.f32(), gamma.cpu.f32(), beta.cpu.f32(),
                                         y.cpu.f32(), s.rows, s.cols, 1e-5f);
      gpu_->add_bias_residual_layer_norm(x.gpu.f32(), with_residual ? res.gpu.f32() : nullptr,
                                         bias.gpu.f32(), gamma.gpu.f32(), beta.gpu.f32(),
                                         y.gpu.f32(), s.rows, s.cols, 1e-5f);
      const float dx = diff(x, s.rows * s.cols), dy = diff(y, s.rows * s.cols);
      const std::string name = "add_bias_residual_layer_norm " + std::to_string(s.rows) + "x" +
                               std::to_string(s.cols) + (with_residual ? " residual" : "");
      report(name + " x", dx);
      report(name + " y", dy);
      EXPECT_EQ(dx, 0.0f);  // the same two float adds in the same order
      EXPECT_LT(dy, kTol);
    }
  }
}

// --- attention ---

struct SeqSpec {
  int past;   // tokens already in the cache
  int n_new;  // rows of this step
};

struct AttentionCase {
  std::string name;
  int n_head;
  int head_dim;
  int block_size;
  std::vector<SeqSpec> seqs;
  int n_kv_head = 0;  // grouped-query attention (the Llama family); 0: n_head
};

// (case, KV cache type, activation type of qkv and out)
class CudaAttentionTest
    : public CudaBackendTest,
      public ::testing::WithParamInterface<std::tuple<AttentionCase, Precision, Precision>> {};

// n random cache elements of type p (uniform in [lo, hi) before rounding), as bytes.
std::vector<unsigned char> random_cache(size_t n, Precision p, uint32_t seed, float lo, float hi) {
  const std::vector<float> f = random_floats(n, seed, lo, hi);
  std::vector<unsigned char> bytes(n * precision_size(p));
  for (size_t i = 0; i < n; ++i) {
    if (p == Precision::kF32) {
      std::memcpy(bytes.data() + 4 * i, &f[i], 4);
    } else {
      const uint16_t h = p == Precision::kBF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

TEST_P(CudaAttentionTest, KvCacheWriteAndPagedAttentionMatchCpu) {
  const AttentionCase& c = std::get<0>(GetParam());
  const Precision kv = std::get<1>(GetParam());
  const Precision act = std::get<2>(GetParam());
  const int n_seqs = static_cast<int>(c.seqs.size());
  const int bs = c.block_size;
  std::mt19937 rng(80);

  // Sequences, and a scattered block table: the pool's blocks are handed out in random order.
  std::vector<int32_t> token_offsets(n_seqs + 1, 0), context_lens(n_seqs);
  int max_blocks = 1, total_blocks = 0, max_ctx = 0, max_new = 0;
  for (int s = 0; s < n_seqs; ++s) {
    token_offsets[s + 1] = token_offsets[s] + c.seqs[s].n_new;
    context_lens[s] = c.seqs[s].past + c.seqs[s].n_new;
    const int blocks = (context_lens[s] + bs - 1) / bs;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
    max_ctx = std::max(max_ctx, context_lens[s]);
    max_new = std::max(max_new, c.seqs[s].n_new);
  }
  const int n_tokens = token_offsets[n_seqs];
  const int n_blocks = total_blocks + 7;  // some blocks stay unused
  std::vector<int32_t> pool(n_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> block_tables(static_cast<size_t>(n_seqs) * max_blocks, -1);
  int next = 0;
  for (int s = 0; s < n_seqs; ++s)
    for (int b = 0; b < (context_lens[s] + bs - 1) / bs; ++b)
      block_tables[static_cast<size_t>(s) * max_blocks + b] = pool[next++];
  std::vector<int32_t> slot_mapping(n_tokens);
  for (int s = 0; s < n_seqs; ++s)
    for (int i = 0; i < c.seqs[s].n_new; ++i) {
      const int pos = c.seqs[s].past + i;
      slot_mapping[token_offsets[s] + i] =
          block_tables[static_cast<size_t>(s) * max_blocks + pos / bs] * bs + pos % bs;
    }

  const int64_t d_local = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int n_kv = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
  const int64_t qkv_width = static_cast<int64_t>(c.n_head + 2 * n_kv) * c.head_dim;
  const int64_t cache_floats = static_cast<int64_t>(n_blocks) * n_kv * bs * c.head_dim;
  // 16-bit activations: the CPU gets the values the GPU's 16-bit qkv holds, widened.
  std::vector<float> qkv_host = random_floats(n_tokens * qkv_width, 81, -2.0f, 2.0f);
  if (act != Precision::kF32) qkv_host = rounded(qkv_host, act);
  Twin qkv = twin(qkv_host);
  if (act != Precision::kF32) {
    const std::vector<uint16_t> q16 = as_16(qkv_host, act);
    qkv.gpu = gpu_->upload(q16.data(), q16.size() * 2, false);
  }
  DeviceBuffer out16 = gpu_->alloc(static_cast<size_t>(n_tokens * d_local) * 2);
  Twin k_cache = twin(random_cache(cache_floats, kv, 82, -2.0f, 2.0f));
  Twin v_cache = twin(random_cache(cache_floats, kv, 83, -1.0f, 1.0f));
  const size_t cache_bytes = static_cast<size_t>(cache_floats) * precision_size(kv);
  Twin out = twin_alloc(n_tokens * d_local);
  Twin t_offsets = twin(token_offsets), t_ctx = twin(context_lens), t_tables = twin(block_tables),
       t_slots = twin(slot_mapping);

  AttentionArgs args;
  args.n_seqs = n_seqs;
  args.n_tokens = n_tokens;
  args.max_blocks_per_seq = max_blocks;
  args.max_context_len = max_ctx;
  args.max_new_tokens = max_new;
  args.n_head = c.n_head;
  args.n_kv_head = c.n_kv_head;
  args.head_dim = c.head_dim;
  args.block_size = bs;
  args.kv = kv;
  AttentionArgs cpu_args = args, gpu_args = args;
  cpu_args.token_offsets = t_offsets.cpu.i32();
  cpu_args.context_lens = t_ctx.cpu.i32();
  cpu_args.block_tables = t_tables.cpu.i32();
  cpu_args.slot_mapping = t_slots.cpu.i32();
  gpu_args.token_offsets = t_offsets.gpu.i32();
  gpu_args.context_lens = t_ctx.gpu.i32();
  gpu_args.block_tables = t_tables.gpu.i32();
  gpu_args.slot_mapping = t_slots.gpu.i32();

  AttentionArgs gpu_args_act = gpu_args;
  gpu_args_act.act = act;
  void* gpu_out = act == Precision::kF32 ? out.gpu.data() : out16.data();
  auto fetch_out = [&]() {
    std::vector<float> c(n_tokens * d_local), g;
    cpu_->copy_to_host(c.data(), out.cpu.data(), c.size() * sizeof(float));
    if (act == Precision::kF32) {
      g.resize(c.size());
      gpu_->copy_to_host(g.data(), out.gpu.data(), g.size() * sizeof(float));
      gpu_->synchronize();
    } else {
      g = fetch_16(*gpu_, out16.data(), c.size(), act);
    }
    return std::pair{std::move(c), std::move(g)};
  };
  const std::string name =
      c.name + " kv " + precision_name(kv) + " act " + precision_name(act);
  cpu_->kv_cache_write(cpu_args, qkv.cpu.f32(), k_cache.cpu.data(), v_cache.cpu.data());
  gpu_->kv_cache_write(gpu_args_act, qkv.gpu.data(), k_cache.gpu.data(), v_cache.gpu.data());
  for (const Twin* cache : {&k_cache, &v_cache}) {  // bit for bit, whatever the element type
    std::vector<unsigned char> cb(cache_bytes), gb(cache_bytes);
    cpu_->copy_to_host(cb.data(), cache->cpu.data(), cache_bytes);
    gpu_->copy_to_host(gb.data(), cache->gpu.data(), cache_bytes);
    cpu_->synchronize();
    gpu_->synchronize();
    const bool same = cb == gb;
    report("kv_cache_write " + name + (cache == &k_cache ? " K" : " V"), same ? 0.0f : 1.0f);
    EXPECT_TRUE(same) << "the caches differ after kv_cache_write";
  }

  cpu_->paged_attention(cpu_args, qkv.cpu.f32(), k_cache.cpu.data(), v_cache.cpu.data(),
                        out.cpu.f32());
  gpu_->paged_attention(gpu_args_act, qkv.gpu.data(), k_cache.gpu.data(), v_cache.gpu.data(),
                        gpu_out);
  auto [co, go] = fetch_out();
  if (act == Precision::kF32) {
    const float d = max_abs_diff(co, go);
    report("paged_attention " + name, d);
    EXPECT_LT(d, kTol);
  } else {  // the output rounded once to the activations' type
    const float r = worst_act_ratio(co, go, act);
    report("paged_attention " + name + " (ratio to tolerance)", r);
    EXPECT_LE(r, 1.0f);
  }
  for (float v : go) ASSERT_TRUE(std::isfinite(v));

  // Run again: the decode workspace is reused and the result must be identical.
  gpu_->paged_attention(gpu_args_act, qkv.gpu.data(), k_cache.gpu.data(), v_cache.gpu.data(),
                        gpu_out);
  auto [co2, go2] = fetch_out();
  EXPECT_EQ(go, go2) << "attention is not deterministic";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttentionTest,
    ::testing::Combine(::testing::Values(
        // Decode (one row per sequence; 0 rows for one of them). Contexts past 512 keys use the
        // split-and-merge path.
        AttentionCase{"decode_h4_d64_bs16", 4, 64, 16,
                      {{0, 1}, {16, 1}, {31, 1}, {100, 1}, {40, 0}, {700, 1}, {1500, 1}}},
        AttentionCase{"decode_h3_d10_bs8_scalar", 3, 10, 8, {{5, 1}, {600, 1}, {0, 1}}},
        AttentionCase{"decode_h2_d128_bs32", 2, 128, 32, {{2000, 1}, {33, 1}}},
        AttentionCase{"decode_h1_d256_bs16", 1, 256, 16, {{300, 1}, {1100, 1}}},
        AttentionCase{"decode_h2_d96_bs1", 2, 96, 1, {{77, 1}, {520, 1}}},
        // Prefill and mixed batches (several rows per sequence, some with a cached past).
        AttentionCase{"prefill_h4_d64_bs16", 4, 64, 16,
                      {{0, 5}, {10, 37}, {0, 64}, {70, 1}, {3, 100}}},
        AttentionCase{"prefill_h3_d10_bs8_scalar", 3, 10, 8, {{0, 33}, {7, 9}}},
        AttentionCase{"prefill_h2_d128_bs32", 2, 128, 32, {{0, 130}, {200, 40}}},
        AttentionCase{"prefill_h1_d256_bs16", 1, 256, 16, {{0, 40}, {50, 3}}},
        AttentionCase{"prefill_h12_d64_bs16_long", 12, 64, 16, {{0, 1000}}},
        // Head dims of real models (64 GPT-2, 80 Phi/GPT-J-like, 96, 128 GPT-3 6.7B+) in mixed
        // batches: decode rows with contexts off the block size (some past one decode
        // partition) beside chunked-prefill rows; these run both kernels in one call.
        AttentionCase{"mixed_h4_d64_bs16", 4, 64, 16,
                      {{0, 1}, {17, 1}, {0, 45}, {600, 1}, {33, 7}, {1023, 1}}},
        AttentionCase{"mixed_h5_d80_bs16", 5, 80, 16, {{44, 1}, {0, 70}, {529, 1}, {15, 2}}},
        AttentionCase{"mixed_h3_d96_bs32", 3, 96, 32, {{95, 1}, {100, 33}, {1, 1}, {700, 1}}},
        AttentionCase{"mixed_h2_d128_bs16", 2, 128, 16, {{1500, 1}, {0, 129}, {8, 1}, {63, 40}}},
        AttentionCase{"decode_h5_d80_bs16", 5, 80, 16, {{0, 1}, {79, 1}, {513, 1}}},
        // Grouped-query attention (Llama, Mistral, Qwen2): several query heads per KV head.
        AttentionCase{"gqa_decode_h8_kv2_d64_bs16", 8, 64, 16, {{0, 1}, {600, 1}, {31, 1}}, 2},
        AttentionCase{"gqa_prefill_h6_kv3_d128_bs16", 6, 128, 16, {{0, 70}, {20, 9}}, 3},
        AttentionCase{"gqa_mixed_h4_kv1_d64_bs32", 4, 64, 32, {{0, 40}, {700, 1}, {5, 1}}, 1}),
        ::testing::Values(Precision::kF32, Precision::kBF16, Precision::kF16),
        ::testing::Values(Precision::kF32, Precision::kBF16, Precision::kF16)),
    [](const ::testing::TestParamInfo<std::tuple<AttentionCase, Precision, Precision>>& info) {
      return std::get<0>(info.param).name + "_kv_" + precision_name(std::get<1>(info.param)) +
             "_act_" + precision_name(std::get<2>(info.param));
    });

}  // namespace
}  // namespace ltm
