// The scheduler with the draft-model proposer (runtime/spec/draft_model.h) against the fake engine
// (tests/sched/fake_engine.h): a random-weight draft whose guesses the fake model mostly rejects.
// The output is the model's own continuation; the decoding sequences' drafts come from one
// propose_all call a step (one batched draft pass per draft token); the draft's per-sequence
// state is released when a sequence finishes or is cancelled.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <vector>

#include "runtime/sched/scheduler.h"
#include "runtime/spec/draft_model.h"
#include "tests/sched/scheduler_rig.h"

namespace ltm {
namespace {

using namespace sched_test;

// Passes everything to the draft model and records what the scheduler asked.
class Recording final : public Proposer {
 public:
  explicit Recording(std::unique_ptr<DraftModelProposer> draft) : draft(std::move(draft)) {}
  void propose(std::span<const int32_t> tokens, int32_t n_prompt, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    draft->propose(tokens, n_prompt, max_tokens, out);
  }
  void propose_all(std::span<const DraftRequest> requests) override {
    batch_sizes.push_back(requests.size());
    draft->propose_all(requests);
  }
  void release(uint64_t seq_id) override {
    released++;
    draft->release(seq_id);
  }
  std::unique_ptr<DraftModelProposer> draft;
  std::vector<size_t> batch_sizes;
  int released = 0;
};

std::shared_ptr<Recording> random_draft() {
  const std::string path = ::testing::TempDir() + "/scheduler_draft_test.json";
  std::ofstream(path) << "{\"vocab_size\": " << kVocab << ", \"n_positions\": 256, "
                      << "\"n_embd\": 32, \"n_layer\": 1, \"n_head\": 4, \"eos_token_id\": null}";
  DraftModelOptions o;
  o.dir = path;
  o.target_vocab = kVocab;
  o.block_size = 4;
  o.max_sequences = 4;
  auto d = DraftModelProposer::load(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return std::make_shared<Recording>(std::move(*d));
}

SchedulerOptions draft_options(std::shared_ptr<Proposer> p, int max_batch) {
  SchedulerOptions o;
  o.spec.mode = SpecMode::kDraft;
  o.spec.max_tokens = 4;
  o.spec.max_batch = max_batch;
  o.spec.token_cost = 0.01;  // keeps proposing although most drafts fail
  o.spec.proposer = std::move(p);
  return o;
}

TEST(DraftSpeculative, GreedyOutputIsTheModelsWithADraftModelsGuessesRejected) {
  auto draft = random_draft();
  Rig rig(128, 4, draft_options(draft, 8));
  std::vector<std::shared_ptr<Received>> out;
  for (int i = 0; i < 4; ++i) out.push_back(rig.submit(request(prompt_of(5 + 4 * i, i), 20 + i)));
  rig.scheduler.run_until_idle();
  for (int i = 0; i < 4; ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompt_of(5 + 4 * i, i), 20 + i),
                  FinishReason::kLength);
  rig.expect_clean();
  const SchedulerStats st = rig.scheduler.stats();
  EXPECT_GT(st.spec_proposed_tokens, 40);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_proposed_tokens / 2);  // a random draft
  int64_t proposed = 0;
  for (const auto& r : out) proposed += r->last.spec_proposed_tokens;
  EXPECT_EQ(proposed, st.spec_proposed_tokens);
  // Decoding sequences were asked for together, and their states are gone once they ended.
  EXPECT_GT(*std::max_element(draft->batch_sizes.begin(), draft->batch_sizes.end()), 1u);
  EXPECT_EQ(draft->released, 4);
  EXPECT_EQ(draft->draft->sequences(), 0);
  EXPECT_EQ(draft->draft->blocks_free(), draft->draft->blocks_total());
}

TEST(DraftSpeculative, ACancelledSequenceReleasesItsDraftState) {
  auto draft = random_draft();
  Rig rig(128, 4, draft_options(draft, 8));
  GenerationRequest r = request(prompt_of(6, 1), 40);
  auto cancel = r.cancel;
  auto o = std::make_shared<Received>();
  auto inner = o->callback();
  ASSERT_TRUE(rig.scheduler
                  .submit(std::move(r),
                          [&, inner](GenerationEvent ev) {
                            inner(ev);
                            if (o->tokens.size() >= 5) cancel->cancelled = true;
                          })
                  .ok());
  auto other = rig.submit(request(prompt_of(7, 2), 12));
  rig.scheduler.run_until_idle();
  EXPECT_EQ(o->last.finish_reason, FinishReason::kCancelled);
  expect_served(*other, rig.engine.expected_tokens(prompt_of(7, 2), 12), FinishReason::kLength);
  rig.expect_clean();
  EXPECT_EQ(draft->released, 2);
  EXPECT_EQ(draft->draft->sequences(), 0);
}

TEST(DraftSpeculative, NoDraftsAboveSpecMaxBatch) {
  auto draft = random_draft();
  Rig rig(256, 4, draft_options(draft, 2));
  std::vector<std::shared_ptr<Received>> out;
  for (int i = 0; i < 5; ++i) out.push_back(rig.submit(request(prompt_of(6, i), 4 + 6 * i)));
  rig.scheduler.run_until_idle();
  for (int i = 0; i < 5; ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompt_of(6, i), 4 + 6 * i),
                  FinishReason::kLength);
  rig.expect_clean();
  // Drafts only once at most 2 sequences were left running.
  for (size_t n : draft->batch_sizes) EXPECT_LE(n, 2u);
  EXPECT_FALSE(draft->batch_sizes.empty());
}

// Right guesses (the fake model's continuation) that claim to cost `seconds` each.
class CostlyOracle final : public Proposer {
 public:
  CostlyOracle(const FakeEngine* engine, double seconds) : engine_(engine), seconds_(seconds) {}
  void propose(std::span<const int32_t> tokens, int32_t, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    for (int32_t t : engine_->expected_tokens({tokens.begin(), tokens.end()}, max_tokens))
      out->push_back(t);
  }
  double seconds_per_draft() const override { return seconds_; }

 private:
  const FakeEngine* engine_;
  double seconds_;
};

TEST(DraftSpeculative, DraftsThatCostMoreThanAStepStop) {
  int64_t proposed[2] = {0, 0};
  for (int costly = 0; costly < 2; ++costly) {
    FakeEngine engine(kVocab, 128, 4);
    // The fake engine's steps take microseconds: a draft of 10 ms costs many steps.
    SchedulerOptions o = draft_options(std::make_shared<CostlyOracle>(&engine, costly ? 0.01 : 0.0), 8);
    o.spec.token_cost = 0.1;
    Scheduler sched(engine, nullptr, fake_config(), 128, 4, o);
    auto r = std::make_shared<Received>();
    ASSERT_TRUE(sched.submit(request(prompt_of(6, 1), 120), r->callback()).ok());
    sched.run_until_idle();
    expect_served(*r, engine.expected_tokens(prompt_of(6, 1), 120), FinishReason::kLength);
    proposed[costly] = sched.stats().spec_proposed_tokens;
  }
  // Cheap right guesses: the most drafts a step all along. Costly: drafts until the step times
  // are known (8 steps), then one probe every 8 steps.
  EXPECT_GT(proposed[0], 80) << proposed[0];
  EXPECT_LT(proposed[1], 40) << proposed[1];
}

}  // namespace
}  // namespace ltm
