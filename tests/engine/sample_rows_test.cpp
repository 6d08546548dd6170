// The sample op (Backend::sample_rows, runtime/sampling/sample_rows.h) on the host side: the host
// sampler over a batch (sample_rows_host), the CPU backend's op, the emulated device's op (in
// stream order: tokens read before the stream got there are poison) and Backend's default op
// (inputs copied to the host and results back) all give sample()'s token and logprob on every
// row of the shared cases (sample_rows_cases.h), whatever the thread count. The CUDA op is
// sampling_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/backend/devsim_backend.h"
#include "tests/engine/sample_rows_cases.h"

namespace ltm {
namespace {

using testing::SampleBatch;

void expect_equal(const std::vector<int32_t>& tokens, const std::vector<float>& logprobs,
                  const std::vector<int32_t>& want_tokens, const std::vector<float>& want_lp,
                  bool with_logprobs, const char* what) {
  ASSERT_EQ(tokens.size(), want_tokens.size());
  for (size_t r = 0; r < tokens.size(); ++r) {
    EXPECT_EQ(tokens[r], want_tokens[r]) << what << ", row " << r;
    if (with_logprobs) {
      EXPECT_TRUE(testing::same_float(logprobs[r], want_lp[r]))
          << what << ", row " << r << ": " << logprobs[r] << " vs " << want_lp[r];
    }
  }
}

TEST(SampleRows, HostOpEqualsSampleRowByRow) {
  const SampleBatch b = testing::make_sample_batch(1001, 1024, 5);
  std::vector<int32_t> want_tokens;
  std::vector<float> want_lp;
  testing::reference_samples(b, &want_tokens, &want_lp);
  // The cases reach every outcome: draws that differ from greedy, and the three bad rows.
  int failed = 0, distinct = 0;
  for (int32_t t : want_tokens) failed += t < 0 ? 1 : 0;
  for (size_t r = 1; r < want_tokens.size(); ++r) distinct += want_tokens[r] != want_tokens[0];
  EXPECT_EQ(failed, 3);
  EXPECT_GT(distinct, b.rows() / 2);
  for (int threads : {1, 3}) {
    std::vector<int32_t> tokens(b.rows(), -99);
    std::vector<float> logprobs(b.rows(), 7.0f);
    sample_rows_host(b.host_args(tokens.data(), logprobs.data()), threads);
    expect_equal(tokens, logprobs, want_tokens, want_lp, true, "sample_rows_host");
    // Without logprobs: the same tokens.
    std::vector<int32_t> only(b.rows(), -99);
    sample_rows_host(b.host_args(only.data(), nullptr), threads);
    EXPECT_EQ(only, want_tokens);
  }
}

// Runs `op` on a device copy of the batch through `backend`; `early` gets what a host read of the
// tokens sees before synchronize().
void run_on_backend(Backend& backend, const SampleBatch& b,
                    void (*op)(Backend&, const SampleRowsArgs&), std::vector<int32_t>* tokens,
                    std::vector<float>* logprobs, std::vector<int32_t>* early) {
  const int32_t m = b.rows();
  DeviceBuffer logits = backend.upload(b.logits.data(), b.logits.size() * 4, false);
  DeviceBuffer params =
      backend.upload(b.params.data(), b.params.size() * sizeof(SampleRowParams), false);
  DeviceBuffer history = backend.upload(b.history.data(), b.history.size() * 4, false);
  DeviceBuffer out = backend.alloc(static_cast<size_t>(m) * 8);
  SampleRowsArgs a;
  a.rows = m;
  a.vocab = b.vocab;
  a.stride = b.stride;
  a.logits = logits.f32();
  a.params = static_cast<const SampleRowParams*>(params.data());
  a.history = history.i32();
  a.tokens = out.i32();
  a.logprobs = out.f32() + m;
  op(backend, a);
  tokens->assign(m, 0);
  logprobs->assign(m, 0.0f);
  backend.copy_to_host(tokens->data(), out.data(), static_cast<size_t>(m) * 4);
  *early = *tokens;
  backend.synchronize();
  std::vector<unsigned char> staging;
  std::memcpy(logprobs->data(), backend.read_on_host(out.f32() + m, m * 4, staging), m * 4);
}

void virtual_op(Backend& backend, const SampleRowsArgs& a) { backend.sample_rows(a); }
void default_op(Backend& backend, const SampleRowsArgs& a) { backend.Backend::sample_rows(a); }

TEST(SampleRows, EveryBackendOpGivesTheHostSamplersTokens) {
  const SampleBatch b = testing::make_sample_batch(777, 780, 9);
  std::vector<int32_t> want_tokens, tokens, early;
  std::vector<float> want_lp, logprobs;
  testing::reference_samples(b, &want_tokens, &want_lp);

  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  run_on_backend(*cpu, b, virtual_op, &tokens, &logprobs, &early);
  expect_equal(tokens, logprobs, want_tokens, want_lp, true, "cpu backend");

  DevsimBackend dev(2);
  run_on_backend(dev, b, virtual_op, &tokens, &logprobs, &early);
  expect_equal(tokens, logprobs, want_tokens, want_lp, true, "devsim backend");
  // The op ran in stream order: a host read before synchronize() saw poison, not tokens.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int32_t nan_bits;
  std::memcpy(&nan_bits, &nan, 4);
  for (int32_t t : early) ASSERT_EQ(t, nan_bits) << "the devsim op ran before the stream did";

  // Backend's default (copies in, host sampler, copies back), on the emulated device's memory.
  run_on_backend(dev, b, default_op, &tokens, &logprobs, &early);
  expect_equal(tokens, logprobs, want_tokens, want_lp, true, "Backend::sample_rows default");
}

TEST(SampleRowsDeathTest, TheEmulatedDeviceRefusesHostLogits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const SampleBatch b = testing::make_sample_batch(50, 50, 1);
  DevsimBackend dev(1);
  DeviceBuffer out = dev.alloc(static_cast<size_t>(b.rows()) * 4);
  DeviceBuffer params =
      dev.upload(b.params.data(), b.params.size() * sizeof(SampleRowParams), false);
  SampleRowsArgs a = b.host_args(out.i32(), nullptr);
  a.params = static_cast<const SampleRowParams*>(params.data());
  a.history = nullptr;
  EXPECT_DEATH(dev.sample_rows(a), "sample_rows was handed .*not device memory");
}

}  // namespace
}  // namespace ltm
