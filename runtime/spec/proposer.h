// Speculative decoding: proposers guess the tokens that follow a sequence, the target model
// checks the guesses in one forward step (runtime/sched/scheduler_spec.cpp), and DraftLength
// picks how many to guess from how many were accepted so far.
//
// Why the output is exactly the target's (docs/architecture.md, "Speculative decoding"): a
// sequence with drafts d_0..d_{k-1} runs k + 1 rows in one step (its last token and the drafts),
// row i sampled as an ordinary token of index g + i with its own random stream (seed, g + i).
// (This paragraph is deterministic proposals; sampled drafts are the next one.)
// Row i is used only while every draft before it was accepted, so its context is then exactly the
// sequence's; d_i is accepted iff row i's sample equals it. For a deterministic proposal (a draft
// is a function of the tokens so far: prompt lookup, a greedy draft model) this is the standard
// rejection-sampling rule: with q = the point mass on x, accept x with probability
// min(1, p(x) / q(x)) = p(x), and on rejection draw from norm(max(0, p - q)) = p with x removed
// and renormalised. Drawing y ~ p and accepting iff y = x gives the same joint law: P(out = x,
// accepted) = p(x), and for y != x, P(out = y) = p(y) = (1 - p(x)) * p(y) / (1 - p(x)). Greedy
// (p one-hot on the argmax) accepts iff the draft is the argmax. A random stream (seed, n) whose
// row was thrown away (an earlier draft was rejected) is drawn again for token n at the next
// step: the throw-away was decided by the streams of earlier tokens only, so the new draw is
// still independent of everything that decided the context. Hence every kept token is the token
// non-speculative decoding draws with the same stream: greedy and sampled output alike are
// those of `--speculative off` (up to the rounding of a k + 1-row step against a 1-row one).
//
// Sampled drafts (a draft model at temperature > 0: runtime/spec/sampled_drafts.h) are not a
// function of the tokens so far: draft x_i is drawn from the draft's own distribution q_i with the
// stream draft_rng(seed, g + i), and q_i comes back with it (DraftRequest::probs). Rank 0 then
// decides row i itself from the row's whole logits: with p_i the target's processed distribution
// there, accept x_i iff u q_i(x_i) < p_i(x_i), u the first uniform of verify_rng(seed, g + i)
// (probability min(1, p/q)); on rejection emit a draw from norm(max(0, p_i - q_i)) with its second
// uniform and end the step; after k acceptances the bonus row k is the engine's draw from p_k, as
// above. P(emit y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x min(p(x), q(x))) max(0, p(y) - q(y)) / Z
// = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y), since Z = sum max(0, p - q) = 1 - sum min(p, q).
// The uniforms: token n's draws (draft_rng, verify_rng, and the engine's for_step stream for a
// bonus or a step without drafts) are pure functions of (seed, n) and are used only while the
// context before n is final, a function of the draws of tokens < n; a stream drawn again for n
// (its draft thrown away behind an earlier rejection) is still independent of that context, so
// each emitted token's law given its context is p and the output's is exactly the target's. It is
// not `off`'s token for token (an accepted draft is the draft's draw), and which token comes from
// which stream depends on the draft lengths: the scheduler picks them for sampled drafts without
// timings (Proposer::parameters), so a seed gives the same tokens run to run. With q one-hot the
// rule is the point-mass rule above, which greedy requests and prompt lookup keep.
// Threading: a Proposer is used by one thread (the scheduler's step thread); DraftLength is a
// value.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/sampling/sampler.h"

