// Speculative decoding in the scheduler (runtime/sched/scheduler_spec.cpp), against fake engines:
//   - FakeEngine (tests/sched/fake_engine.h), whose tokens depend on what the plans' block tables
//     read: greedy output equals the model's own continuation, with drafts rejected at every
//     position (the rejected drafts' K/V rolled back), preemption and the prefix cache;
//   - MarkovEngine (below): a 4-token vocabulary whose rows are sampled by the real sampler with
//     the engine's random streams: sampled output is the same with speculation as without, and
//     its distribution is the model's (chi-square), which a wrong acceptance rule fails.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "runtime/sampling/sampler.h"
#include "runtime/sched/scheduler.h"
#include "tests/sched/scheduler_rig.h"

namespace ltm {
namespace {

using namespace sched_test;

// Knows the fake model's greedy continuation and gets every `wrong_every`-th draft wrong.
class OracleProposer final : public Proposer {
 public:
  OracleProposer(const FakeEngine* engine, int wrong_every) : engine_(engine), wrong_every_(wrong_every) {}
  void propose(std::span<const int32_t> tokens, int32_t, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    const std::vector<int32_t> next =
        engine_->expected_tokens(std::vector<int32_t>(tokens.begin(), tokens.end()), max_tokens);
    for (int32_t t : next) out->push_back(++count_ % wrong_every_ == 0 ? (t + 1) % kVocab : t);
    calls_++;
  }
  int calls_ = 0;

 private:
  const FakeEngine* engine_;
  int wrong_every_;
  int count_ = 0;
};

SchedulerOptions spec_options(int max_tokens, int max_batch) {
  SchedulerOptions o;
  o.spec.mode = SpecMode::kNgram;
  o.spec.max_tokens = max_tokens;
  o.spec.max_batch = max_batch;
  o.spec.token_cost = 0.1;  // fixed: the fake engine's step times are no measure
  return o;
}

// The most logit rows any one sequence had in a plan.
int max_rows_per_sequence(const StepPlan& p) {
  int best = 0;
  const StepInput& in = p.input;
  for (int32_t s = 0; s < in.n_seqs(); ++s) {
    int n = 0;
    for (int32_t r : in.logit_rows) n += r >= in.token_offsets[s] && r < in.token_offsets[s + 1];
    best = std::max(best, n);
  }
  return best;
}

TEST(Speculative, GreedyOutputIsTheModelsWithDraftsRejectedAnywhere) {
  for (int wrong_every : {2, 3, 5, 1000}) {
    SCOPED_TRACE(wrong_every);
    SchedulerOptions o = spec_options(5, 8);
    FakeEngine engine(kVocab, 64, 4);
    auto oracle = std::make_shared<OracleProposer>(&engine, wrong_every);
    o.spec.proposer = oracle;
    Scheduler sched(engine, nullptr, fake_config(), 64, 4, o);
    std::vector<std::shared_ptr<Received>> out;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 3; ++i) {
      prompts.push_back(prompt_of(5 + 3 * i, i));
      auto r = std::make_shared<Received>();
      ASSERT_TRUE(sched.submit(request(prompts.back(), 17 + i), r->callback()).ok());
      out.push_back(r);
    }
    sched.run_until_idle();
    int64_t proposed = 0, accepted = 0;
    for (int i = 0; i < 3; ++i) {
      expect_served(*out[i], engine.expected_tokens(prompts[i], 17 + i), FinishReason::kLength);
      proposed += out[i]->last.spec_proposed_tokens;
      accepted += out[i]->last.spec_accepted_tokens;
    }
    for (const std::string& e : engine.errors()) ADD_FAILURE() << "fake engine: " << e;
    const SchedulerStats st = sched.stats();
    EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total) << "blocks leaked";
    EXPECT_EQ(st.spec_proposed_tokens, proposed);
    EXPECT_EQ(st.spec_accepted_tokens, accepted);
    EXPECT_GT(accepted, 0);
    if (wrong_every < 1000) {
      EXPECT_LT(accepted, proposed);
    }
    int most = 0;
    for (const StepPlan& p : engine.plans()) most = std::max(most, max_rows_per_sequence(p));
    // The last token and 5 drafts once the drafts are seen to be right.
    if (wrong_every == 1000) {
      EXPECT_EQ(most, 6);
    } else {
      EXPECT_GE(most, 3);
    }
    EXPECT_GT(oracle->calls_, 0);
    // Fewer steps than tokens: accepted drafts saved steps.
    EXPECT_LT(engine.plans().size(), 17u + 18u + 19u);
  }
}

