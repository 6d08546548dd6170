// The scheduler step by step, against a fake engine (tests/sched/fake_engine.h) whose tokens
// depend on what the plans' block tables read: admission, chunked prefill, micro-batches,
// preemption and resumption, cancellation and deadlines, drain, adapters, failed rows and
// prompt scoring. Each test checks the tokens against the fake model's own continuation of the
// prompt (FakeEngine::expected_tokens) and that the fake saw no inconsistent plan.
#include "runtime/sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/sched/scheduler_rig.h"

namespace ltm {
namespace {

using namespace sched_test;

using Clock = std::chrono::steady_clock;

TEST(Scheduler, ServesConcurrentRequestsWithTheModelsOwnTokens) {
  Rig rig(64, 4, SchedulerOptions{});
  std::vector<std::shared_ptr<Received>> out;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(prompt_of(3 + 5 * i, i));
    out.push_back(rig.submit(request(prompts.back(), 4 + i)));
  }
  rig.scheduler.run_until_idle();
  for (int i = 0; i < 5; ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompts[i], 4 + i), FinishReason::kLength);
  // All five admitted in the first plan (their prompts fit the budget), then decoded together.
  EXPECT_EQ(rig.engine.plans().front().input.n_seqs(), 5);
  EXPECT_EQ(rig.scheduler.stats().requests_served, 5);
  rig.expect_clean();
}

TEST(Scheduler, RefusesWhatCannotFitAndAFullQueue) {
  SchedulerOptions options;
  options.max_queue = 2;
  Rig rig(4, 4, options);  // 16 token slots
  auto big = std::make_shared<Received>();
  absl::Status s = rig.scheduler.submit(request(prompt_of(10, 0), 7), big->callback());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("KV cache"), std::string::npos) << s;
  GenerationRequest stop = request(prompt_of(2, 0), 2);
  stop.stop = {"x"};
  EXPECT_EQ(rig.scheduler.submit(stop, big->callback()).code(), absl::StatusCode::kInvalidArgument);
  auto a = rig.submit(request(prompt_of(2, 1), 2));
  auto b = rig.submit(request(prompt_of(2, 2), 2));
  s = rig.scheduler.submit(request(prompt_of(2, 3), 2), big->callback());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  rig.scheduler.run_until_idle();
  EXPECT_EQ(big->finals, 0);  // refused requests never hear back
  expect_served(*a, rig.engine.expected_tokens(prompt_of(2, 1), 2), FinishReason::kLength);
  expect_served(*b, rig.engine.expected_tokens(prompt_of(2, 2), 2), FinishReason::kLength);
  rig.expect_clean();
}

TEST(Scheduler, AdmitsOnlyWhenTheWholeContextFitsAndInArrivalOrder) {
  Rig rig(6, 4, SchedulerOptions{});  // 24 slots
  // The first holds 4 blocks (13 + 1 tokens: 4 blocks); the second needs 4 and waits.
  auto a = rig.submit(request(prompt_of(13, 0), 3));
  auto b = rig.submit(request(prompt_of(13, 1), 3));
  rig.scheduler.run_until_idle();
  expect_served(*a, rig.engine.expected_tokens(prompt_of(13, 0), 3), FinishReason::kLength);
  expect_served(*b, rig.engine.expected_tokens(prompt_of(13, 1), 3), FinishReason::kLength);
  EXPECT_EQ(rig.engine.plans().front().input.n_seqs(), 1);
  EXPECT_EQ(rig.scheduler.stats().preemptions, 0);
  rig.expect_clean();
}

