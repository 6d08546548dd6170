#include "kernels/cpu/machine_probe.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/probe_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#define LTM_PROBE_X86 1
#endif

namespace ltm::kernels::cpu {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int chains_of(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return probe::kAvx512Chains;
    case Isa::kAvx2: return probe::kAvx2Chains;
    default: return probe::kPortableChains;
  }
}
int lanes_of(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return probe::kAvx512Lanes;
    case Isa::kAvx2: return probe::kAvx2Lanes;
    default: return probe::kPortableLanes;
  }
}

// Steps of a chain loop that take about `seconds` on one thread, from a short timed run.
template <typename Run>
int64_t calibrate(Run run, double seconds) {
  int64_t iters = 1 << 14;
  for (;;) {
    const auto t0 = Clock::now();
    run(iters);
    const double s = since(t0);
    if (s > 0.005 || iters >= (int64_t{1} << 34))
      return std::max<int64_t>(1, static_cast<int64_t>(iters * seconds / std::max(s, 1e-9)));
    iters *= 4;
  }
}

// Best FLOP/s of `threads` threads each running run(iters) (which returns an FmaRun).
template <typename Run>
double best_rate(int threads, int passes, Run run) {
  const int64_t iters = calibrate(run, 0.05);
  volatile float sink = 0;
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    double flops = 0;
    float sum = 0;
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops, sum)
    {
      const FmaRun r = run(iters);
      flops += r.flops;
      sum += r.sum;
    }
    const double s = since(t0);
    sink = sink + sum;
    best = std::max(best, flops / s);
  }
  return best;
}

}  // namespace

uint64_t read_fold(Isa isa, const void* p, size_t bytes, int streams) {
  if (bytes % 8 != 0) throw std::invalid_argument("read_fold: bytes must be a multiple of 8");
  if (streams != 1 && streams != 2 && streams != 4)
    throw std::invalid_argument("read_fold: streams must be 1, 2 or 4");
  switch (isa) {
#ifdef LTM_PROBE_X86
    case Isa::kAvx512: return probe::avx512::read_fold(p, bytes, streams);
    case Isa::kAvx2: return probe::avx2::read_fold(p, bytes, streams);
#endif
    default: return probe::portable::read_fold(p, bytes, streams);
  }
}

FmaRun fma_chains(Isa isa, int64_t iters) {
  FmaRun r;
  r.flops = 2.0 * static_cast<double>(iters) * chains_of(isa) * lanes_of(isa);
  switch (isa) {
#ifdef LTM_PROBE_X86
    case Isa::kAvx512: r.sum = probe::avx512::fma_chains(iters); break;
    case Isa::kAvx2: r.sum = probe::avx2::fma_chains(iters); break;
#endif
    default: r.sum = probe::portable::fma_chains(iters); break;
  }
  return r;
}

bool bf16_dot_measurable() {
#ifdef LTM_PROBE_X86
  // The CPU's flag itself: dpbf16_available() is false where AMX takes bf16 GEMMs instead.
  static const bool has_bf16 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return isa() == Isa::kAvx512 && has_bf16;
#else
  return false;
#endif
}

FmaRun bf16_dot_chains(int64_t iters) {
  FmaRun r;
#ifdef LTM_PROBE_X86
  if (!bf16_dot_measurable()) return r;
  r.flops = 4.0 * static_cast<double>(iters) * probe::kBf16Chains * 16;
  r.sum = probe::avx512bf16::dot_chains(iters);
#else
  (void)iters;
#endif
  return r;
}

size_t read_probe_bytes() {
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = 32l << 20;
  return std::max<size_t>(size_t{1} << 30, 8 * static_cast<size_t>(llc));
}

double measure_read_bandwidth(int threads, int passes) {
  threads = std::max(1, threads);
  const Isa path = isa();
  // Each thread's part a multiple of 4 KiB, so every part starts on its own page.
  const size_t per_thread = read_probe_bytes() / threads / 4096 * 4096;
  const size_t bytes = per_thread * threads;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0;
  auto* buf = static_cast<char*>(mem);
#pragma omp parallel num_threads(threads)
  {
    // Each thread touches (and so places) the pages it will read.
    auto* w = reinterpret_cast<uint64_t*>(buf + per_thread * omp_get_thread_num());
    for (size_t i = 0; i < per_thread / 8; ++i) w[i] = i * 0x9e3779b97f4a7c15ull;
  }
  double best = 0;
  uint64_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (int streams : {1, 2, 4}) {
      uint64_t folded = 0;
      const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(^ : folded)
      folded ^= read_fold(path, buf + per_thread * omp_get_thread_num(), per_thread, streams);
      best = std::max(best, static_cast<double>(bytes) / since(t0));
      sink ^= folded;
    }
  }
  munmap(mem, bytes);
  volatile uint64_t keep = sink;  // the reads have a use
  (void)keep;
  return best;
}

double measure_fma_peak(int threads, int passes) {
  const Isa path = isa();
  return best_rate(std::max(1, threads), passes,
                   [path](int64_t iters) { return fma_chains(path, iters); });
}

double measure_bf16_dot_peak(int threads, int passes) {
  if (!bf16_dot_measurable()) return 0;
  return best_rate(std::max(1, threads), passes, [](int64_t iters) { return bf16_dot_chains(iters); });
}

}  // namespace ltm::kernels::cpu
