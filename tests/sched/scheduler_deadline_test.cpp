// Deadline-aware admission in the scheduler, on the fake engine (scheduler_rig.h) and a fake
// clock that each step advances by a set number of seconds, so the step cost model learns exact
// step times and every deadline is met or missed by construction, never by the machine's speed:
//   - a request that cannot meet its deadline is refused at submit() with a Retry-After, one that
//     can is admitted and served; with admission off, the same request is admitted;
//   - a waiting request is shed (ResourceExhausted, no token computed for it) once slower steps
//     make its deadline unreachable;
//   - when KV blocks run out, a running request with little slack is not the preemption victim
//     while an older one without a deadline can yield; with admission off the newest yields and
//     misses its deadline.
// Requests are submitted from the step thread (inside another request's callback), at a known
// step, so the test needs no threads and no waits.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "runtime/sched/admission.h"
#include "runtime/sched/metrics.h"
#include "tests/sched/scheduler_rig.h"

namespace ltm {
namespace {

using namespace sched_test;
using Clock = std::chrono::steady_clock;

// A clock that moves only when the fake engine runs a step.
struct FakeClock {
  Clock::time_point t = Clock::time_point() + std::chrono::hours(1);
  double step_s = 1.0;
  Clock::time_point in(double s) const {
    return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
};

struct DeadlineRig {
  FakeClock clock;
  ServeMetrics metrics;
  std::unique_ptr<Rig> rig;
  DeadlineRig(int32_t blocks, int32_t block_size, bool admission, int32_t max_running) {
    SchedulerOptions o;
    o.max_running = max_running;
    o.admission = admission;
    o.metrics = &metrics;
    o.clock = [this] { return clock.t; };
    rig = std::make_unique<Rig>(blocks, block_size, o);
    rig->engine.on_step = [this](const StepPlan&, StepOutput&) {
      clock.t = clock.in(clock.step_s);
    };
  }
  // Submits `r`; `at_token(n)` runs on the step thread after each of its events, with the
  // number of tokens received so far.
  std::shared_ptr<Received> submit_watching(GenerationRequest r,
                                            std::function<void(size_t)> at_token) {
    auto o = std::make_shared<Received>();
    EventCallback inner = o->callback();
    auto count = std::make_shared<size_t>(0);
    const absl::Status s = rig->scheduler.submit(
        std::move(r), [inner, count, at_token](GenerationEvent ev) {
          const size_t n = ev.token_ids.size();
          inner(std::move(ev));
          if (n == 0) return;
          *count += n;
          at_token(*count);
        });
    EXPECT_TRUE(s.ok()) << s;
    return o;
  }
};

GenerationRequest with_deadline(GenerationRequest r, Clock::time_point deadline) {
  r.deadline = deadline;
  return r;
}

TEST(SchedulerDeadline, RefusesWhatCannotMeetItsDeadlineWithARetryAfter) {
  DeadlineRig d(64, 16, /*admission=*/true, /*max_running=*/1);
  Rig& rig = *d.rig;
  absl::Status refused, admitted;
  std::shared_ptr<Received> c = std::make_shared<Received>();
  // A runs alone (one slot): 30 tokens, one a step. At its 10th token (10 steps seen, 21 to go),
  // B asks for 10 tokens within 15 s: it would wait for A, then take 10 steps: ~31 s.
  auto a = d.submit_watching(request(prompt_of(4, 1), 30, "a"), [&](size_t n) {
    if (n != 10) return;
    refused = rig.scheduler.submit(
        with_deadline(request(prompt_of(4, 2), 10, "b"), d.clock.in(15)),
        [](GenerationEvent) { ADD_FAILURE() << "a refused request got an event"; });
    admitted = rig.scheduler.submit(
        with_deadline(request(prompt_of(4, 3), 10, "c"), d.clock.in(60)), c->callback());
  });
  rig.scheduler.run_until_idle();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("deadline"), std::string::npos) << refused;
  ASSERT_TRUE(retry_after_of(refused).has_value()) << refused;
  // The projection's overshoot: ceil(31 / 0.9 - 15) = 20 s.
  EXPECT_EQ(*retry_after_of(refused), 20) << refused;
  EXPECT_TRUE(admitted.ok()) << admitted;
  expect_served(*a, rig.engine.expected_tokens(prompt_of(4, 1), 30), FinishReason::kLength);
  expect_served(*c, rig.engine.expected_tokens(prompt_of(4, 3), 10), FinishReason::kLength);
  EXPECT_EQ(d.metrics.refused(RefuseReason::kDeadline), 1u);
  EXPECT_EQ(d.metrics.shed(ShedReason::kDeadline), 0u);
  rig.expect_clean();
}

TEST(SchedulerDeadline, AdmissionOffAdmitsTheSameRequest) {
  DeadlineRig d(64, 16, /*admission=*/false, /*max_running=*/1);
  Rig& rig = *d.rig;
  absl::Status status = absl::UnknownError("not submitted");
  std::shared_ptr<Received> b = std::make_shared<Received>();
  auto a = d.submit_watching(request(prompt_of(4, 1), 30, "a"), [&](size_t n) {
    if (n == 10)
      status = rig.scheduler.submit(
          with_deadline(request(prompt_of(4, 2), 10, "b"), d.clock.in(15)), b->callback());
  });
  rig.scheduler.run_until_idle();
  EXPECT_TRUE(status.ok()) << status;
  expect_served(*a, rig.engine.expected_tokens(prompt_of(4, 1), 30), FinishReason::kLength);
  // Admitted, it waited for A and its deadline passed: ended as before, without a token.
  EXPECT_EQ(b->finals, 1);
  EXPECT_EQ(b->last.finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(b->tokens.empty());
  EXPECT_EQ(d.metrics.refused(RefuseReason::kDeadline), 0u);
  rig.expect_clean();
}

TEST(SchedulerDeadline, ShedsAWaitingRequestOnceItsDeadlineIsUnreachable) {
  DeadlineRig d(64, 16, /*admission=*/true, /*max_running=*/1);
  Rig& rig = *d.rig;
  std::shared_ptr<Received> b = std::make_shared<Received>();
  absl::Status status = absl::UnknownError("not submitted");
  // At A's 10th token B fits (A ends in ~31 s, B 5 s later, deadline 45 s); from A's 12th
  // token on, steps take 5 s, and B's projected finish passes its deadline within a few steps.
  auto a = d.submit_watching(request(prompt_of(4, 1), 40, "a"), [&](size_t n) {
    if (n == 10)
      status = rig.scheduler.submit(
          with_deadline(request(prompt_of(4, 2), 5, "b"), d.clock.in(45)), b->callback());
    if (n == 12) d.clock.step_s = 5;
  });
  rig.scheduler.run_until_idle();
  ASSERT_TRUE(status.ok()) << status;
  expect_served(*a, rig.engine.expected_tokens(prompt_of(4, 1), 40), FinishReason::kLength);
  EXPECT_EQ(b->finals, 1);
  EXPECT_TRUE(b->tokens.empty());
  EXPECT_EQ(b->last.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(b->last.status.code(), absl::StatusCode::kResourceExhausted) << b->last.status;
  EXPECT_NE(b->last.status.message().find("shed"), std::string::npos) << b->last.status;
  EXPECT_TRUE(retry_after_of(b->last.status).has_value());
  // Before it cost compute: every plan was A's (one prompt step, then one token a step).
  EXPECT_EQ(rig.engine.plans().size(), 40u);
  EXPECT_EQ(rig.engine.tokens_computed(), 4 + 39);
  EXPECT_EQ(d.metrics.shed(ShedReason::kDeadline), 1u);
  rig.expect_clean();
}

// S1 (no deadline) and S2 (a tight one) share 7 blocks of 4 tokens; together they need 9, so
// one must yield around S1's 13th token. S2 has 8 s of work and 12 s to do it in; preempted, it
// would wait for S1 to end (~8 s more) and recompute.
struct VictimRun {
  std::shared_ptr<Received> s1, s2;
  std::unique_ptr<DeadlineRig> d;
};

VictimRun run_victim_case(bool admission) {
  VictimRun v;
  v.d = std::make_unique<DeadlineRig>(7, 4, admission, 64);
  DeadlineRig& d = *v.d;
  v.s2 = std::make_shared<Received>();
  v.s1 = d.submit_watching(request(prompt_of(4, 1), 20, "s1"), [&d, s2 = v.s2](size_t n) {
    if (n != 8) return;
    const absl::Status s = d.rig->scheduler.submit(
        with_deadline(request(prompt_of(4, 2), 8, "s2"), d.clock.in(12)), s2->callback());
    EXPECT_TRUE(s.ok()) << s;
  });
  d.rig->scheduler.run_until_idle();
  return v;
}

TEST(SchedulerDeadline, PreemptionSparesTheRequestThatWouldMissItsDeadline) {
  VictimRun v = run_victim_case(/*admission=*/true);
  Rig& rig = *v.d->rig;
  EXPECT_GE(rig.scheduler.stats().preemptions, 1);
  expect_served(*v.s2, rig.engine.expected_tokens(prompt_of(4, 2), 8), FinishReason::kLength);
  expect_served(*v.s1, rig.engine.expected_tokens(prompt_of(4, 1), 20), FinishReason::kLength);
  rig.expect_clean();
}

TEST(SchedulerDeadline, WithAdmissionOffTheNewestYieldsAndMissesItsDeadline) {
  VictimRun v = run_victim_case(/*admission=*/false);
  Rig& rig = *v.d->rig;
  EXPECT_GE(rig.scheduler.stats().preemptions, 1);
  expect_served(*v.s1, rig.engine.expected_tokens(prompt_of(4, 1), 20), FinishReason::kLength);
  EXPECT_EQ(v.s2->finals, 1);
  EXPECT_EQ(v.s2->last.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(v.s2->tokens.size(), 8u);
  rig.expect_clean();
}

}  // namespace
}  // namespace ltm