TEST(Speculative, PreemptionAndThePrefixCacheKeepTheTokens) {
  SchedulerOptions o = spec_options(4, 8);
  FakeEngine engine(kVocab, 14, 4);  // 56 slots for 4 sequences of up to 26 tokens: preemption
  auto oracle = std::make_shared<OracleProposer>(&engine, 3);
  o.spec.proposer = oracle;
  ModelConfig config = fake_config();
  Scheduler sched(engine, nullptr, config, 14, 4, o);
  std::vector<std::shared_ptr<Received>> out;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(prompt_of(8 + (i % 2), 1));  // shared prefixes: cached blocks reused
    auto r = std::make_shared<Received>();
    ASSERT_TRUE(sched.submit(request(prompts.back(), 16 + i), r->callback()).ok());
    out.push_back(r);
  }
  sched.run_until_idle();
  for (int i = 0; i < 4; ++i)
    expect_served(*out[i], engine.expected_tokens(prompts[i], 16 + i), FinishReason::kLength);
  for (const std::string& e : engine.errors()) ADD_FAILURE() << "fake engine: " << e;
  const SchedulerStats st = sched.stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.prefix_cache_hit_tokens, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total) << "blocks leaked";
}

TEST(Speculative, OffAboveMaxBatchAndForTheLastTokens) {
  SchedulerOptions o = spec_options(8, 2);
  FakeEngine engine(kVocab, 128, 4);
  o.spec.proposer = std::make_shared<OracleProposer>(&engine, 1000);
  ModelConfig config = fake_config();
  Scheduler sched(engine, nullptr, config, 128, 4, o);
  std::vector<std::shared_ptr<Received>> out;
  for (int i = 0; i < 4; ++i) {
    auto r = std::make_shared<Received>();
    // Different lengths: the batch shrinks from 4 to 1 as they finish.
    ASSERT_TRUE(sched.submit(request(prompt_of(6, i), 3 + 10 * i), r->callback()).ok());
    out.push_back(r);
  }
  sched.run_until_idle();
  for (int i = 0; i < 4; ++i)
    expect_served(*out[i], engine.expected_tokens(prompt_of(6, i), 3 + 10 * i),
                  FinishReason::kLength);
  bool spoke = false;
  for (const StepPlan& p : engine.plans()) {
    const int rows = max_rows_per_sequence(p);
    if (rows > 1) {
      EXPECT_LE(p.input.n_seqs(), 2) << "speculated with more than --spec-max-batch running";
      spoke = true;
    }
    // Never a draft past max_new_tokens: the last row of a sequence is its last token's.
    for (int32_t s = 0; s < p.input.n_seqs(); ++s) EXPECT_LE(p.input.context_lens[s], 6 + 3 + 30);
  }
  EXPECT_TRUE(spoke);
  EXPECT_EQ(sched.stats().spec_proposed_tokens, sched.stats().spec_accepted_tokens);
  for (const std::string& e : engine.errors()) ADD_FAILURE() << "fake engine: " << e;
}

