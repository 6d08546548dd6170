// ltm-bench's limits (docs/operations.md, "ltm-bench"): the machine's rates, measured in the same
// run as the figures they judge (kernels/cpu/machine_probe.h), and the model's work per token
// (runtime/model/flop_count.h), so each measured rate is printed beside the limit it cannot pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model/model_config.h"

namespace ltm {

// The probes of one run; each measure() adds one round of every probe. The limits are the best
// round's: the machine is shared, and a limit measured low would let a benchmark "beat" it.
struct MachineLimits {
  int threads = 1;
  std::string isa;                       // the path the FMA probe ran (LTM_CPU_ISA honoured)
  std::vector<double> read_rounds;       // bytes/s, each round's best
  std::vector<double> fma_rounds;        // FLOP/s
  double read_bytes_per_s = 0, fma_flops = 0, bf16_dot_flops = 0, sgemm_flops = 0;
  void measure(bool with_sgemm);
};

// Which compute rate bounds the GEMMs of `weight_dtype` weights at `rows` rows (tokens a step):
// the FMA rate, or the bf16 dot rate where vdpbf16ps runs them; 0 with a reason where the kernels
// use units the probes do not measure (AMX tiles, int8 dot products).
struct ComputeRoof {
  double flops = 0;
  const char* name = "";  // "fma", "bf16-dot", or why there is none
};
ComputeRoof compute_roof(const MachineLimits& limits, const std::string& weight_dtype,
                         int64_t rows);

// Writes "5" to /proc/self/clear_refs: VmHWM (peak_resident_bytes) restarts from the current
// resident set, so the read probe's buffer (unmapped again) does not count as the model's peak.
void reset_peak_resident();

}  // namespace ltm
