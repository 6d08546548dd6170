// Side-by-side OpenBLAS sgemm (row-major B) and packed_gemm (B packed into panels, as the CPU
// backend holds weights) on every kernel path this CPU supports (cpu_isa.h), GPT-2-124M shapes.
// The paths alternate within each round, so the ratios are robust to a noisy machine. Not a
// ctest; build by hand against the kernels library of a build tree (here build-isa):
//   cmake --build build-isa -j2 --target ltm_kernels_cpu
//   g++ -O2 -march=x86-64-v2 -fopenmp -I. tests/kernels/packed_gemm_bench.cpp \
//     build-isa/kernels/libltm_kernels_cpu.a -lspdlog -lfmt \
//     $(pkg-config --cflags --libs /usr/lib/x86_64-linux-gnu/openblas-openmp/pkgconfig/openblas.pc) \
//     -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -o /tmp/skb
//   OMP_NUM_THREADS=2 /tmp/skb [m ...]        (SKB_ISA=avx2,portable: only those paths)
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

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {4, 8, 16, 32, 64};
  struct Shape { int n, k; bool t; const char* name; };
  const Shape shapes[] = {{2304, 768, false, "qkv"}, {768, 768, false, "proj"},
                          {3072, 768, false, "fc"},  {768, 3072, false, "fc2"},
                          {50257, 768, true, "lmhead"}};
  namespace kc = ltm::kernels::cpu;
  std::vector<kc::Isa> isas;
  for (kc::Isa i : kc::supported_isas())
    if (!std::getenv("SKB_ISA") || std::string(std::getenv("SKB_ISA")).find(kc::isa_name(i)) !=
                                       std::string::npos)
      isas.push_back(i);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::printf("threads=%d %s B\n", openblas_get_num_threads(), std::getenv("SKB_WARM") ? "warm" : "cold");
  for (const Shape& s : shapes) {
    // Cold B, as in decoding (the whole model is far larger than L3): rotate over copies of B
    // that together exceed the L3 cache, unless SKB_WARM is set.
    const size_t sz = static_cast<size_t>(s.n) * s.k;
    const size_t copies = std::getenv("SKB_WARM") ? 1 : std::max<size_t>(1, (96u << 20) / (sz * 4) + 1);
    std::vector<float> bs(sz * copies);
    for (auto& x : bs) x = u(rng);
    const size_t psz = ltm::kernels::cpu::packed_floats(s.k, s.n);
    std::vector<float> ps(psz * copies);
    for (size_t i = 0; i < copies; ++i) {
      if (s.t)
        ltm::kernels::cpu::pack_weight_transposed(bs.data() + i * sz, s.n, s.k, ps.data() + i * psz);
      else
        ltm::kernels::cpu::pack_weight(bs.data() + i * sz, s.k, s.n, ps.data() + i * psz);
    }
    for (int m : ms) {
      std::vector<float> a(static_cast<size_t>(m) * s.k), c(static_cast<size_t>(m) * s.n);
      for (auto& x : a) x = u(rng);
      const double flop = 2.0 * m * s.n * s.k;
      const int reps = std::max(3, static_cast<int>(2e9 / flop / 4));
      std::vector<double> tb;
      std::vector<std::vector<double>> tp(isas.size());
      for (int round = 0; round < 7; ++round) {
        double t0 = now();
        for (int r = 0; r < reps; ++r)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, s.t ? CblasTrans : CblasNoTrans, m, s.n, s.k,
                      1.0f, a.data(), s.k, bs.data() + (r % copies) * sz, s.t ? s.k : s.n, 0.0f,
                      c.data(), s.n);
        tb.push_back((now() - t0) / reps);
        for (size_t i = 0; i < isas.size(); ++i) {
          kc::set_isa(isas[i]);
          t0 = now();
          for (int r = 0; r < reps; ++r)
            kc::packed_gemm(a.data(), ps.data() + (r % copies) * psz, c.data(), m, s.n, s.k, 0.0f);
          tp[i].push_back((now() - t0) / reps);
        }
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double gb = flop / median(tb) * 1e-9;
      std::printf("%-7s m=%-3d n=%-6d k=%-5d openblas %6.1f", s.name, m, s.n, s.k, gb);
      for (size_t i = 0; i < isas.size(); ++i) {
        const double gp = flop / median(tp[i]) * 1e-9;
        std::printf(" | %s %6.1f x%.2f", kc::isa_name(isas[i]), gp, gp / gb);
      }
      std::printf("  GF/s\n");
      std::fflush(stdout);
    }
  }
}