// The default draft length prices a draft row by the scheduler's own decode steps (SpecOptions::
// token_cost 0): on an engine whose rows are nearly free beside a step's fixed cost (a large
// model's decode, bound by reading its weights) 8 sequences keep long drafts; on one whose
// every row costs ten fixed costs (a small model on a few cores) the same 8 stop drafting but
// for DraftLength's probes. The fake clock advances by a + b x rows at each step.
TEST(Speculative, MeasuredRowCostDecidesWhereDraftsPay) {
  struct Case {
    double fixed_ms, row_ms;
    bool pays;
  };
  for (const Case c : {Case{10.0, 0.1, true}, Case{0.1, 1.0, false}}) {
    SCOPED_TRACE(c.pays ? "rows nearly free" : "rows dear");
    SchedulerOptions o = spec_options(5, 64);
    o.spec.token_cost = 0;  // measured
    std::chrono::steady_clock::time_point t{};
    o.clock = [&t] { return t; };
    FakeEngine engine(kVocab, 512, 4);
    engine.on_step = [&](const StepPlan& p, StepOutput&) {
      t += std::chrono::microseconds(
          static_cast<int64_t>(1000 * (c.fixed_ms + c.row_ms * p.input.n_tokens())));
    };
    o.spec.proposer = std::make_shared<OracleProposer>(&engine, 4);  // 3 of 4 drafts right
    Scheduler sched(engine, nullptr, fake_config(), 512, 4, o);
    std::vector<std::shared_ptr<Received>> out;
    for (int i = 0; i < 8; ++i) {
      auto r = std::make_shared<Received>();
      ASSERT_TRUE(sched.submit(request(prompt_of(6, i), 120), r->callback()).ok());
      out.push_back(r);
    }
    sched.run_until_idle();
    for (int i = 0; i < 8; ++i)
      expect_served(*out[i], engine.expected_tokens(prompt_of(6, i), 120), FinishReason::kLength);
    // The second half of the steps of all 8 (the cost fitted by then): sequence-steps with drafts.
    std::vector<const StepPlan*> full;
    for (const StepPlan& p : engine.plans())
      if (p.input.n_seqs() == 8) full.push_back(&p);
    ASSERT_GT(full.size(), 16u);
    int seq_steps = 0, drafting = 0;
    for (size_t i = full.size() / 2; i < full.size(); ++i) {
      const StepInput& in = full[i]->input;
      for (int32_t s = 0; s < in.n_seqs(); ++s) {
        seq_steps++;
        drafting += in.token_offsets[s + 1] - in.token_offsets[s] > 1;
      }
    }
    const double share = static_cast<double>(drafting) / seq_steps;
    if (c.pays) {
      EXPECT_GT(share, 0.8) << drafting << " of " << seq_steps;
    } else {
      // DraftLength probes with one draft every 8th step it would not draft.
      EXPECT_LT(share, 0.2) << drafting << " of " << seq_steps;
    }
    for (const std::string& e : engine.errors()) ADD_FAILURE() << "fake engine: " << e;
  }
}

// Guesses the fake model's continuation right once the sequence holds `right_from` tokens, and
// off by one before; free (Proposer::free_guesses, as prompt lookup) or not.
class PhaseProposer final : public Proposer {
 public:
  PhaseProposer(const FakeEngine* engine, size_t right_from, bool free)
      : engine_(engine), right_from_(right_from), free_(free) {}
  void propose(std::span<const int32_t> tokens, int32_t, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    const std::vector<int32_t> next =
        engine_->expected_tokens(std::vector<int32_t>(tokens.begin(), tokens.end()), max_tokens);
    for (int32_t t : next) out->push_back(tokens.size() >= right_from_ ? t : (t + 1) % kVocab);
    asked_for_ += max_tokens;
  }
  bool free_guesses() const override { return free_; }
  int64_t asked_for_ = 0;

 private:
  const FakeEngine* engine_;
  size_t right_from_;
  bool free_;
};

