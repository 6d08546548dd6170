// kernels/cpu/machine_probe.h: the loops behind ltm-bench's limits do the work they count (no
// timing is asserted: the rates themselves are the benchmark's to print).
#include "kernels/cpu/machine_probe.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/probe_kernels.h"
#include "tests/kernels/isa_param.h"

namespace ltm::kernels::cpu {
namespace {

class MachineProbe : public IsaTest {};

std::vector<uint64_t> words(size_t n) {
  std::vector<uint64_t> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = (i + 1) * 0x9e3779b97f4a7c15ull ^ (i << 17);
  return w;
}

uint64_t xor_all(const uint64_t* w, size_t n) {
  uint64_t r = 0;
  for (size_t i = 0; i < n; ++i) r ^= w[i];
  return r;
}

TEST_P(MachineProbe, ReadFoldReadsEveryWordOnce) {
  // Sizes around the 256/512-byte blocks and the stream split, with tails of every length; a
  // word skipped or read twice (XOR cancels) changes the fold.
  const std::vector<uint64_t> w = words(1 << 13);
  for (size_t n : {0, 1, 7, 31, 32, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4095, 8192})
    for (int streams : {1, 2, 4})
      for (size_t offset : {0, 1, 3})  // unaligned starts too
        if (offset + n <= w.size()) {
          EXPECT_EQ(read_fold(GetParam(), w.data() + offset, 8 * n, streams),
                    xor_all(w.data() + offset, n))
              << "words " << n << " streams " << streams << " offset " << offset;
        }
}

TEST_P(MachineProbe, ReadFoldRejectsBadArguments) {
  const std::vector<uint64_t> w = words(16);
  EXPECT_THROW(read_fold(GetParam(), w.data(), 12, 1), std::invalid_argument);
  EXPECT_THROW(read_fold(GetParam(), w.data(), 64, 3), std::invalid_argument);
}

// The chains' recurrence one lane at a time: std::fma where the path fuses, a rounded product
// then a sum on the portable path.
float expected_chain_sum(Isa path, int chains, int64_t iters) {
  float sum = 0;
  for (int k = 0; k < chains; ++k) {
    float acc = 0.5f + static_cast<float>(k) / 64.0f;
    for (int64_t i = 0; i < iters; ++i) {
      if (path == Isa::kPortable) {
        volatile float product = acc * probe::kMul;  // rounded on its own, as the path does
        acc = product + probe::kAdd;
      } else {
        acc = std::fma(acc, probe::kMul, probe::kAdd);
      }
    }
    sum += acc;
  }
  return sum;
}

TEST_P(MachineProbe, FmaChainsDoTheStepsTheyCount) {
  const Isa path = GetParam();
  const int chains = path == Isa::kAvx512 ? 16 : path == Isa::kAvx2 ? 12 : 8;
  const int lanes = path == Isa::kAvx512 ? 16 : path == Isa::kAvx2 ? 8 : 4;
  for (int64_t iters : {1, 2, 100, 1001}) {
    const FmaRun r = fma_chains(path, iters);
    EXPECT_DOUBLE_EQ(r.flops, 2.0 * iters * chains * lanes) << iters;
    // Each step moves every chain (0.999^1001 is far from the fixed point), so a step skipped
    // or repeated changes the sum.
    EXPECT_EQ(r.sum, expected_chain_sum(path, chains, iters)) << iters;
  }
}

TEST(MachineProbeBf16, DotChainsDoTheStepsTheyCount) {
  if (!bf16_dot_measurable()) {
    EXPECT_EQ(bf16_dot_chains(10).flops, 0.0);
    EXPECT_EQ(measure_bf16_dot_peak(1, 1), 0.0);
    GTEST_SKIP() << "no AVX512-BF16 on the AVX-512 path here";
  }
  for (int64_t iters : {1, 3, 1000}) {
    const FmaRun r = bf16_dot_chains(iters);
    EXPECT_DOUBLE_EQ(r.flops, 4.0 * iters * 16 * 16) << iters;
    // Chain k starts at k and gains 2 x 2^-7 x 2^-7 a step: exact in fp32 at these sizes.
    const float per_chain = static_cast<float>(iters) * 2.0f / 16384.0f;
    float expected = 0;
    for (int k = 0; k < 16; ++k) expected += static_cast<float>(k) + per_chain;
    EXPECT_EQ(r.sum, expected) << iters;
  }
}

TEST(MachineProbeBuffer, ReadBufferIsBeyondTheLastLevelCache) {
  EXPECT_GE(read_probe_bytes(), size_t{1} << 30);
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc > 0) {
    EXPECT_GE(read_probe_bytes(), 8 * static_cast<size_t>(llc));
  }
}

LTM_INSTANTIATE_ISA_TESTS(MachineProbe);

}  // namespace
}  // namespace ltm::kernels::cpu