TEST(Scheduler, ChunksALongPromptByTheTokenBudget) {
  SchedulerOptions options;
  options.max_batch_tokens = 8;
  Rig rig(32, 4, options);
  const auto prompt = prompt_of(21, 4);
  auto o = rig.submit(request(prompt, 3));
  rig.scheduler.run_until_idle();
  expect_served(*o, rig.engine.expected_tokens(prompt, 3), FinishReason::kLength);
  const auto& plans = rig.engine.plans();
  ASSERT_GE(plans.size(), 5u);
  EXPECT_EQ(plans[0].input.n_tokens(), 8);
  EXPECT_EQ(plans[1].input.n_tokens(), 8);
  EXPECT_EQ(plans[2].input.n_tokens(), 5);
  EXPECT_EQ(plans[1].input.positions.front(), 8);
  EXPECT_EQ(plans[2].input.context_lens[0], 21);
  EXPECT_TRUE(plans[0].input.logit_rows.empty());  // nothing sampled mid-prompt
  EXPECT_EQ(plans[2].input.logit_rows.size(), 1u);
  rig.expect_clean();
}

TEST(Scheduler, MicroBatchesKeepPlansInFlightWithoutSharingASequence) {
  SchedulerOptions options;
  options.micro_batches = 2;
  Rig rig(64, 4, options);
  std::vector<std::shared_ptr<Received>> out;
  for (int i = 0; i < 4; ++i) out.push_back(rig.submit(request(prompt_of(5 + i, i), 6)));
  // No sequence may be in two plans in flight at once: its next token is not known yet.
  std::vector<std::set<int32_t>> in_flight_slots;
  rig.engine.on_step = [&](const StepPlan& plan, StepOutput&) {
    std::set<int32_t> blocks(plan.input.block_tables.begin(), plan.input.block_tables.end());
    for (const auto& other : in_flight_slots)
      for (int32_t r = 0; r < plan.input.n_tokens(); ++r)
        EXPECT_FALSE(other.count(plan.input.slot_mapping[r] / 4)) << "a sequence in two plans";
    in_flight_slots.push_back(std::set<int32_t>());
    for (int32_t r = 0; r < plan.input.n_tokens(); ++r)
      in_flight_slots.back().insert(plan.input.slot_mapping[r] / 4);
  };
  rig.engine.before_collect = [&] { in_flight_slots.erase(in_flight_slots.begin()); };
  rig.scheduler.run_until_idle();
  for (int i = 0; i < 4; ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompt_of(5 + i, i), 6),
                  FinishReason::kLength);
  EXPECT_EQ(rig.engine.max_in_flight(), 2);
  EXPECT_EQ(rig.engine.plans().front().input.n_seqs(), 2);  // half the sequences each
  rig.expect_clean();
}

TEST(Scheduler, PreemptsTheNewestWhenBlocksRunOutAndResumesItWithTheSameTokens) {
  SchedulerOptions options;
  Rig rig(8, 4, options);  // 32 slots; three requests growing to 6 + 12 = 18 tokens each
  std::vector<std::shared_ptr<Received>> out;
  for (int i = 0; i < 3; ++i) out.push_back(rig.submit(request(prompt_of(6, i), 12)));
  rig.scheduler.run_until_idle();
  for (int i = 0; i < 3; ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompt_of(6, i), 12), FinishReason::kLength);
  EXPECT_GT(rig.scheduler.stats().preemptions, 0);
  rig.expect_clean();
}

TEST(Scheduler, ScoresEveryPromptTokenOnceThroughPreemption) {
  SchedulerOptions options;
  options.max_batch_tokens = 4;
  Rig rig(6, 4, options);  // 24 slots: the long request is preempted by the older one's growth
  auto first = rig.submit(request(prompt_of(3, 9), 14));
  GenerationRequest scored = request(prompt_of(7, 8), 10);
  scored.score_prompt = true;
  scored.logprob_alternatives = 2;
  const auto prompt = scored.prompt_ids;
  auto o = rig.submit(scored);
  rig.scheduler.run_until_idle();
  expect_served(*first, rig.engine.expected_tokens(prompt_of(3, 9), 14), FinishReason::kLength);
  expect_served(*o, rig.engine.expected_tokens(prompt, 10), FinishReason::kLength);
  ASSERT_EQ(o->prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    EXPECT_EQ(o->prompt_logprobs[i].token, prompt[i + 1]);
    EXPECT_EQ(o->prompt_logprobs[i].n_top, 2);
  }
  EXPECT_GT(rig.scheduler.stats().preemptions, 0);
  rig.expect_clean();
}

