// Side-by-side OpenBLAS sgemm (row-major B) and packed_gemm (B packed into panels, as the CPU
// backend holds weights) with fp32, bf16, fp16 and int8 weights, on every kernel path this CPU
// supports (cpu_isa.h), GPT-2-124M shapes. The paths and weight types alternate within each
// round, so the ratios are robust to a noisy machine; "x" after a packed path is its ratio to
// OpenBLAS (f32) or to the same path's f32 kernel (bf16, f16). Not a ctest; build by hand
// against the kernels library of a build tree (scripts/build makes build/):
//   cmake --build build -j2 --target ltm_kernels_cpu
//   g++ -O2 -march=x86-64-v2 -fopenmp -I. tests/kernels/packed_gemm_bench.cpp \
//     build/kernels/libltm_kernels_cpu.a -lspdlog -lfmt \
//     $(pkg-config --cflags --libs /usr/lib/x86_64-linux-gnu/openblas-openmp/pkgconfig/openblas.pc) \
//     -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -o /tmp/skb
//   OMP_NUM_THREADS=2 /tmp/skb [m ...]
// SKB_ISA=avx2,portable: only those paths; SKB_TYPES=f32,bf16,int8: only those weight types;
// SKB_SHAPES=qkv,fc2: only those shapes; SKB_ROUNDS=n (default 7); SKB_WARM: B stays in cache;
// SKB_COLD_MB=n: the int8 copies of B rotated over (default 96; more than the L3 for cold B);
// SKB_D=d, SKB_VOCAB=v: another model's shapes (d = 256, v = 4096: models/kjv-small's).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <string>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/weight_type.h"

