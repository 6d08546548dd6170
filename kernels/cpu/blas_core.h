// OpenBLAS's kernels made to follow LTM_CPU_ISA.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: when it loads, it picks its kernels for the CPU it
// runs on ("Cooperlake" on an AMD Zen 4, "Zen" on a Zen 3), or the core OPENBLAS_CORETYPE
// names. ltm calls it for the prefill attention's two products (kernels/cpu/attention.cpp) and
// ltm-bench's sgemm probe. So LTM_CPU_ISA=avx2 on an AVX-512 CPU forced ltm's own kernels only:
// a "forced AVX2" figure still ran those products with AVX-512 (perf of a forced-AVX2 server:
// sgemm_small_kernel_*_COOPERLAKE). When LTM_CPU_ISA asks for a narrower path than the CPU's
// widest, the first kernel call (cpu_isa.cpp) re-selects OpenBLAS's kernels as OPENBLAS_CORETYPE
// would have at load: Haswell for avx2, Prescott (SSE3) for portable. It does so through the two
// functions OpenBLAS's dynamic dispatch exports (gotoblas_dynamic_quit, gotoblas_dynamic_init),
// referenced weakly: with another BLAS (the GPU-only build's fallback) nothing changes. A user's
// own OPENBLAS_CORETYPE is left as it is.
#pragma once

#include <string>

#include "kernels/cpu/cpu_isa.h"

namespace ltm::kernels::cpu {

// The core OpenBLAS runs its kernels for ("Haswell", "SkylakeX", ...); "" where the BLAS is not
// OpenBLAS with run-time dispatch.
std::string blas_core();

// The OpenBLAS core that matches ltm's path: "Haswell" (avx2), "Prescott" (portable); nullptr for
// avx512 (OpenBLAS's own choice for the CPU).
const char* blas_core_for(Isa isa);

// Re-selects OpenBLAS's kernels: those of `core`, or with nullptr those it detects for this CPU
// (or OPENBLAS_CORETYPE names). Returns blas_core() afterwards ("" without OpenBLAS's dispatch;
// the old core where OpenBLAS does not know `core`). Not to be called while BLAS runs on another
// thread.
std::string select_blas_core(const char* core);

}  // namespace ltm::kernels::cpu