TEST(Scheduler, CancellationAndDeadlinesEndARequestAndFreeItsBlocks) {
  Rig rig(32, 4, SchedulerOptions{});
  GenerationRequest c = request(prompt_of(5, 1), 50);
  auto cancel = c.cancel;
  auto cancelled = std::make_shared<Received>();
  ASSERT_TRUE(rig.scheduler
                  .submit(c,
                          [&, inner = cancelled->callback()](GenerationEvent ev) {
                            inner(ev);  // cancels itself after its third token
                            if (cancelled->tokens.size() >= 3) cancel->cancelled = true;
                          })
                  .ok());
  GenerationRequest late = request(prompt_of(5, 2), 5);
  late.deadline = Clock::now() - std::chrono::seconds(1);
  auto expired = rig.submit(late);
  auto ok = rig.submit(request(prompt_of(5, 3), 8));
  rig.scheduler.run_until_idle();
  EXPECT_EQ(cancelled->finals, 1);
  EXPECT_EQ(cancelled->last.finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(cancelled->last.status.ok());
  EXPECT_EQ(cancelled->tokens.size(), 3u);  // reaped at the next step: no token after the cancel
  EXPECT_EQ(expired->finals, 1);
  EXPECT_EQ(expired->last.finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(expired->tokens.empty());
  expect_served(*ok, rig.engine.expected_tokens(prompt_of(5, 3), 8), FinishReason::kLength);
  rig.expect_clean();
}

TEST(Scheduler, AFailedRowEndsOnlyItsRequest) {
  Rig rig(32, 4, SchedulerOptions{});
  auto bad = rig.submit(request(prompt_of(4, 1), 5, "bad"));
  auto good = rig.submit(request(prompt_of(4, 2), 5, "good"));
  int plans = 0;
  rig.engine.on_step = [&](const StepPlan&, StepOutput& out) {
    if (++plans == 2) out.samples[0] = SampleResult::failed(RowError::kNaN);
  };
  rig.scheduler.run_until_idle();
  EXPECT_EQ(bad->last.finish_reason, FinishReason::kError);
  EXPECT_EQ(bad->last.status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad->last.status.message().find("NaN"), std::string::npos) << bad->last.status;
  EXPECT_EQ(bad->tokens.size(), 1u);
  expect_served(*good, rig.engine.expected_tokens(prompt_of(4, 2), 5), FinishReason::kLength);
  rig.expect_clean();
}

TEST(Scheduler, DrainFinishesRunningWorkAndRefusesNewThenAPastDeadlineCancels) {
  Rig rig(32, 4, SchedulerOptions{});
  std::thread step([&] { rig.scheduler.serve(); });
  auto a = rig.submit(request(prompt_of(4, 1), 20));
  a->wait_tokens(1);  // running
  rig.scheduler.stop(Clock::now() + std::chrono::hours(1));
  auto refused = std::make_shared<Received>();
  absl::Status s = rig.scheduler.submit(request(prompt_of(4, 2), 2), refused->callback());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  step.join();  // serve() returns once `a` is done
  expect_served(*a, rig.engine.expected_tokens(prompt_of(4, 1), 20), FinishReason::kLength);
  rig.expect_clean();

  Rig rig2(32, 4, SchedulerOptions{});
  std::thread step2([&] { rig2.scheduler.serve(); });
  // The engine holds the second plan until stop() has been called (a handshake, not a sleep).
  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;
  int collects = 0;
  rig2.engine.before_collect = [&] {
    if (++collects != 2) return;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stopped; });
  };
  auto b = rig2.submit(request(prompt_of(4, 3), 100));
  b->wait_tokens(1);
  rig2.scheduler.stop(Clock::now() - std::chrono::seconds(1));
  {
    std::lock_guard<std::mutex> lock(mu);
    stopped = true;
  }
  cv.notify_all();
  step2.join();
  EXPECT_EQ(b->finals, 1);
  EXPECT_EQ(b->last.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(b->last.status.code(), absl::StatusCode::kUnavailable) << b->last.status;
  EXPECT_LT(b->tokens.size(), 100u);
  for (const std::string& e : rig2.engine.errors()) ADD_FAILURE() << "fake engine: " << e;
}

TEST(Scheduler, AdaptersRunUnderTheirIdAndUnloadWaitsForTheirRequests) {
  Rig rig(64, 4, SchedulerOptions{});
  ASSERT_TRUE(rig.scheduler.load_adapter("a", "/lora/a").ok());
  ASSERT_TRUE(rig.scheduler.load_adapter("b", "/lora/b").ok());
  EXPECT_EQ(rig.scheduler.load_adapter("a", "/lora/a").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(rig.scheduler.load_adapter("c", "/lora/bad").ok());
  ASSERT_EQ(rig.engine.loads().size(), 2u);
  const int32_t id_a = rig.engine.loads()[0], id_b = rig.engine.loads()[1];
  auto o = std::make_shared<Received>();
  GenerationRequest unknown = request(prompt_of(4, 0), 2);
  unknown.adapter = "nope";
  EXPECT_EQ(rig.scheduler.submit(unknown, o->callback()).code(), absl::StatusCode::kNotFound);

  const auto prompt = prompt_of(6, 5);  // the same prompt on the base model and each adapter
  GenerationRequest ra = request(prompt, 5), rb = request(prompt, 5), r0 = request(prompt, 5);
  ra.adapter = "a";
  rb.adapter = "b";
  auto oa = rig.submit(ra), ob = rig.submit(rb), o0 = rig.submit(r0);
  // Unloading "a" while its request runs: done only once that request has finished.
  absl::StatusOr<AdapterStatus> unloaded = absl::UnknownError("not yet");
  int done_calls = 0;
  AdapterOp op;
  op.kind = AdapterOp::Kind::kUnload;
  op.name = "a";
  op.done = [&](absl::StatusOr<AdapterStatus> s) {
    unloaded = s;
    done_calls++;
    EXPECT_EQ(oa->finals, 1) << "unloaded before its request finished";
  };
  rig.scheduler.submit_adapter_op(op);
  rig.scheduler.run_until_idle();
  expect_served(*oa, rig.engine.expected_tokens(prompt, 5, id_a), FinishReason::kLength);
  expect_served(*ob, rig.engine.expected_tokens(prompt, 5, id_b), FinishReason::kLength);
  expect_served(*o0, rig.engine.expected_tokens(prompt, 5, 0), FinishReason::kLength);
  EXPECT_NE(oa->tokens, ob->tokens);  // the fake's adapters change the model
  EXPECT_EQ(done_calls, 1);
  ASSERT_TRUE(unloaded.ok()) << unloaded.status();
  EXPECT_FALSE(unloaded->loaded);
  EXPECT_EQ(rig.engine.unloads(), std::vector<int32_t>{id_a});
  // Each plan groups one adapter's rows together.
  for (const StepPlan& p : rig.engine.plans())
    EXPECT_TRUE(std::is_sorted(p.input.adapter_ids.begin(), p.input.adapter_ids.end()));

  // A forced unload aborts the requests that name it.
  GenerationRequest rb2 = request(prompt, 30);
  rb2.adapter = "b";
  auto ob2 = rig.submit(rb2);
  AdapterOp force;
  force.kind = AdapterOp::Kind::kUnload;
  force.name = "b";
  force.force = true;
  force.done = [&](absl::StatusOr<AdapterStatus> s) { EXPECT_TRUE(s.ok()) << s.status(); };
  rig.scheduler.submit_adapter_op(force);
  rig.scheduler.run_until_idle();
  EXPECT_EQ(ob2->last.finish_reason, FinishReason::kError);
  EXPECT_EQ(ob2->last.status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(rig.scheduler.adapters().empty());
  rig.expect_clean();
}

}  // namespace
}  // namespace ltm