namespace {
bool selected(const char* env, const char* name) {
  const char* v = std::getenv(env);
  if (v == nullptr) return true;
  std::string list = std::string(",") + v + ",";
  return list.find(std::string(",") + name + ",") != std::string::npos;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {4, 8, 16, 32, 64};
  struct Shape { int n, k; bool t; const char* name; };
  const int d = std::getenv("SKB_D") ? std::atoi(std::getenv("SKB_D")) : 768;
  const int vocab = std::getenv("SKB_VOCAB") ? std::atoi(std::getenv("SKB_VOCAB")) : 50257;
  const Shape shapes[] = {{3 * d, d, false, "qkv"}, {d, d, false, "proj"},
                          {4 * d, d, false, "fc"},  {d, 4 * d, false, "fc2"},
                          {vocab, d, true, "lmhead"}};
  namespace kc = ltm::kernels::cpu;
  std::vector<kc::Isa> isas;
  for (kc::Isa i : kc::supported_isas())
    if (!std::getenv("SKB_ISA") || std::string(std::getenv("SKB_ISA")).find(kc::isa_name(i)) !=
                                       std::string::npos)
      isas.push_back(i);
  std::vector<kc::WeightType> types;
  for (kc::WeightType t : {kc::WeightType::kF32, kc::WeightType::kBF16, kc::WeightType::kF16,
                           kc::WeightType::kInt8})
    if (selected("SKB_TYPES", kc::weight_type_name(t))) types.push_back(t);
  const int rounds = std::getenv("SKB_ROUNDS") ? std::atoi(std::getenv("SKB_ROUNDS")) : 7;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::printf("threads=%d %s B\n", openblas_get_num_threads(), std::getenv("SKB_WARM") ? "warm" : "cold");
  for (const Shape& s : shapes) {
    if (!selected("SKB_SHAPES", s.name)) continue;
    // Cold B, as in decoding (the whole model is far larger than L3): rotate over copies of B
    // that together exceed the L3 cache, unless SKB_WARM is set. Every type gets the same
    // number of copies, enough that the int8 ones (about a byte a weight) come to SKB_COLD_MB:
    // counted in fp32 bytes, int8's quarter-size copies fitted in a 32 MiB L3.
    const size_t sz = static_cast<size_t>(s.n) * s.k;
    const size_t cold_bytes = (std::getenv("SKB_COLD_MB") ? std::atoll(std::getenv("SKB_COLD_MB")) : 96) << 20;
    const size_t copies = std::getenv("SKB_WARM") ? 1 : std::max<size_t>(1, cold_bytes / sz + 1);
    std::vector<float> bs(sz * copies);
    for (auto& x : bs) x = u(rng);
    // Page-aligned, as the CPU backend holds its packed weights (CpuBackend::alloc_zeroed).
    struct Aligned {
      unsigned char* p = nullptr;
      Aligned() = default;
      Aligned(const Aligned&) = delete;
      ~Aligned() { std::free(p); }
      void resize(size_t n) { p = static_cast<unsigned char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)); }
      unsigned char* data() const { return p; }
    };
    std::vector<Aligned> ps(types.size());
    std::vector<size_t> pbytes(types.size());
    for (size_t ti = 0; ti < types.size(); ++ti) {
      pbytes[ti] = kc::packed_bytes(s.k, s.n, types[ti]);
      ps[ti].resize(pbytes[ti] * copies);
      for (size_t i = 0; i < copies; ++i) {
        if (s.t)
          kc::pack_weight_transposed_rows(bs.data() + i * sz, 0, s.n, s.n, s.k, types[ti],
                                          ps[ti].data() + i * pbytes[ti]);
        else
          kc::pack_weight_rows(bs.data() + i * sz, 0, s.k, s.k, s.n, types[ti],
                               ps[ti].data() + i * pbytes[ti]);
      }
    }
    for (int m : ms) {
      std::vector<float> a(static_cast<size_t>(m) * s.k + 16), c(static_cast<size_t>(m) * s.n + 16);
      for (auto& x : a) x = u(rng);
      const double flop = 2.0 * m * s.n * s.k;
      const int reps = std::max(3, static_cast<int>(2e9 / flop / 4));
      std::vector<double> tb;
      std::vector<std::vector<std::vector<double>>> tp(
          isas.size(), std::vector<std::vector<double>>(types.size()));
      for (int round = 0; round < rounds; ++round) {
        double t0 = now();
        for (int r = 0; r < reps; ++r)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, s.t ? CblasTrans : CblasNoTrans, m, s.n, s.k,
                      1.0f, a.data(), s.k, bs.data() + (r % copies) * sz, s.t ? s.k : s.n, 0.0f,
                      c.data(), s.n);
        tb.push_back((now() - t0) / reps);
        for (size_t i = 0; i < isas.size(); ++i) {
          kc::set_isa(isas[i]);
          for (size_t ti = 0; ti < types.size(); ++ti) {
            t0 = now();
            for (int r = 0; r < reps; ++r)
              kc::packed_gemm(a.data(), ps[ti].data() + (r % copies) * pbytes[ti], types[ti],
                              c.data(), m, s.n, s.k, 0.0f);
            tp[i][ti].push_back((now() - t0) / reps);
          }
        }
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double gb = flop / median(tb) * 1e-9;
      std::printf("%-7s m=%-3d n=%-6d k=%-5d openblas %6.1f", s.name, m, s.n, s.k, gb);
      for (size_t i = 0; i < isas.size(); ++i) {
        std::printf(" | %s", kc::isa_name(isas[i]));
        double g32 = 0.0;
        for (size_t ti = 0; ti < types.size(); ++ti) {
          const double gp = flop / median(tp[i][ti]) * 1e-9;
          if (types[ti] == kc::WeightType::kF32) {
            g32 = gp;
            std::printf(" f32 %6.1f x%.2f", gp, gp / gb);
          } else {
            std::printf(" %s %6.1f", kc::weight_type_name(types[ti]), gp);
            if (g32 > 0.0) std::printf(" x%.2f", gp / g32);
          }
        }
      }
      std::printf("  GF/s\n");
      std::fflush(stdout);
    }
  }
}
