// The machine's limits for the CPU kernels, measured by loops that do nothing else: the rate at
// which the cores read memory, and the rate of their fused multiply-adds on the ISA the kernels
// run with (cpu_isa.h: LTM_CPU_ISA=avx2 measures 8-lane FMAs on an AVX-512 machine). ltm-bench
// and scripts/bench_serve print their figures beside these (docs/operations.md, "ltm-bench").
//
// Read rate: `threads` threads (OpenMP), each reading its own contiguous part of one buffer of
// read_probe_bytes() (at least 1 GiB and 8x the last-level cache, first touched by the thread
// that reads it) with the ISA's widest loads into eight independent XOR accumulators, walking
// its part as 1, 2 and 4 concurrent streams; every pass is timed whole and the best bytes/s is
// the result. The buffer is unmapped before the call returns.
// FMA rate: `threads` threads each running independent chains of FMAs (acc = acc * m + a) held
// in registers, 12 chains of 8 lanes on AVX2, 16 of 16 on AVX-512, 8 of 4 on the portable path
// (a multiply and an add: that path's baseline has no FMA); 2 FLOPs a lane a step; best pass.
// bf16 dot rate: the same with vdpbf16ps (16 lanes, 2 products and 2 adds each: 4 FLOPs), where
// the AVX-512 path runs on a CPU with AVX512-BF16; AMX tiles are not measured.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace ltm::kernels::cpu {

// XOR of the 64-bit words of [p, p + bytes) (bytes a multiple of 8), read by `isa`'s loop
// with `streams` (1, 2 or 4) parts walked at once: the same value on every path.
uint64_t read_fold(Isa isa, const void* p, size_t bytes, int streams);

// One thread's FMA chains: `iters` steps of each; flops = iters x chains x lanes x 2, sum = the
// chains' first lanes added (what keeps the work, and what the tests check).
struct FmaRun {
  double flops = 0;
  float sum = 0;
};
FmaRun fma_chains(Isa isa, int64_t iters);
// vdpbf16ps chains (4 FLOPs a lane a step); {0, 0} unless bf16_dot_measurable().
FmaRun bf16_dot_chains(int64_t iters);
// Whether the bf16 dot rate applies: the AVX-512 path in use on a CPU with AVX512-BF16.
bool bf16_dot_measurable();

// Bytes of the read probe's buffer: max(1 GiB, 8 x the last-level cache).
size_t read_probe_bytes();

// Best bytes/s over `passes` passes of each stream count (see above).
double measure_read_bandwidth(int threads, int passes = 2);
// Best FLOP/s of `threads` threads over `passes` passes of fma_chains(isa(), ...).
double measure_fma_peak(int threads, int passes = 3);
// Best FLOP/s of bf16_dot_chains; 0 when !bf16_dot_measurable().
double measure_bf16_dot_peak(int threads, int passes = 3);

}  // namespace ltm::kernels::cpu
