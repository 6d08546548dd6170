// GF/s of the CPU matmul libraries on ltm's shapes (issue 9 item 2): our packed_gemm (fp32 and
// bf16 weights), OpenBLAS (sgemv at m = 1, as kernels/cpu/gemm.cpp does; sgemm otherwise;
// sbgemm if the library has it), oneDNN matmul (fp32 weights; bf16 weights, with whatever source
// type this oneDNN accepts beside them), BLIS (native bli_sgemm, so no cblas symbol clash with
// OpenBLAS) and a hand-written Highway dot-product GEMV at m = 1 (fp32 and bf16 weights).
//
// C[m, n] = A[m, k] @ W, W [k, n]. Every library gets W in the layout it prefers, prepared once
// outside the timing (ours: packed panels; oneDNN: the primitive's weights_desc, reordered once;
// the primitive itself created once per shape and m and reused). Weights are cold: each library
// rotates over copies of its W that together exceed LIB_COLD_MB (default 600, above this VM's
// 480 MiB L3), unless LIB_WARM is set. Libraries alternate within each round and the median of
// LIB_ROUNDS (default 5) rounds is reported, with the ratio to our fp32 packed_gemm in the same
// run (the machine is shared and noisy: compare ratios, not absolute numbers across runs).
//
// Not a ctest. Needs libdnnl-dev libblis-dev libhwy-dev (apt-get). Build by hand (-march=native
// for the Highway GEMV's static dispatch; our kernels keep their run-time dispatch):
//   cmake --build build -j2 --target ltm_kernels_cpu
//   g++ -O2 -march=native -DHWY_COMPILE_ONLY_STATIC=1 -fopenmp -I. \
//     tests/kernels/matmul_libraries_bench.cpp build/kernels/libltm_kernels_cpu.a \
//     -lspdlog -lfmt -ldnnl -lhwy \
//     $(pkg-config --cflags --libs /usr/lib/x86_64-linux-gnu/openblas-openmp/pkgconfig/openblas.pc) \
//     /usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4 \
//     -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp:/usr/lib/x86_64-linux-gnu/blis-openmp \
//     -o /tmp/mlb
//   /tmp/mlb [m ...]     LIB_THREADS=1,2  LIB_SHAPES=qkv,fc,fc2,lmhead,qkv4096  LIB_ROUNDS=5
// OpenBLAS comes before BLIS on the link line, so cblas_* resolve to OpenBLAS (checked at start
// with dladdr); BLIS is called only through bli_sgemm.
#include <blis.h>  // declares the cblas_* functions too (BLIS's cblas.h): no OpenBLAS cblas.h
#include <dlfcn.h>
#include <omp.h>

#include <hwy/highway.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/weight_type.h"

extern "C" char* openblas_get_config(void);  // OpenBLAS's, declared by hand (see above)

namespace kc = ltm::kernels::cpu;
namespace hn = hwy::HWY_NAMESPACE;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool selected(const char* env, const std::string& name) {
  const char* v = std::getenv(env);
  if (v == nullptr) return true;
  return (std::string(",") + v + ",").find("," + name + ",") != std::string::npos;
}

// y[n] = x[k] . Wt[j, :] for Wt [n, k] row-major (one dot product per output), fp32 weights.
void hwy_gemv_f32(const float* x, const float* wt, float* y, int64_t n, int64_t k, int threads) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t j = 0; j < n; ++j) {
    const float* w = wt + j * k;
    auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    int64_t p = 0;
    for (; p + 4 * L <= k; p += 4 * L) {
      a0 = hn::MulAdd(hn::LoadU(d, x + p), hn::LoadU(d, w + p), a0);
      a1 = hn::MulAdd(hn::LoadU(d, x + p + L), hn::LoadU(d, w + p + L), a1);
      a2 = hn::MulAdd(hn::LoadU(d, x + p + 2 * L), hn::LoadU(d, w + p + 2 * L), a2);
      a3 = hn::MulAdd(hn::LoadU(d, x + p + 3 * L), hn::LoadU(d, w + p + 3 * L), a3);
    }
    for (; p + L <= k; p += L) a0 = hn::MulAdd(hn::LoadU(d, x + p), hn::LoadU(d, w + p), a0);
    float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
    for (; p < k; ++p) s += x[p] * w[p];
    y[j] = s;
  }
}

