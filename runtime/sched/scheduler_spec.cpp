// Speculative decoding on the scheduler's step thread (runtime/spec/proposer.h says why the
// output is the target's own). A decoding sequence that the proposer has guesses for runs its last
// token and k drafts as one chunk of k + 1 rows, each row sampled as the token it would be
// (token index g + i, history up to it); its results are read in order until a row's sample
// differs from its draft, and that sample, a correction, is the step's last token. Every rank
// learns what was accepted from the next plan, which starts at the first position not accepted:
// the rejected drafts' K/V slots are simply written again (attention reads context_lens tokens),
// and their blocks past the accepted ones are freed.
#include <algorithm>

#include "runtime/sched/scheduler.h"
#include "runtime/sched/scheduler_internal.h"
#include "runtime/spec/sampled_drafts.h"

namespace ltm {

namespace {

// Whether seq's drafts this step were sampled (each with its q in draft_probs), not a point mass.
template <typename Seq>  // Scheduler::Sequence
bool sampled_drafts(const Seq* seq, int64_t vocab) {
  return !seq->drafts.empty() &&
         seq->draft_probs.size() == seq->drafts.size() * static_cast<size_t>(vocab);
}

}  // namespace

bool Scheduler::speculating() const {
  return proposer_ != nullptr && static_cast<int32_t>(running_.size()) <= options_.spec.max_batch;
}

void Scheduler::propose_drafts(int64_t max_seqs) {
  // The sequences the plan will take first (submit_plan's first loop: running, not in flight),
  // those that decode: how many drafts each wants, then every proposal in one call (a draft
  // model runs them as one batch per draft token).
  std::vector<DraftRequest> requests;
  std::vector<std::pair<Sequence*, int32_t>> wanted;
  // The price of a draft row at this batch (fixed, or measured: DraftCostModel), once a step.
  const double fixed_cost =
      options_.spec.token_cost > 0 ? options_.spec.token_cost : SpecOptions::kPriorTokenCost;
  const double timed_cost =
      options_.spec.token_cost > 0
          ? fixed_cost
          : decode_cost_.token_cost(static_cast<int32_t>(running_.size()), fixed_cost);
  // Prompt lookup guesses for nothing (Proposer::free_guesses): every decoding sequence gets a
  // guess of --spec-tokens at every step, checked against the tokens that follow whether it was
  // drafted or not, and its drafts are the guess's first k. Not where rows are so dear at this
  // batch that even drafts accepted at DraftLength::kProbeAcceptance would not pay (a large
  // batch): nothing would be drafted but DraftLength's rare probes, and a guess for each of
  // hundreds of sequences at every step would be a cost of its own.
  const bool dear = best_draft_length(DraftLength::kProbeAcceptance, timed_cost,
                                      options_.spec.max_tokens) == 0;
  const bool free_guesses = proposer_->free_guesses() && options_.spec.max_tokens > 0 && !dear;
  int64_t seen = 0;
  for (auto& it : running_) {
    Sequence* seq = it.get();
    if (seq->busy) continue;
    seq->drafts.clear();  // none left from a step that did not take it
    seq->draft_probs.clear();
    seq->drafts_guessed = false;
    if (seen++ >= max_seqs) continue;
    const int32_t n = static_cast<int32_t>(seq->tokens.size());
    if (n - seq->n_computed != 1) continue;  // in prefill
    if (free_guesses && seq->guess_at < n) {
      // The last guess against the tokens that came since; then a new one.
      const std::span<const int32_t> since =
          std::span<const int32_t>(seq->tokens).subspan(static_cast<size_t>(seq->guess_at));
      seq->draft_length.observe_guess(seq->guess, since);
      seq->guess.clear();
      seq->guess_at = n;
      requests.push_back(
          {seq->id, seq->tokens, seq->n_prompt, options_.spec.max_tokens, &seq->guess});
    }
    // Drafts past the last token the request may still generate, or past the context window,
    // are never used: at most remaining - 1 (the step's last row adds one more token).
    const int32_t remaining = std::min(seq->req.max_new_tokens - seq->generated(),
                                       static_cast<int32_t>(config_.n_positions) - n);
    double token_cost = fixed_cost;
    // Sampled drafts: the tokens depend on how many drafts each step verifies (an accepted draft
    // is the draft's draw, a token without one the target's), so the draft length must not
    // depend on timings: a draft weighs its model's parameters over the target's (a decode step
    // reads its weights), not the seconds measured.
    const bool sampled = seq->req.sampling.temperature > 0 && proposer_->parameters() > 0;
    if (sampled) {
      token_cost += static_cast<double>(proposer_->parameters()) /
                    static_cast<double>(std::max<int64_t>(1, config_.parameter_count()));
    } else {
      token_cost = timed_cost;
      // A draft model's own time per draft, against a step's (Proposer::seconds_per_draft).
      if (const double s = proposer_->seconds_per_draft(); s > 0 && cost_.ready())
        token_cost += s / cost_.step_seconds(static_cast<int32_t>(running_.size()));
    }
    const int32_t k = std::min(seq->draft_length.next(token_cost, !free_guesses), remaining - 1);
    if (k <= 0) continue;
    if (free_guesses) {  // the guess's first k, below
      wanted.emplace_back(seq, k);
      continue;
    }
    DraftRequest r{seq->id, seq->tokens, seq->n_prompt, k, &seq->drafts};
    if (seq->req.sampling.temperature > 0) {  // a proposer with a distribution samples from it
      r.sampling = &seq->req.sampling;
      r.token_index = seq->generated();  // draft i guesses token g + i (row i's, add_draft_rows)
      r.probs = &seq->draft_probs;
    }
    requests.push_back(r);
    wanted.emplace_back(seq, k);
  }
  if (!requests.empty()) proposer_->propose_all(requests);
  const size_t V = static_cast<size_t>(config_.vocab_size);
  for (auto& [seq, k] : wanted) {
    if (free_guesses) {
      seq->drafts.assign(seq->guess.begin(),
                         seq->guess.begin() + std::min<ptrdiff_t>(k, std::ssize(seq->guess)));
      seq->drafts_guessed = true;
    }
    if (static_cast<int32_t>(seq->drafts.size()) > k) seq->drafts.resize(static_cast<size_t>(k));
    if (!seq->draft_probs.empty()) seq->draft_probs.resize(seq->drafts.size() * V);
  }
}

void Scheduler::plan_drafts(Sequence* seq, int32_t max_drafts) {
  seq->drafts_accepted = 0;
  seq->draft_rejected = false;
  if (static_cast<int32_t>(seq->drafts.size()) > max_drafts) {
    seq->drafts.resize(static_cast<size_t>(std::max(0, max_drafts)));
    if (!seq->draft_probs.empty())
      seq->draft_probs.resize(seq->drafts.size() * static_cast<size_t>(config_.vocab_size));
  }
  // Drafts must not make room by preempting another sequence: only blocks that are free now.
  const int32_t need = blocks_for(seq->n_computed + 1 + static_cast<int32_t>(seq->drafts.size()),
                                  block_size_) -
                       static_cast<int32_t>(seq->blocks.size());
  if (need > 0 && need > blocks_.n_free()) {
    seq->drafts.clear();
    seq->draft_probs.clear();
  }
}

void Scheduler::add_draft_rows(Sequence* seq, int32_t row0, StepPlan* step, InFlightPlan* plan) {
  const int32_t k = static_cast<int32_t>(seq->drafts.size());
  seq->spec_proposed += k;
  for (int32_t i = 0; i <= k; ++i) {
    RowSampling rs;
    rs.params = seq->req.sampling;
    rs.token_index = seq->generated() + i;
    rs.want_logprob = seq->req.return_logprobs;
    rs.top_n = seq->req.logprob_alternatives;
    if (rs.params.repetition_penalty != 1.0f) {
      rs.history = seq->tokens;
      rs.history.insert(rs.history.end(), seq->drafts.begin(), seq->drafts.begin() + i);
    }
    step->input.logit_rows.push_back(row0 + i);
    step->sampling.push_back(std::move(rs));
    plan->rows.push_back({seq, true, i});
    // Sampled drafts are verified on rank 0 against the target's whole distribution at each row.
    if (seq->req.return_full_logits || sampled_drafts(seq, config_.vocab_size))
      step->want_logits = true;
  }
}

bool Scheduler::draft_row_counts(const Sequence* seq, int32_t spec_row) const {
  return spec_row <= seq->drafts_accepted && !seq->draft_rejected;
}

void Scheduler::note_draft_row(Sequence* seq, int32_t spec_row, const std::vector<float>& row,
                               SampleResult* sample, RowLogprobs* logprobs) {
  const int64_t V = config_.vocab_size;
  if (spec_row < static_cast<int32_t>(seq->drafts.size()) && sampled_drafts(seq, V) &&
      static_cast<int64_t>(row.size()) == V) {
    // The rule for a sampled q (runtime/spec/sampled_drafts.h). Rows before this one were
    // accepted, so seq->tokens is this row's context and generated() the index of its token.
    const SamplingParams& params = seq->req.sampling;
    std::span<const int32_t> history;
    if (params.repetition_penalty != 1.0f) history = seq->tokens;
    std::vector<float> p;
    processed_probabilities(row, params, history, &p);
    const std::span<const float> q(seq->draft_probs.data() + static_cast<size_t>(spec_row) * V,
                                   static_cast<size_t>(V));
    Rng rng = verify_rng(params.seed, seq->generated());
    const DraftVerdict v = verify_sampled_draft(p, q, seq->drafts[spec_row], rng);
    if (v.token >= 0 && v.token != sample->token) {
      sample->token = v.token;
      sample->logprob = processed_logprob(row, params, history, v.token);
      if (logprobs && logprobs->ok()) {
        std::vector<int32_t> scratch;
        *logprobs = row_logprobs(row, v.token, logprobs->n_top, &scratch);
      }
    }
  }
  const int32_t token = sample->token;
  if (spec_row < static_cast<int32_t>(seq->drafts.size()) && token == seq->drafts[spec_row]) {
    seq->drafts_accepted = spec_row + 1;
    seq->spec_accepted++;  // before the token is emitted: a final event counts it
  } else {
    seq->draft_rejected = true;
  }
}

void Scheduler::end_draft_step(Sequence* seq) {
  const int32_t proposed = static_cast<int32_t>(seq->drafts.size());
  const int32_t accepted = seq->drafts_accepted;
  // A guess, the drafts among it, is checked at the next step (propose_drafts).
  if (!seq->drafts_guessed) seq->draft_length.observe(proposed, accepted);
  seq->drafts.clear();
  seq->draft_probs.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.spec_proposed_tokens += proposed;
    stats_.spec_accepted_tokens += accepted;
    stats_.spec_steps++;
  }
  if (seq->finished) return;  // its blocks are released already
  seq->n_computed += 1 + accepted;
  const size_t keep = static_cast<size_t>(blocks_for(seq->n_computed, block_size_));
  if (seq->blocks.size() > keep) {
    // Blocks that hold no accepted position: never registered in the prefix cache.
    blocks_.release(std::vector<int32_t>(seq->blocks.begin() + static_cast<std::ptrdiff_t>(keep),
                                         seq->blocks.end()));
    seq->blocks.resize(keep);
  }
  if (options_.prefix_cache) register_full_blocks(seq);
}

}  // namespace ltm