// A sequence whose guesses are wrong for its first 40-47 tokens and then right: with free
// guesses it learns from every step (the guesses it did not draft checked against the tokens that
// came), so it spends no probe rows while they are wrong and drafts again two steps after they
// turn right; learning from its verified drafts alone it probes every 8th step and finds the
// change at its next probe, 0 to 7 steps later.
TEST(Speculative, FreeGuessesAreCheckedAtEveryStepDraftedOrNot) {
  const std::vector<int32_t> prompt = prompt_of(6, 0);
  struct Run {
    size_t steps;
    int64_t proposed, accepted, asked_for;
    int waited;  // one-row decode steps once the guesses are right, before the first with drafts
  };
  const auto run = [&](bool free, size_t right_from, double token_cost = 0.1) {
    SchedulerOptions o = spec_options(5, 8);
    o.spec.token_cost = token_cost;
    FakeEngine engine(kVocab, 64, 4);
    auto proposer = std::make_shared<PhaseProposer>(&engine, right_from, free);
    o.spec.proposer = proposer;
    Scheduler sched(engine, nullptr, fake_config(), 64, 4, o);
    auto r = std::make_shared<Received>();
    EXPECT_TRUE(sched.submit(request(prompt, 120), r->callback()).ok());
    sched.run_until_idle();
    expect_served(*r, engine.expected_tokens(prompt, 120), FinishReason::kLength);
    for (const std::string& e : engine.errors()) ADD_FAILURE() << "fake engine: " << e;
    int waited = 0;
    for (const StepPlan& p : engine.plans()) {
      // The step's first row is the sequence's last token: guessed from there, rightly or not.
      const int32_t rows = p.input.n_tokens();
      if (static_cast<size_t>(p.input.context_lens[0] - rows + 1) < right_from) continue;
      if (rows > 1) break;
      waited++;
    }
    return Run{engine.plans().size(), r->last.spec_proposed_tokens, r->last.spec_accepted_tokens,
               proposer->asked_for_, waited};
  };
  int64_t waited_guessing = 0, waited_drafting = 0;
  size_t steps_guessing = 0, steps_drafting = 0;
  for (size_t wrong = 40; wrong < 48; ++wrong) {  // a probe period of switch points
    SCOPED_TRACE(wrong);
    const Run guessing = run(true, prompt.size() + wrong);
    const Run drafting = run(false, prompt.size() + wrong);
    // Wrong drafts: the prior's first tries only, against those and a probe every 8th step.
    EXPECT_LE(guessing.proposed - guessing.accepted, 3);
    EXPECT_LT(guessing.proposed - guessing.accepted, drafting.proposed - drafting.accepted);
    EXPECT_LE(guessing.waited, 2);
    // A free proposer is asked for --spec-tokens guesses at every decode step.
    EXPECT_GE(guessing.asked_for, 5 * static_cast<int64_t>(guessing.steps - 1));
    EXPECT_LT(drafting.asked_for, guessing.asked_for);
    waited_guessing += guessing.waited;
    waited_drafting += drafting.waited;
    steps_guessing += guessing.steps;
    steps_drafting += drafting.steps;
  }
  // Back to drafting sooner: fewer steps for the same 120 tokens, over the period.
  EXPECT_LT(waited_guessing, waited_drafting);
  EXPECT_LT(steps_guessing, steps_drafting);

  // Where a draft row costs so much (here 0.9 of a step: a large batch) that even drafts
  // accepted 80% of the time would not pay, only DraftLength's rare probes draft, and nobody
  // asks for a guess at every step.
  const Run dear = run(true, 0, 0.9);  // guesses always right
  EXPECT_GT(dear.asked_for, 0);
  EXPECT_LE(dear.asked_for, 120 / (DraftLength::kRareProbe * DraftLength::kProbeEvery) + 1);
}

// ---- Sampled output: a 4-token Markov model sampled by the real sampler ------------------------

constexpr int kV = 4;
constexpr std::array<std::array<double, kV>, kV> kT = {{{0.5, 0.2, 0.2, 0.1},
                                                        {0.1, 0.6, 0.2, 0.1},
                                                        {0.25, 0.25, 0.3, 0.2},
                                                        {0.4, 0.1, 0.1, 0.4}}};

std::vector<float> markov_logits(int32_t token) {
  std::vector<float> row(kV);
  for (int v = 0; v < kV; ++v) row[v] = static_cast<float>(std::log(kT[token][v]));
  return row;
}

// A row's logits are log T[its token]: the next token depends on the last one only. Rows are
// sampled as Engine::sample_last_stage samples them (the sampler, the stream (seed, index)).
class MarkovEngine final : public StepEngine {
 public:
  void submit(const StepPlan& plan) override {
    StepOutput out;
    std::vector<float> scratch;
    for (size_t i = 0; i < plan.input.logit_rows.size(); ++i) {
      const RowSampling& rs = plan.sampling[i];
      Rng rng = Rng::for_step(rs.params.seed, rs.token_index);
      const std::vector<float> row = markov_logits(plan.input.token_ids[plan.input.logit_rows[i]]);
      out.samples.push_back(sample(row, rs.params, rs.history, rng, &scratch, rs.want_logprob));
    }
    steps++;
    pending_.push_back(std::move(out));
  }
  StepOutput collect() override {
    StepOutput out = std::move(pending_.front());
    pending_.pop_front();
    return out;
  }
  int in_flight() const override { return static_cast<int>(pending_.size()); }
  absl::Status load_adapter(int32_t, const std::string&, int, LoraSummary*) override {
    return absl::UnimplementedError("no adapters");
  }
  void unload_adapter(int32_t) override {}
  void keep_alive() override {}
  double allreduce_seconds() const override { return 0; }
  int64_t steps = 0;

