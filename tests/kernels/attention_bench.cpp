// Decode attention alone (paged_attention, attention.h): a batch of decode rows, one per sequence,
// GPT-2-124M's heads (12 x 64), blocks of 16 rows dealt to the sequences from a shuffled pool as a
// long-running server's would be, the caches on 2 MiB pages as the worker maps them. Each round
// runs every layer once, its own caches (12 layers: with GPT-2's 32 x 32..96 contexts, 85 MB of
// fp16 K and V, more than the L3: the caches come from memory as in serving); it prints the
// median and best microseconds a layer and the median's rate over the K and V bytes read. Not a
// ctest; build by hand against the kernels library of a build tree (scripts/build makes build/):
//   cmake --build build -j2 --target ltm_kernels_cpu
//   g++ -O2 -std=c++20 -march=x86-64-v2 -fopenmp -I. tests/kernels/attention_bench.cpp \
//     build/kernels/libltm_kernels_cpu.a -lspdlog -lfmt \
//     $(pkg-config --cflags --libs /usr/lib/x86_64-linux-gnu/openblas-openmp/pkgconfig/openblas.pc) \
//     -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -o /tmp/attn
//   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=active /tmp/attn [seqs [min_ctx [max_ctx [rounds]]]]
// (defaults 32 32 96 60). AB_F32=1: fp32 caches (default fp16); AB_LAYERS=n (default 12) and
// AB_POOL=blocks a layer (default 1024): AB_LAYERS=1 AB_POOL=192 keeps the caches in the L3.
// LTM_CPU_ISA picks the path. Compare two builds by alternating their binaries, never against a
// figure from another run (docs/benchmarks.md).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/weight_type.h"

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}
// n elements on 2 MiB-aligned memory advised MADV_HUGEPAGE (as CpuBackend::alloc_kv_cache);
// never freed: the process ends after the measurement.
template <typename T>
T* huge_pages(size_t n) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = (n * sizeof(T) + kHuge - 1) / kHuge * kHuge;
  void* p = mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  char* at = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1));
  madvise(at, bytes, MADV_HUGEPAGE);
  return reinterpret_cast<T*>(at);
}
}  // namespace

int main(int argc, char** argv) {
  namespace kc = ltm::kernels::cpu;
  const int n_seqs = argc > 1 ? std::atoi(argv[1]) : 32;
  const int min_ctx = argc > 2 ? std::atoi(argv[2]) : 32;
  const int max_ctx = argc > 3 ? std::atoi(argv[3]) : 96;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 60;
  const int n_head = 12, head_dim = 64, block_size = 16;
  const int layers = env_int("AB_LAYERS", 12), pool = env_int("AB_POOL", 1024);
  const bool f32 = std::getenv("AB_F32") != nullptr;
  if (n_seqs < 1 || min_ctx < 1 || max_ctx < min_ctx || rounds < 1 || layers < 1) {
    std::fprintf(stderr, "usage: attention_bench [seqs [min_ctx [max_ctx [rounds]]]]\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::vector<int32_t> ctx(n_seqs), offsets(n_seqs + 1);
  int max_blocks = 0;
  for (int s = 0; s < n_seqs; ++s) {
    ctx[s] = min_ctx + static_cast<int>(rng() % (max_ctx - min_ctx + 1));
    offsets[s] = s;
    max_blocks = std::max(max_blocks, (ctx[s] + block_size - 1) / block_size);
  }
  offsets[n_seqs] = n_seqs;
  if (pool < n_seqs * max_blocks) {
    std::fprintf(stderr, "AB_POOL=%d: at least %d blocks needed\n", pool, n_seqs * max_blocks);
    return 2;
  }
  std::vector<int32_t> shuffled(pool);
  for (int i = 0; i < pool; ++i) shuffled[i] = i;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(n_seqs) * max_blocks);
  for (size_t i = 0; i < table.size(); ++i) table[i] = shuffled[i];
  const size_t layer_elems = static_cast<size_t>(pool) * n_head * block_size * head_dim;
  const size_t elems = layer_elems * layers;
  const size_t elem_bytes = f32 ? 4 : 2;
  char* k_cache = huge_pages<char>(elems * elem_bytes);
  char* v_cache = huge_pages<char>(elems * elem_bytes);
  for (char* cache : {k_cache, v_cache})
    for (size_t i = 0; i < elems; ++i) {
      const float x = static_cast<float>(rng() & 0xffff) / 65536.0f - 0.5f;
      if (f32)
        reinterpret_cast<float*>(cache)[i] = x;
      else
        reinterpret_cast<uint16_t*>(cache)[i] = kc::f32_to_f16(x);
    }
  std::vector<float> qkv(static_cast<size_t>(n_seqs) * 3 * n_head * head_dim);
  for (float& x : qkv) x = static_cast<float>(rng() & 0xffff) / 65536.0f - 0.5f;
  std::vector<float> out(static_cast<size_t>(n_seqs) * n_head * head_dim);
  kc::PagedAttentionShape shape{n_seqs,         n_head,     head_dim,    block_size, max_blocks,
                                offsets.data(), ctx.data(), table.data()};
  shape.kv_type = f32 ? kc::WeightType::kF32 : kc::WeightType::kF16;
  double bytes = 0.0;  // K and V read a layer
  for (int c : ctx) bytes += 2.0 * c * n_head * head_dim * elem_bytes;
  std::vector<double> per_layer;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = now();
    for (int l = 0; l < layers; ++l)
      kc::paged_attention(shape, qkv.data(), k_cache + l * layer_elems * elem_bytes,
                          v_cache + l * layer_elems * elem_bytes, out.data());
    per_layer.push_back((now() - t0) / layers);
  }
  std::sort(per_layer.begin(), per_layer.end());
  const double median = per_layer[per_layer.size() / 2];
  double check = 0.0;  // the same for two builds with the same sums
  for (size_t i = 0; i < out.size(); ++i) check += out[i] * static_cast<double>(i % 7 + 1);
  std::printf("%s caches, %d sequences, contexts %d-%d, %d layers: median %.1f us a layer, best "
              "%.1f, %.1f GB/s (median); check %.6f\n",
              f32 ? "fp32" : "fp16", n_seqs, min_ctx, max_ctx, layers, median * 1e6,
              per_layer.front() * 1e6, bytes / median / 1e9, check);
  return 0;
}
