// Decode steps replayed from CUDA graphs (runtime/model/decode_graphs.h, the CUDA backend's
// capture/replay) against the same steps run eagerly on the GPU (exit 77, skipped, without a
// device). A small random model, three sequences prefilled eagerly, then decode steps over
// changing sets of them (buckets 4, 2, 4, 1, 4), in f32, in bf16 weights with a bf16 cache and in
// int8 weights with an fp16 cache:
//  - the first step run twice: its replay over the same inputs gives the logits of the capture's
//    eager run bit for bit (the graph is the eager step, recorded);
//  - steps whose batch fills its bucket (2 and 1 sequences) give the eager step's logits bit for
//    bit (same shapes, same kernels; the attention split hint of a graph changes nothing for a
//    sequence, see decode_graphs.h);
//  - padded steps (3 sequences in a bucket of 4): cuBLAS may pick another algorithm for 4 rows
//    than for 3, so within 1e-4 of the largest logit (f32) and 3e-2 (bf16 weights, activations
//    and cache: a different rounding of any 16-bit activation propagates; 3% is the whole-model
//    bf16 tolerance of model_cuda_gpu_test);
// and each step's max |graph - eager| is printed. 3 graphs are captured, 3 replays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "runtime/backend/backend.h"
#include "tests/model/decode_graph_steps.h"

namespace ltm {
namespace {

std::unique_ptr<Backend> cuda() {
  std::string error;
  std::unique_ptr<Backend> b = make_cuda_backend(0, &error);
  EXPECT_NE(b, nullptr) << error;
  return b;
}

void check_replays(Precision weights, Precision kv, float tolerance) {
  std::unique_ptr<Backend> eager_backend = cuda();
  std::unique_ptr<Backend> graph_backend = cuda();
  ASSERT_TRUE(eager_backend && graph_backend);
  ASSERT_TRUE(graph_backend->supports_graphs());
  const DecodeRun eager = run_decode(*eager_backend, false, weights, kv);
  const DecodeRun got = run_decode(*graph_backend, true, weights, kv, /*repeat_first=*/true);
  EXPECT_EQ(got.graphs, 3) << "buckets 4, 2 and 1";
  EXPECT_EQ(got.replays, 3) << "the repeated first step, and steps 3 and 5";
  ASSERT_EQ(got.logits.size(), eager.logits.size() + 1);
  // The first step twice: captured (run eagerly), then replayed over the same inputs.
  ASSERT_EQ(got.logits[0].size(), got.logits[1].size());
  EXPECT_EQ(0, std::memcmp(got.logits[0].data(), got.logits[1].data(),
                           got.logits[0].size() * sizeof(float)))
      << "the replay of a step differs from its capture's eager run";
  const std::vector<std::vector<int>>& steps = decode_steps();
  for (size_t k = 0; k < eager.logits.size(); ++k) {
    const std::vector<float>& want = eager.logits[k];
    const std::vector<float>& have = got.logits[k + 1];
    ASSERT_EQ(have.size(), want.size());
    float max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(have[i])) << "step " << k << " logit " << i;
      max_diff = std::max(max_diff, std::fabs(have[i] - want[i]));
      max_abs = std::max(max_abs, std::fabs(want[i]));
    }
    const int n = static_cast<int>(steps[k].size());
    const bool full = n == 1 || n == 2;  // the batch fills its bucket
    std::printf("%s weights, %s cache: decode step %zu (%d sequences): max |graph - eager| %g "
                "(largest logit %g)\n", precision_name(weights), precision_name(kv), k, n,
                max_diff, max_abs);
    if (full) {
      EXPECT_EQ(0, std::memcmp(have.data(), want.data(), want.size() * sizeof(float)))
          << "step " << k << ": a graph of a full bucket differs from the eager step";
    } else {
      EXPECT_LE(max_diff, tolerance * max_abs) << "step " << k;
    }
  }
}

TEST(Graphs, GraphReplayEqualsEagerF32) {
  check_replays(Precision::kF32, Precision::kF32, 1e-4f);
}

TEST(Graphs, GraphReplayEqualsEagerBf16) {
  check_replays(Precision::kBF16, Precision::kBF16, 3e-2f);
}

// int8 weights (fp16 activations and cache): decode steps of up to 16 rows run the
// weight-streaming kernel, whose rows do not depend on each other.
TEST(Graphs, GraphReplayEqualsEagerInt8) {
  check_replays(Precision::kInt8, Precision::kF16, 3e-2f);
}

}  // namespace
}  // namespace ltm
