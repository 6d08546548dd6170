#include "launcher/bench_limits.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/machine_probe.h"

namespace ltm {
namespace {

// OpenBLAS sgemm FLOP/s on square 2048 matrices, best of 3 (kept beside the FMA rate: ltm-plan
// and scripts/plan_vs_bench model prefill with it).
double measure_sgemm_peak(int threads) {
  const int64_t m = 2048;
  std::vector<float> a(m * m, 0.5f), b(m * m, 0.25f), c(m * m);
  omp_set_num_threads(threads);
  kernels::cpu::set_blas_threads(threads);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::cpu::gemm(a.data(), b.data(), c.data(), m, m, m, false, 0.0f);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * m * m * m / s);
  }
  return best;
}

}  // namespace

void MachineLimits::measure(bool with_sgemm) {
  isa = kernels::cpu::isa_name();
  read_rounds.push_back(kernels::cpu::measure_read_bandwidth(threads));
  reset_peak_resident();
  fma_rounds.push_back(kernels::cpu::measure_fma_peak(threads));
  read_bytes_per_s = std::max(read_bytes_per_s, read_rounds.back());
  fma_flops = std::max(fma_flops, fma_rounds.back());
  bf16_dot_flops = std::max(bf16_dot_flops, kernels::cpu::measure_bf16_dot_peak(threads));
  if (with_sgemm) sgemm_flops = std::max(sgemm_flops, measure_sgemm_peak(threads));
}

ComputeRoof compute_roof(const MachineLimits& limits, const std::string& weight_dtype,
                         int64_t rows) {
  namespace k = kernels::cpu;
  if (weight_dtype == "int8") return {0, "none measured (int8 dot products)"};
  if (weight_dtype == "bf16" && rows >= k::kAmxMinRows && k::amx_enabled())
    return {0, "none measured (AMX tiles)"};
  if (weight_dtype == "bf16" && rows >= k::kAmxMinRows && k::dpbf16_enabled() &&
      limits.bf16_dot_flops > 0)
    return {limits.bf16_dot_flops, "bf16-dot"};
  return {limits.fma_flops, "fma"};
}

void reset_peak_resident() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

}  // namespace ltm
