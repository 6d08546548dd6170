// Sampled drafts (--speculative draft at temperature > 0): the draft model draws each proposal
// from its own distribution q, and the target accepts it by the standard rejection-sampling rule
// (Leviathan et al. 2023, Chen et al. 2023), which keeps the target's distribution p exactly:
//
//   accept draft x with probability min(1, p(x) / q(x)); on the first rejection emit a token drawn
//   from norm(max(0, p - q)); if every draft is accepted, the bonus token is drawn from p.
//
// P(emit y) = q(y) min(1, p(y)/q(y)) + P(reject) * max(0, p(y) - q(y)) / Z, where
// q(y) min(1, p(y)/q(y)) = min(p(y), q(y)), P(reject) = 1 - sum_x min(p(x), q(x)) = Z (the sum of
// max(0, p - q)), so P(emit y) = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y).
//
// The random numbers: each is a pure function of the request's seed and the index n of the token
// it decides (tokens generated before it), from streams of their own, so a seeded run is
// reproducible and no draw is shared with the target's sampler (Rng::for_step):
//   draft_rng(seed, n)   the draft's proposal for token n: one uniform, inverse CDF of q in id order;
//   verify_rng(seed, n)  the acceptance of that proposal: its first uniform u (accept iff
//                        u q(x) < p(x)); on rejection its second uniform draws the residual.
// Token n's draws are used only while the context before n is what it will stay (an earlier
// rejection ends a step), and that context is a function of the draws of tokens < n only; so a
// stream drawn again for n at a later step (its draft thrown away with a rejection before it) is
// still independent of everything that decided the context, and each token's law given its context
// is p. (runtime/spec/proposer.h has the whole argument, docs/architecture.md "Speculative
// decoding" the summary.)
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/sampling/sampler.h"

namespace ltm {

Rng draft_rng(uint64_t seed, int32_t token_index);
Rng verify_rng(uint64_t seed, int32_t token_index);

// The token whose cumulative weight (in id order) first exceeds u x sum(weights), u in [0, 1);
// weights >= 0 with a positive sum (else -1). The last token with positive weight when rounding
// leaves u x sum past the end.
int32_t draw_from_weights(std::span<const float> weights, double u);

struct DraftVerdict {
  int32_t token = -1;     // the token emitted at this row: the draft, or the residual's draw
  bool accepted = false;  // token is the draft
};

// The rule for one drafted row: p the target's processed distribution at the row
// (processed_probabilities: temperature, top-k, top-p, repetition penalty), q the draft's from
// which `draft` was drawn (q[draft] > 0), rng the row's verify_rng. Uses one uniform, and a second
// on rejection. Where max(0, p - q) has no mass left after rounding (p and q agree but for it),
// the residual falls back to p.
DraftVerdict verify_sampled_draft(std::span<const float> p, std::span<const float> q,
                                  int32_t draft, Rng& rng);

}  // namespace ltm