namespace ltm {

enum class SpecMode { kOff, kNgram, kDraft };
const char* spec_mode_name(SpecMode m);
// "off" | "ngram" | "draft"; InvalidArgument naming the flag otherwise.
absl::StatusOr<SpecMode> parse_spec_mode(const std::string& s);

// One sequence's share of Proposer::propose_all.
struct DraftRequest {
  uint64_t seq_id = 0;  // the scheduler's id of the sequence: what a stateful proposer keys by
  std::span<const int32_t> tokens;  // prompt + generated so far
  int32_t n_prompt = 0;
  int32_t max_tokens = 0;
  std::vector<int32_t>* out = nullptr;  // the guesses are appended here
  // Sampled drafts (runtime/spec/sampled_drafts.h): with `probs` set and a temperature > 0 in
  // `sampling`, a proposer that has a distribution (DraftModelProposer) draws guess i from it
  // with draft_rng(sampling->seed, token_index + i) and appends that distribution q, vocab_size
  // floats, to *probs for each guess; the scheduler then verifies by the rule for a sampled q.
  // A proposer that leaves *probs empty proposed deterministically (a point mass: prompt lookup,
  // a greedy draft), verified as such.
  const SamplingParams* sampling = nullptr;
  int32_t token_index = 0;  // tokens generated before the first guess
  std::vector<float>* probs = nullptr;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Appends up to `max_tokens` guesses of the tokens that follow `tokens` (prompt + generated so
  // far, `n_prompt` of them the prompt) to *out; fewer, or none, when it has no good guess.
  virtual void propose(std::span<const int32_t> tokens, int32_t n_prompt, int32_t max_tokens,
                       std::vector<int32_t>* out) = 0;
  // The guesses of every sequence that decodes in this step, at once (a draft model runs them as
  // one batch per draft token: DraftModelProposer). The default: propose() for each.
  virtual void propose_all(std::span<const DraftRequest> requests);
  // Sequence `seq_id` has ended (finished, cancelled, failed): whatever the proposer keeps for
  // it can go. The default keeps nothing.
  virtual void release(uint64_t seq_id) { (void)seq_id; }
  // What one more draft costs the proposer for one sequence, in seconds, as measured so far (0:
  // next to nothing, as prompt lookup's). The scheduler adds it, against a step's time, to the
  // cost DraftLength weighs a draft at, so drafts that cost more than they save stop.
  virtual double seconds_per_draft() const { return 0; }
  // The proposer's model's parameters (0: no model). For sampled drafts the scheduler weighs a
  // draft at this over the target's parameters instead of the seconds measured, so that the draft
  // lengths, and with them a seeded run's tokens, do not depend on timings.
  virtual int64_t parameters() const { return 0; }
  // Whether a guess costs next to nothing and leaves no state behind (prompt lookup). The
  // scheduler then asks for max_tokens guesses at every step of every decoding sequence, drafts
  // only their first k, and checks all of them against the tokens that come
  // (DraftLength::observe_guess): a sequence learns from every step, drafted or not, so one that
  // has stopped drafting sees its text turn repetitive at once instead of at its next probe row,
  // and probes cost nothing. The default (a draft model): guesses only where drafts are wanted.
  virtual bool free_guesses() const { return false; }
};

// Prompt lookup: the last n tokens (n from max_ngram down to min_ngram) are looked up among the
// sequence's own earlier tokens (prompt and output); the tokens that followed the latest earlier
// occurrence are the guess, continued past the end by copying itself (the suffix repeats with
// that period: a loop is guessed for as long as asked). O(tokens x max_ngram) per call, no state.
// min_ngram 1 by default: where no two-token suffix has occurred before (the first token after
// the text strays from what it copies, and comes back), the last token alone still finds where
// to continue; DraftLength stops a sequence whose such guesses fail. Replaying the greedy tokens
// of scripts/bench_spec's copy prompts through the proposer and DraftLength: 2.20 tokens a step
// unit against 1.97 with min_ngram 2 (docs/benchmarks.md, "Speculative decoding").
class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(int32_t max_ngram = 4, int32_t min_ngram = 1)
      : max_ngram_(max_ngram), min_ngram_(min_ngram) {}
  void propose(std::span<const int32_t> tokens, int32_t n_prompt, int32_t max_tokens,
               std::vector<int32_t>* out) override;
  bool free_guesses() const override { return true; }

 private:
  int32_t max_ngram_, min_ngram_;
};

// How many drafts to ask for at the next step of one sequence. It keeps a decayed estimate a of
// the chance that a draft is accepted given that the drafts before it were (accepted drafts over
// drafts examined: the accepted ones and the first rejected one), and picks the k in
// [0, max_tokens] that maximises the tokens a step yields per unit of step cost,
//     (1 + a + ... + a^k) / (1 + token_cost * k), if that beats k = 0 by kMinGain,
// token_cost being what one more token in a sequence's step costs against the step itself (the
// scheduler measures it: see SpecOptions::token_cost). A
// sequence whose drafts keep failing gets k = 0; every probe_every-th such step still probes
// with one draft, so it recovers when the text turns repetitive (kRareProbe times less often
// where the rows cost so much that even drafts accepted at kProbeAcceptance would not pay).
// With free guesses (Proposer::free_guesses) every step's guess is observed, drafted or not
// (observe_guess), and only those rare probes remain: they let the scheduler's measured row cost
// (DraftCostModel) see steps with drafts where nothing else drafts.
class DraftLength {
 public:
  explicit DraftLength(int32_t max_tokens) : max_tokens_(max_tokens) {}
  // Call once per step the sequence decodes; counts the steps without drafts. probe: false where
  // the caller observes a free guess every step (observe_guess), which then stands for the probes
  // (but for the rare ones where rows are dear).
  int32_t next(double token_cost, bool probe = true);
  // After a step that proposed `proposed` (> 0) drafts, of which the first `accepted` were.
  void observe(int32_t proposed, int32_t accepted, double decay = kDecay);
  // A guess made before `actual` (the tokens that came after it, drafts accepted or not)
  // counted as drafts would be: its matching prefix accepted, the first miss examined. A
  // drafted guess's bonus token (the row after all k drafts were accepted) checks guess k too.
  void observe_guess(std::span<const int32_t> guess, std::span<const int32_t> actual);
  double acceptance() const { return (accepted_ + kPrior * kPriorWeight) / (examined_ + kPriorWeight); }