// The same with bf16 weights, widened to fp32 (PromoteTo) as read.
void hwy_gemv_bf16(const float* x, const hwy::bfloat16_t* wt, float* y, int64_t n, int64_t k,
                   int threads) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::bfloat16_t, decltype(d)> dbf;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t j = 0; j < n; ++j) {
    const hwy::bfloat16_t* w = wt + j * k;
    auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    int64_t p = 0;
    for (; p + 4 * L <= k; p += 4 * L) {
      a0 = hn::MulAdd(hn::LoadU(d, x + p), hn::PromoteTo(d, hn::LoadU(dbf, w + p)), a0);
      a1 = hn::MulAdd(hn::LoadU(d, x + p + L), hn::PromoteTo(d, hn::LoadU(dbf, w + p + L)), a1);
      a2 = hn::MulAdd(hn::LoadU(d, x + p + 2 * L), hn::PromoteTo(d, hn::LoadU(dbf, w + p + 2 * L)), a2);
      a3 = hn::MulAdd(hn::LoadU(d, x + p + 3 * L), hn::PromoteTo(d, hn::LoadU(dbf, w + p + 3 * L)), a3);
    }
    float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
    for (; p < k; ++p) s += x[p] * hwy::F32FromBF16(w[p]);
    y[j] = s;
  }
}

struct Shape {
  int64_t n, k;
  bool transposed;  // W = E^T of a row-major E [n, k] (the LM head)
  const char* name;
};

