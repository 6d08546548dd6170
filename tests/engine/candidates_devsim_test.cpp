// The backend's candidate op (Backend::select_candidates, runtime/sampling/sample_rows.h) on the
// emulated device: a tp > 1 last stage's rank selects each row's candidates where its logits lie
// and copies back only them. Over tp 2 and 3 slices of seeded batches (every sampling case of
// sample_rows_cases.h: greedy, temperature, top-k, top-p, repetition penalty, bad rows), the
// device's output equals the CPU backend's byte for byte, the candidates of all ranks sample the
// token sample() draws on the whole row (logprob to rounding, as sampler.h states), and the one
// copy back is the candidates' size: 24 bytes for a greedy row, 16 + 8 k for a top-k row with
// k < valid / 2, never more than 16 + 4 x valid (the slice).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/backend/devsim_backend.h"
#include "runtime/sampling/sample_rows.h"
#include "runtime/sampling/sampler.h"
#include "tests/engine/sample_rows_cases.h"

namespace ltm {
namespace {

struct SliceResult {
  std::vector<unsigned char> out;  // what came back
  size_t copies_back = 0, bytes_back = 0;
};

// Rank `rank`'s slice [begin, begin + valid) of every row, through `backend`'s op.
SliceResult run_slice(Backend& backend, const testing::SampleBatch& b, int64_t begin,
                      int64_t valid) {
  auto* dev = dynamic_cast<DevsimBackend*>(&backend);
  DeviceBuffer logits = backend.upload(b.logits.data(), b.logits.size() * sizeof(float), true);
  DeviceBuffer params = backend.upload(b.params.data(), b.params.size() * sizeof(SampleRowParams), true);
  DeviceBuffer history = backend.upload(b.history.data(), b.history.size() * sizeof(int32_t), true);
  const size_t bytes = static_cast<size_t>(candidate_rows_bytes(b.params.data(), b.rows(), valid));
  DeviceBuffer out = backend.alloc(bytes);
  CandidateRowsArgs a;
  a.rows = b.rows();
  a.valid = valid;
  a.stride = b.stride;
  a.id_begin = static_cast<int32_t>(begin);
  a.logits = logits.f32() + begin;
  a.params = static_cast<const SampleRowParams*>(params.data());
  a.history = history.i32();
  a.out = out.data();
  backend.select_candidates(a);
  const DevsimBackend::CopyCounts before = dev ? dev->copy_counts() : DevsimBackend::CopyCounts{};
  std::vector<unsigned char> staging;
  const auto* got = static_cast<const unsigned char*>(backend.read_on_host(out.data(), bytes, staging));
  SliceResult r;
  r.out.assign(got, got + bytes);
  if (dev) {
    r.copies_back = dev->copy_counts().d2h - before.d2h;
    r.bytes_back = dev->copy_counts().d2h_bytes - before.d2h_bytes;
  }
  return r;
}

void check(const testing::SampleBatch& b, int tp) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  std::unique_ptr<Backend> dev = make_devsim_backend(1);
  const int64_t per = (b.vocab + tp - 1) / tp;
  std::vector<std::vector<CandidateSet>> sets(b.rows(), std::vector<CandidateSet>(tp));
  for (int rank = 0; rank < tp; ++rank) {
    const int64_t begin = rank * per, valid = std::min<int64_t>(per, b.vocab - begin);
    const SliceResult want = run_slice(*cpu, b, begin, valid);
    const SliceResult got = run_slice(*dev, b, begin, valid);
    ASSERT_EQ(got.out.size(), want.out.size());
    EXPECT_EQ(0, std::memcmp(got.out.data(), want.out.data(), want.out.size()))
        << "tp " << tp << " rank " << rank << ": the device's candidates differ from the CPU's";
    // One copy back, of the candidates: not the [rows, valid] slice.
    EXPECT_EQ(got.copies_back, 1u);
    EXPECT_EQ(got.bytes_back, got.out.size());
    size_t slice_bytes = 0;
    for (int32_t r = 0; r < b.rows(); ++r) {
      const SampleRowParams& p = b.params[r];
      const int64_t row = candidate_row_bytes(p, valid);
      EXPECT_LE(row, (4 * valid + 7) / 8 * 8) << "row " << r << " copies back more than its slice";
      if (p.temperature == 0.0f) {
        EXPECT_EQ(row, 8) << "row " << r;
      }
      if (p.temperature != 0.0f && p.top_k > 0 && 2 * p.top_k < valid) {
        EXPECT_EQ(row, 8 * p.top_k) << "row " << r;
      }
      slice_bytes += static_cast<size_t>(4 * valid);
      read_candidate_row(got.out.data(), b.params.data(), b.rows(), valid,
                         static_cast<int32_t>(begin), r, &sets[r][rank]);
    }
    EXPECT_LT(got.bytes_back, slice_bytes) << "tp " << tp << " rank " << rank;
  }
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  testing::reference_samples(b, &tokens, &logprobs);
  for (int32_t r = 0; r < b.rows(); ++r) {
    const SampleRowParams& rp = b.params[r];
    SamplingParams p;
    p.temperature = rp.temperature;
    p.top_k = rp.top_k;
    p.top_p = rp.top_p;
    p.repetition_penalty = rp.repetition_penalty;
    p.seed = rp.seed;
    Rng rng = Rng::for_step(rp.seed, rp.token_index);
    const SampleResult s = sample_from_candidate_sets(sets[r], p, rng);
    EXPECT_EQ(s.token, tokens[r]) << "tp " << tp << ", row " << r;
    if (s.ok() && std::isfinite(logprobs[r])) {
      EXPECT_NEAR(s.logprob, logprobs[r], 1e-5 + 1e-6 * std::fabs(logprobs[r]))
          << "tp " << tp << ", row " << r;
    }
  }
}

TEST(CandidatesDevsim, TheDeviceSelectsTheCpusCandidatesAndCopiesBackOnlyThem) {
  const testing::SampleBatch b = testing::make_sample_batch(1001, 1024, 31);
  check(b, 2);
  check(b, 3);
}

}  // namespace
}  // namespace ltm