 private:
  std::deque<StepOutput> pending_;
};

// A draft model's guess: the greedy chain of T from the last token.
class GreedyChainProposer final : public Proposer {
 public:
  void propose(std::span<const int32_t> tokens, int32_t, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    int32_t t = tokens.back();
    for (int32_t i = 0; i < max_tokens; ++i) {
      t = static_cast<int32_t>(std::max_element(kT[t].begin(), kT[t].end()) - kT[t].begin());
      out->push_back(t);
    }
  }
};

ModelConfig markov_config() {
  ModelConfig c = fake_config();
  c.vocab_size = kV;
  return c;
}

// Every request's tokens, served by one scheduler (speculating or not).
std::vector<std::vector<int32_t>> serve_markov(const std::vector<GenerationRequest>& reqs,
                                               bool speculate, int64_t* steps = nullptr,
                                               int64_t* accepted = nullptr) {
  SchedulerOptions o;
  o.max_running = 256;
  o.max_batch_tokens = 1 << 16;  // every sequence every step: steps are the longest chain's
  if (speculate) {
    o.spec.mode = SpecMode::kNgram;
    o.spec.max_tokens = 3;
    o.spec.max_batch = 1 << 20;
    o.spec.token_cost = 0.1;
    o.spec.proposer = std::make_shared<GreedyChainProposer>();
  }
  MarkovEngine engine;
  Scheduler sched(engine, nullptr, markov_config(), 4096, 4, o);
  std::vector<std::shared_ptr<Received>> out;
  std::vector<std::vector<int32_t>> tokens;
  for (size_t i = 0; i < reqs.size(); ++i) {
    out.push_back(std::make_shared<Received>());
    EXPECT_TRUE(sched.submit(reqs[i], out.back()->callback()).ok());
    if (out.size() == 256 || i + 1 == reqs.size()) {  // in waves, so the test stays fast
      sched.run_until_idle();
      for (auto& r : out) tokens.push_back(r->tokens);
      out.clear();
    }
  }
  if (steps) *steps = engine.steps;
  if (accepted) *accepted = sched.stats().spec_accepted_tokens;
  return tokens;
}

GenerationRequest markov_request(uint64_t seed, int n_new, SamplingParams params,
                                 std::vector<int32_t> prompt = {0, 3}) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_new_tokens = n_new;
  r.sampling = params;
  r.sampling.seed = seed;
  return r;
}

TEST(Speculative, SampledOutputIsTheSameTokensAsWithout) {
  SamplingParams plain, topk, topp, penalty;
  topk.temperature = 0.7f;
  topk.top_k = 3;
  topp.top_p = 0.8f;
  penalty.repetition_penalty = 1.4f;  // the history of a draft row holds the drafts before it
  for (const SamplingParams& p : {plain, topk, topp, penalty}) {
    std::vector<GenerationRequest> reqs;
    for (uint64_t seed = 0; seed < 300; ++seed) reqs.push_back(markov_request(seed, 12, p));
    int64_t accepted = 0;
    const auto on = serve_markov(reqs, true, nullptr, &accepted);
    const auto off = serve_markov(reqs, false);
    EXPECT_EQ(on, off);
    EXPECT_GT(accepted, 300);  // 300 requests of 12 tokens: drafts were verified and kept
  }
}

// Pearson's chi-square of the counts of 3 tokens against the model's exact probabilities after a
// prompt ending in 3: the first 3 generated tokens, or with `after_first` the 2nd to 4th (the
// first decode step verifies 2 drafts: all three come from one step when they are accepted);
// 63 degrees of freedom: 113.7 is its 1 - 1e-4 quantile (Wilson-Hilferty).
constexpr double kChi2Limit = 113.7;