// One library's way of computing C = A @ W for a fixed (shape, m): `run(copy)` uses copy
// `copy` of its weights.
struct Lib {
  std::string name;
  std::function<void(size_t copy)> run;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {1, 8, 32, 64, 512};
  std::vector<int> thread_counts;
  {
    std::string t = std::getenv("LIB_THREADS") ? std::getenv("LIB_THREADS") : "1,2";
    for (size_t p = 0; p < t.size();) {
      thread_counts.push_back(std::atoi(t.c_str() + p));
      p = t.find(',', p);
      if (p == std::string::npos) break;
      ++p;
    }
  }
  const int rounds = std::getenv("LIB_ROUNDS") ? std::atoi(std::getenv("LIB_ROUNDS")) : 5;
  const size_t cold = static_cast<size_t>(std::getenv("LIB_COLD_MB") ? std::atoll(std::getenv("LIB_COLD_MB")) : 600) << 20;
  const bool warm = std::getenv("LIB_WARM") != nullptr;
  const Shape shapes[] = {{2304, 768, false, "qkv"},   {3072, 768, false, "fc"},
                          {768, 3072, false, "fc2"},   {50257, 768, true, "lmhead"},
                          {12288, 4096, false, "qkv4096"}};

  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&cblas_sgemm), &info);
  std::printf("cblas_sgemm from %s; %s\n", info.dli_fname ? info.dli_fname : "?", openblas_get_config());
  const bool have_sbgemm = dlsym(RTLD_DEFAULT, "cblas_sbgemm") != nullptr;
  std::printf("OpenBLAS sbgemm: %s; our kernels: %s; Highway target: %s; oneDNN %d.%d.%d\n",
              have_sbgemm ? "present" : "absent (not built with BUILD_BFLOAT16)", kc::isa_name(),
              hwy::TargetName(HWY_TARGET), dnnl_version()->major, dnnl_version()->minor,
              dnnl_version()->patch);
  bli_init();
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  bool printed_dnnl_bf16 = false;

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape& s : shapes) {
    if (!selected("LIB_SHAPES", s.name)) continue;
    const int64_t n = s.n, k = s.k;
    const size_t sz = static_cast<size_t>(n) * k;
    const size_t copies = warm ? 1 : std::max<size_t>(1, cold / (sz * 4) + 1);
    // The source weights in checkpoint layout: W [k, n] (E [n, k] for the LM head), and their
    // transposes for the dot-product GEMV ([n, k]).
    std::vector<float> w(sz * copies);
    for (auto& x : w) x = u(rng);
    std::vector<float> wt;  // [n, k] per copy, for Highway
    std::vector<hwy::bfloat16_t> wt16;
    std::vector<unsigned char> p32(kc::packed_bytes(k, n, kc::WeightType::kF32) * copies);
    std::vector<unsigned char> p16(kc::packed_bytes(k, n, kc::WeightType::kBF16) * copies);
    const size_t b32 = kc::packed_bytes(k, n, kc::WeightType::kF32);
    const size_t b16 = kc::packed_bytes(k, n, kc::WeightType::kBF16);
    for (size_t c = 0; c < copies; ++c) {
      const float* src = w.data() + c * sz;
      if (s.transposed) {
        kc::pack_weight_transposed_rows(src, 0, n, n, k, kc::WeightType::kF32, p32.data() + c * b32);
        kc::pack_weight_transposed_rows(src, 0, n, n, k, kc::WeightType::kBF16, p16.data() + c * b16);
      } else {
        kc::pack_weight_rows(src, 0, k, k, n, kc::WeightType::kF32, p32.data() + c * b32);
        kc::pack_weight_rows(src, 0, k, k, n, kc::WeightType::kBF16, p16.data() + c * b16);
      }
    }
    const bool want_hwy = std::find(ms.begin(), ms.end(), 1) != ms.end();
    if (want_hwy) {
      wt.resize(sz * copies);
      wt16.resize(sz * copies);
      for (size_t c = 0; c < copies; ++c)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t p = 0; p < k; ++p) {
            const float x = s.transposed ? w[c * sz + j * k + p] : w[c * sz + p * n + j];
            wt[c * sz + j * k + p] = x;
            wt16[c * sz + j * k + p] = hwy::BF16FromF32(kc::bf16_to_f32(kc::f32_to_bf16(x)));
          }
    }
    for (int m : ms) {
      std::vector<float> a(static_cast<size_t>(m) * k), c(static_cast<size_t>(m) * n);
      for (auto& x : a) x = u(rng);
      const double flop = 2.0 * m * n * k;
      // oneDNN: one primitive per weight type for this (shape, m), weights reordered once into
      // the primitive's preferred layout.
      const dnnl::memory::desc a_md({m, k}, dt::f32, tag::ab), c_md({m, n}, dt::f32, tag::ab);
      const dnnl::memory::desc w_user_md({k, n}, dt::f32, s.transposed ? tag::ba : tag::ab);
      auto make_pd = [&](dt src_type, dt wei_type) {
        const dnnl::memory::desc src_md({m, k}, src_type, tag::ab);
        const dnnl::memory::desc w_any({k, n}, wei_type, tag::any);
        return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, w_any, c_md), eng);
      };
      dnnl::matmul::primitive_desc pd32 = make_pd(dt::f32, dt::f32);
      dnnl::matmul::primitive_desc pd16;
      dt bf16_src = dt::f32;
      try {
        pd16 = make_pd(dt::f32, dt::bf16);  // fp32 activations, bf16 weights
      } catch (const dnnl::error&) {
        bf16_src = dt::bf16;  // this oneDNN needs bf16 activations beside bf16 weights
        pd16 = make_pd(dt::bf16, dt::bf16);
      }
      if (!printed_dnnl_bf16) {
        std::printf("oneDNN bf16 weights: %s activations (%s); fp32: %s\n",
                    bf16_src == dt::f32 ? "fp32" : "bf16 (A rounded to bf16 per call, timed)",
                    pd16.impl_info_str(), pd32.impl_info_str());
        printed_dnnl_bf16 = true;
      }
      dnnl::matmul prim32(pd32), prim16(pd16);
      std::vector<dnnl::memory> w32m, w16m;
      for (size_t cp = 0; cp < copies; ++cp) {
        dnnl::memory user(w_user_md, eng, w.data() + cp * sz);
        w32m.emplace_back(pd32.weights_desc(), eng);
        w16m.emplace_back(pd16.weights_desc(), eng);
        dnnl::reorder(user, w32m.back()).execute(strm, user, w32m.back());
        dnnl::reorder(user, w16m.back()).execute(strm, user, w16m.back());
      }
      strm.wait();
      dnnl::memory a_mem(a_md, eng, a.data()), c_mem(c_md, eng, c.data());
      dnnl::memory a16_mem(dnnl::memory::desc({m, k}, dt::bf16, tag::ab), eng);
      dnnl::reorder a_to_bf16(a_mem, a16_mem);

      for (int threads : thread_counts) {
        std::vector<Lib> libs;
        libs.push_back({"ours-f32", [&](size_t cp) {
                          kc::packed_gemm(a.data(), p32.data() + cp * b32, kc::WeightType::kF32,
                                          c.data(), m, n, k, 0.0f);
                        }});
        libs.push_back({"ours-bf16", [&](size_t cp) {
                          kc::packed_gemm(a.data(), p16.data() + cp * b16, kc::WeightType::kBF16,
                                          c.data(), m, n, k, 0.0f);
                        }});
        libs.push_back({m == 1 ? "openblas-sgemv" : "openblas-sgemm", [&](size_t cp) {
                          kc::gemm(a.data(), w.data() + cp * sz, c.data(), m, n, k, s.transposed,
                                   0.0f);
                        }});
        libs.push_back({"onednn-f32", [&](size_t cp) {
                          prim32.execute(strm, {{DNNL_ARG_SRC, a_mem},
                                                {DNNL_ARG_WEIGHTS, w32m[cp]},
                                                {DNNL_ARG_DST, c_mem}});
                          strm.wait();
                        }});
        libs.push_back({"onednn-bf16", [&](size_t cp) {
                          if (bf16_src == dt::bf16) a_to_bf16.execute(strm, a_mem, a16_mem);
                          prim16.execute(strm, {{DNNL_ARG_SRC, bf16_src == dt::bf16 ? a16_mem : a_mem},
                                                {DNNL_ARG_WEIGHTS, w16m[cp]},
                                                {DNNL_ARG_DST, c_mem}});
                          strm.wait();
                        }});
        libs.push_back({"blis-sgemm", [&](size_t cp) {
                          float one = 1.0f, zero = 0.0f;
                          const float* b = w.data() + cp * sz;
                          // W [k, n]: row stride n; for the LM head W = E^T: row stride 1,
                          // column stride k.
                          bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one,
                                    const_cast<float*>(a.data()), k, 1, const_cast<float*>(b),
                                    s.transposed ? 1 : n, s.transposed ? k : 1, &zero, c.data(),
                                    n, 1);
                        }});
        if (m == 1) {
          libs.push_back({"hwy-gemv-f32", [&](size_t cp) {
                            hwy_gemv_f32(a.data(), wt.data() + cp * sz, c.data(), n, k, threads);
                          }});
          libs.push_back({"hwy-gemv-bf16", [&](size_t cp) {
                            hwy_gemv_bf16(a.data(), wt16.data() + cp * sz, c.data(), n, k, threads);
                          }});
        }
        kc::set_blas_threads(threads);
        omp_set_num_threads(threads);
        bli_thread_set_num_threads(threads);
        const int reps = std::max(3, static_cast<int>(1e9 / flop / 4));
        std::vector<std::vector<double>> t(libs.size());
        for (auto& l : libs) l.run(0);  // warm-up: primitive JIT, thread pools
        for (int r = 0; r < rounds; ++r)
          for (size_t i = 0; i < libs.size(); ++i) {
            const double t0 = now();
            for (int rep = 0; rep < reps; ++rep) libs[i].run(rep % copies);
            t[i].push_back((now() - t0) / reps);
          }
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        const double ref = flop / median(t[0]) * 1e-9;
        std::printf("%-8s m=%-3d n=%-5lld k=%-4lld thr=%d", s.name, m, static_cast<long long>(n),
                    static_cast<long long>(k), threads);
        for (size_t i = 0; i < libs.size(); ++i) {
          const double g = flop / median(t[i]) * 1e-9;
          std::printf(" | %s %.1f x%.2f", libs[i].name.c_str(), g, g / ref);
        }
        std::printf("  GF/s\n");
        std::fflush(stdout);
      }
    }
  }
}
