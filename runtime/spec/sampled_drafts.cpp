#include "runtime/spec/sampled_drafts.h"

#include <algorithm>
#include <vector>

#include "common/check.h"

namespace ltm {

namespace {

// Streams of their own: the seed is mixed with a constant before Rng::for_token, whose streams
// the engine does not use (it samples with Rng::for_step).
constexpr uint64_t kDraftStream = 0x6472616674ull;    // "draft"
constexpr uint64_t kVerifyStream = 0x766572696679ull; // "verify"

}  // namespace

Rng draft_rng(uint64_t seed, int32_t token_index) {
  return Rng::for_token(seed ^ kDraftStream, token_index);
}

Rng verify_rng(uint64_t seed, int32_t token_index) {
  return Rng::for_token(seed ^ kVerifyStream, token_index);
}

int32_t draw_from_weights(std::span<const float> weights, double u) {
  double total = 0;
  int32_t last = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] > 0) {
      total += weights[i];
      last = static_cast<int32_t>(i);
    }
  }
  if (last < 0 || !(total > 0)) return -1;
  const double target = u * total;
  double acc = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0)) continue;
    acc += weights[i];
    if (target < acc) return static_cast<int32_t>(i);
  }
  return last;
}

DraftVerdict verify_sampled_draft(std::span<const float> p, std::span<const float> q,
                                  int32_t draft, Rng& rng) {
  LTM_ASSERT(p.size() == q.size() && draft >= 0 && static_cast<size_t>(draft) < p.size(),
             "verify_sampled_draft: bad arguments");
  const double px = p[static_cast<size_t>(draft)], qx = q[static_cast<size_t>(draft)];
  const double u = rng.uniform();
  if (u * qx < px) return {draft, true};  // probability min(1, p(x) / q(x))
  std::vector<float> residual(p.size());
  for (size_t i = 0; i < p.size(); ++i) residual[i] = std::max(0.0f, p[i] - q[i]);
  const double v = rng.uniform();
  int32_t token = draw_from_weights(residual, v);
  if (token < 0) token = draw_from_weights(p, v);  // no residual mass left after rounding
  return {token, false};
}

}  // namespace ltm
