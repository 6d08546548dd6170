#include "runtime/sampling/sum_exp_isa.h"

#include <cstdlib>
#include <cstring>

// The baseline's path, compiled with this unit's flags (runtime/CMakeLists.txt).
#define LTM_SUM_EXP_NS baseline
#include "runtime/sampling/sum_exp_kernel.inc"
#undef LTM_SUM_EXP_NS

namespace ltm {

int block_sum_exp_paths(BlockSumExpPath out[3]) {
  int n = 0;
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) out[n++] = {"avx512", sampler_isa::avx512::block_sum_exp};
  if (__builtin_cpu_supports("avx2")) out[n++] = {"avx2", sampler_isa::avx2::block_sum_exp};
#endif
  out[n++] = {"baseline", sampler_isa::baseline::block_sum_exp};
  return n;
}

BlockSumExpFn block_sum_exp_fn() {
  static const BlockSumExpFn chosen = [] {
    BlockSumExpPath paths[3];
    const int n = block_sum_exp_paths(paths);
    // LTM_CPU_ISA (kernels/cpu/cpu_isa.h) narrows the path; the kernels reject a bad value.
    const char* env = std::getenv("LTM_CPU_ISA");
    const char* widest = env == nullptr || *env == '\0'       ? "avx512"
                         : std::strcmp(env, "avx2") == 0     ? "avx2"
                         : std::strcmp(env, "portable") == 0 ? "baseline"
                                                              : "avx512";
    bool allowed = false;
    for (int i = 0; i < n; ++i) {
      allowed = allowed || std::strcmp(paths[i].name, widest) == 0;
      if (allowed) return paths[i].fn;
    }
    return paths[n - 1].fn;
  }();
  return chosen;
}

}  // namespace ltm