double chi_square(const std::map<std::vector<int32_t>, int>& counts, int n,
                  bool after_first = false) {
  double chi2 = 0;
  for (int a = 0; a < kV; ++a)
    for (int b = 0; b < kV; ++b)
      for (int c = 0; c < kV; ++c) {
        double first = kT[3][a];  // the prompt ends in 3
        if (after_first) {
          first = 0;
          for (int t = 0; t < kV; ++t) first += kT[3][t] * kT[t][a];
        }
        const double expect = n * first * kT[a][b] * kT[b][c];
        auto it = counts.find({a, b, c});
        const double got = it == counts.end() ? 0 : it->second;
        chi2 += (got - expect) * (got - expect) / expect;
      }
  return chi2;
}

TEST(Speculative, SampledDistributionIsTheModelsByChiSquare) {
  SamplingParams plain;
  constexpr int kN = 12000;
  std::vector<GenerationRequest> reqs;
  for (uint64_t seed = 0; seed < kN; ++seed) reqs.push_back(markov_request(seed + 7777, 4, plain));
  int64_t accepted = 0;
  std::map<std::vector<int32_t>, int> counts;
  for (const auto& t : serve_markov(reqs, true, nullptr, &accepted))
    counts[std::vector<int32_t>(t.begin() + 1, t.end())]++;
  const double chi2 = chi_square(counts, kN, /*after_first=*/true);
  EXPECT_LT(chi2, kChi2Limit);
  EXPECT_GT(accepted, kN / 2);  // the drafts were really verified, and often accepted
  std::printf("speculative (the scheduler): chi-square %.1f (63 dof, limit %.1f), %lld drafts "
              "accepted\n", chi2, kChi2Limit, static_cast<long long>(accepted));
}

// The same statistic has the power to catch a wrong rule. Each token with draft x is decided by
// a rule over p = softmax(row) and one stream; the correct rules (sample y ~ p and accept iff
// y == x; or the textbook form: accept x with probability p(x), else draw from p with x removed
// and renormalised) pass, and the classic mistake (on rejection, draw from p again, x included)
// fails.
enum class Rule { kSampleAndCompare, kTextbook, kWrongResampleFromP };

int32_t decide(Rule rule, int32_t last, int32_t draft, Rng& rng) {
  const std::array<double, kV>& p = kT[last];
  auto draw = [&](double u, int32_t skip) {
    double mass = 0;
    for (int v = 0; v < kV; ++v) mass += v == skip ? 0 : p[v];
    double cum = 0;
    for (int v = 0; v < kV; ++v) {
      if (v == skip) continue;
      cum += p[v] / mass;
      if (u < cum) return v;
    }
    return kV - 1 == skip ? kV - 2 : kV - 1;
  };
  switch (rule) {
    case Rule::kSampleAndCompare: return draw(rng.uniform(), -1);
    case Rule::kTextbook: return rng.uniform() < p[draft] ? draft : draw(rng.uniform(), draft);
    case Rule::kWrongResampleFromP: return rng.uniform() < p[draft] ? draft : draw(rng.uniform(), -1);
  }
  return 0;
}

double simulate(Rule rule, int n) {
  std::map<std::vector<int32_t>, int> counts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> out;
    int32_t last = 3;
    for (int t = 0; t < 3; ++t) {
      const int32_t draft =
          static_cast<int32_t>(std::max_element(kT[last].begin(), kT[last].end()) - kT[last].begin());
      Rng rng = Rng::for_step(static_cast<uint64_t>(i) + 99, t);
      last = decide(rule, last, draft, rng);
      out.push_back(last);
    }
    counts[out]++;
  }
  return chi_square(counts, n);
}

TEST(Speculative, TheChiSquareTestCatchesAWrongAcceptanceRule) {
  const double ok = simulate(Rule::kSampleAndCompare, 12000);
  const double textbook = simulate(Rule::kTextbook, 12000);
  const double wrong = simulate(Rule::kWrongResampleFromP, 12000);
  std::printf("chi-square: sample-and-compare %.1f, textbook %.1f, wrong rule %.1f (limit %.1f)\n",
              ok, textbook, wrong, kChi2Limit);
  EXPECT_LT(ok, kChi2Limit);
  EXPECT_LT(textbook, kChi2Limit);
  EXPECT_GT(wrong, kChi2Limit);
}

}  // namespace
}  // namespace ltm
