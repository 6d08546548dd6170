// What a draft row costs, from the scheduler's own decode steps: speculative decoding's
// DraftLength weighs a draft at token_cost(B), one more row's seconds against a sequence's share
// of a step of B sequences (proposer.h). The scheduler feeds it every step that only decodes (one
// row per sequence plus its drafts) with its rows and seconds.
//
// Robust to a shared machine: step times are noise on top of a cost (a descheduled thread, a page
// fault: never faster than the work), so each size of step keeps a low quantile of its times, not
// a mean: a streaming estimate that steps toward each time, down by at most kDown of itself and
// up by at most kUp, which settles about where a third of the times fall below it (kUp / (kUp +
// kDown)). A step of 10x moves it by kUp; a size counts from its second step, starting from the
// lower of its first two (the first is often a cold one: kernels and buffers first touched).
// Sizes are bucketed (1..32 rows each its own, then eight buckets a doubling), and a + b x rows
// is fitted through the buckets'
// estimates, weighted by how recently each was seen (a floor keeps an old bucket as an anchor, so
// that a run of steps of one size, when nothing drafts, keeps the slope last seen instead of
// losing it). Then token_cost(B) = b B / (a + b B), with the line fitted through the sizes near
// those a step of B sequences with drafts has (B / 2 to 4 B rows, where two are known; else all):
// it tends to 1 as the batch grows, where each row costs as much as the weights' read that the
// rows share.
#pragma once

#include <array>
#include <cstdint>

namespace ltm {

class DraftCostModel {
 public:
  static constexpr double kDown = 0.20, kUp = 0.10;  // the quantile's steps (a third)
  static constexpr double kDecay = 0.98;             // bucket weights, per step observed
  static constexpr double kFloor = 0.02;             // an old bucket's weight, at least
  // Ready after this many steps with two sizes seen kSeenToTrust times each: a short run (a
  // one-shot of 96 tokens) must not settle on two unlucky first steps of a size, for then it may
  // stop drafting and not see that size again for a long time.
  static constexpr int64_t kMinObservations = 16;
  static constexpr int64_t kSeenToTrust = 4;

  // One step that only decodes: `rows` rows in all (sequences + their drafts), `s` seconds.
  void observe(int32_t rows, double s);
  // kMinObservations steps seen, two sizes of step kSeenToTrust times among them (a slope).
  bool ready() const;
  // One more draft row's cost against a sequence's share of a step of `batch` sequences, in
  // [0.01, 1]; `fallback` while not ready.
  double token_cost(int32_t batch, double fallback) const;
  // The fitted line (seconds): for tests and tools.
  double fixed_s() const;
  double per_row_s() const;

  static int bucket_of(int32_t rows);
  static constexpr int kExact = 32;                // 1..32 rows: a bucket each
  static constexpr int kBuckets = kExact + 8 * 10;  // up to 32 x 2^10 rows

 private:
  struct Bucket {
    double seconds = 0;  // the low quantile of its steps' times
    double rows = 0;     // the mean rows of its steps
    double weight = 0;
    int64_t seen = 0;  // steps; a size counts from its second (the lower of the first two)
  };
  // a + b x rows through the sizes seen twice whose mean rows are in [lo, hi].
  void fit(double* a, double* b, double lo = 0, double hi = 1e30) const;
  int sizes_within(double lo, double hi) const;
  std::array<Bucket, kBuckets> buckets_{};
  int64_t n_ = 0;
};

}  // namespace ltm