  static constexpr double kPrior = 0.5, kPriorWeight = 1.0, kDecay = 0.85;
  // observe_guess's decay: a guess is checked at every step, drafted or not, so its estimate
  // sees several times more observations than one from drafted steps would, and keeps more of
  // them: with 0.85, chance matches in text that seldom repeats (each undrafted step checks one
  // token) set off drafts that lose. Replayed on 24 sampled runs of models/kjv-small at a row
  // cost of 0.15: 0.986 of off's speed with 0.9, 0.983 with 0.85, 0.987 learning from drafts
  // alone (docs/benchmarks.md, "Every guess checked").
  static constexpr double kGuessDecay = 0.9;
  static constexpr int32_t kProbeEvery = 8;
  static constexpr double kProbeAcceptance = 0.8;
  static constexpr int32_t kRareProbe = 4;
  // Drafts only where they are expected to gain at least this much: near the break-even (a
  // batch whose rows cost nearly a step each) the estimates of acceptance and cost are too noisy
  // for a predicted gain of a few percent to be one (GPT-2-124M at 16 sequences on two cores:
  // 0.91 of off's tokens/s without it, 0.97 with it; docs/benchmarks.md, "Speculative
  // decoding").
  static constexpr double kMinGain = 0.1;

 private:
  int32_t max_tokens_;
  double accepted_ = 0, examined_ = 0;
  int32_t idle_ = 0;
};

// The best k for acceptance `a` (0 unless some k >= 1 yields more than 1 + min_gain tokens a
// unit of step cost), as DraftLength::next() computes it with kMinGain (for tests and tools).
int32_t best_draft_length(double a, double token_cost, int32_t max_tokens, double min_gain = 0);

// What the scheduler speculates with (SchedulerOptions::spec; ltm-worker --speculative,
// --spec-tokens, --spec-max-batch).
struct SpecOptions {
  SpecMode mode = SpecMode::kOff;
  // Drafts per sequence and step, at most (--spec-tokens). 5: a verify step of up to 6 rows is
  // one register tile of the AVX-512 GEMM kernel, and on models/kjv-small a 7th row costs ~0.4
  // of a decode step where each of rows 2..6 costs ~0.15 (ltm-bench --step-cost): even at full
  // acceptance 6 tokens for 1.7 steps beat 9 for 2.6 (docs/benchmarks.md, "Speculative decoding").
  int32_t max_tokens = 5;
  // Speculate only while at most this many sequences run (--spec-max-batch).
  // ltm-worker's default (--spec-max-batch 0): every batch with prompt lookup, whose draft rows
  // are priced by the measured cost below (it stops drafting where they would lose); 4 with a
  // draft model, whose KV cache holds a context for that many sequences + 1 (ltm-plan counts it).
  int32_t max_batch = 4;
  static constexpr int32_t kDraftMaxBatch = 4;
  // DraftLength's token_cost, what one more draft row costs against a sequence's share of a
  // decode step (--spec-token-cost): > 0, this; 0 (the default), measured by the scheduler from
  // its own steps that only decode (DraftCostModel, draft_cost.h): b B / (a + b B) with B
  // sequences running, which tends to 1 as the batch grows, so drafts shorten and stop where the
  // rows' arithmetic would cost more than they save. kPriorTokenCost until it has timed enough
  // steps (a row of a 2..6-row chunk against a one-row step on models/kjv-small, Xeon with
  // AVX-512: docs/benchmarks.md, "Speculative decoding"). A draft model's sampled drafts are
  // priced by parameters, never by time (scheduler_spec.cpp).
  double token_cost = 0;
  static constexpr double kPriorTokenCost = 0.15;
  std::shared_ptr<Proposer> proposer;  // null: made from `mode` (kNgram: an NgramProposer)
};

// How many of `drafts` the target accepted: the longest prefix with sampled[i] == drafts[i]
// (sampled has at least drafts.size() entries: row i's sample verifies draft i).
int32_t accepted_prefix(std::span<const int32_t> drafts, std::span<const int32_t> sampled);

}  // namespace ltm
