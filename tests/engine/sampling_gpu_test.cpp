// The CUDA sampler (kernels/cuda/sampling.h, through CudaBackend::sample_rows) against the host
// sampler (sample() row by row, sample_rows_cases.h): on seeded rows of GPT-2's and Llama 3's
// vocab sizes covering greedy (with and without the logprob), temperature tiny to huge, top-k
// (1, 40, 1000, beyond the vocab), top-p alone and after top-k, the repetition penalty both ways,
// rows with thousands of exactly tied logits, rows with -inf entries and the three bad rows, in
// batches larger than one launch (64 rows). Tokens must be identical; logprobs identical or
// 1 float ulp apart (the device's double log(z) may differ from glibc's by 1 ulp of double,
// which shows in the float only on a rounding boundary); NaN where the host gives NaN. Without
// logprobs asked, the same tokens. Exits 77 (skipped) without a CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "tests/engine/sample_rows_cases.h"

namespace ltm {
namespace {

using testing::SampleBatch;

// Two batches as one (the second's history offsets moved past the first's ids).
SampleBatch concat(SampleBatch a, const SampleBatch& b) {
  const int32_t shift = static_cast<int32_t>(a.history.size());
  a.logits.insert(a.logits.end(), b.logits.begin(), b.logits.end());
  for (SampleRowParams p : b.params) {
    p.history_offset += shift;
    a.params.push_back(p);
  }
  a.history.insert(a.history.end(), b.history.begin(), b.history.end());
  return a;
}

bool within_one_ulp(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b || std::nextafter(a, b) == b;
}

void check_batch(Backend& cuda, const SampleBatch& b, const char* what) {
  std::vector<int32_t> want_tokens;
  std::vector<float> want_lp;
  testing::reference_samples(b, &want_tokens, &want_lp);
  const int32_t m = b.rows();
  DeviceBuffer logits = cuda.upload(b.logits.data(), b.logits.size() * 4, false);
  DeviceBuffer params = cuda.upload(b.params.data(), b.params.size() * sizeof(SampleRowParams),
                                    false);
  DeviceBuffer history = cuda.upload(b.history.data(), b.history.size() * 4, false);
  DeviceBuffer out = cuda.alloc(static_cast<size_t>(m) * 8);
  SampleRowsArgs a;
  a.rows = m;
  a.vocab = b.vocab;
  a.stride = b.stride;
  a.logits = logits.f32();
  a.params = static_cast<const SampleRowParams*>(params.data());
  a.history = history.i32();
  a.tokens = out.i32();
  a.logprobs = out.f32() + m;
  cuda.sample_rows(a);  // warm-up: the workspace is allocated here
  cuda.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  cuda.sample_rows(a);
  cuda.synchronize();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int32_t> tokens(m);
  std::vector<float> logprobs(m);
  cuda.copy_to_host(tokens.data(), out.data(), static_cast<size_t>(m) * 4);
  cuda.copy_to_host(logprobs.data(), out.f32() + m, static_cast<size_t>(m) * 4);
  cuda.synchronize();
  int exact_lp = 0, ulp_lp = 0;
  for (int32_t r = 0; r < m; ++r) {
    EXPECT_EQ(tokens[r], want_tokens[r]) << what << ", row " << r << " (temperature "
                                         << b.params[r].temperature << ", top_k "
                                         << b.params[r].top_k << ", top_p " << b.params[r].top_p
                                         << ", penalty " << b.params[r].repetition_penalty << ")";
    EXPECT_TRUE(within_one_ulp(logprobs[r], want_lp[r]))
        << what << ", row " << r << ": logprob " << logprobs[r] << " vs host " << want_lp[r];
    if (testing::same_float(logprobs[r], want_lp[r])) ++exact_lp;
    else ++ulp_lp;
  }
  // Without logprobs: the same tokens.
  std::vector<int32_t> only(m);
  a.logprobs = nullptr;
  cuda.fill_zero(out.data(), static_cast<size_t>(m) * 4);
  cuda.sample_rows(a);
  cuda.copy_to_host(only.data(), out.data(), static_cast<size_t>(m) * 4);
  cuda.synchronize();
  EXPECT_EQ(only, want_tokens) << what << ", without logprobs";
  std::printf("%s: %d rows of vocab %lld: tokens compared, logprobs %d exact, %d 1 ulp apart; "
              "%.3f ms per batch on the device\n",
              what, m, static_cast<long long>(b.vocab), exact_lp, ulp_lp, ms);
}

std::unique_ptr<Backend> cuda_backend() {
  std::string error;
  std::unique_ptr<Backend> b = make_cuda_backend(0, &error);
  EXPECT_NE(b, nullptr) << error;
  return b;
}

TEST(Sampling, DeviceSamplingEqualsHost) {
  std::unique_ptr<Backend> cuda = cuda_backend();
  ASSERT_NE(cuda, nullptr);
  // GPT-2's vocab in rows padded to a multiple of 64; two batches as one: more than one launch.
  check_batch(*cuda,
              concat(testing::make_sample_batch(50257, 50304, 1),
                     testing::make_sample_batch(50257, 50304, 2)),
              "vocab 50257");
  check_batch(*cuda, testing::make_sample_batch(128256, 128256, 3), "vocab 128256");
  // A small vocab: every sort in shared memory, top-k beyond it.
  check_batch(*cuda, testing::make_sample_batch(97, 97, 4), "vocab 97");
}

}  // namespace
}  // namespace ltm
