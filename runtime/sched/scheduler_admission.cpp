// Deadline-aware admission on the scheduler's step thread (runtime/sched/admission.h): shedding
// waiting requests that cannot meet their deadline, the preemption victim, and the loads that
// submit() projects over.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "runtime/sched/scheduler.h"
#include "runtime/sched/scheduler_internal.h"

namespace ltm {

ProjectionLimits Scheduler::projection_limits() const {
  return {options_.max_running, options_.max_batch_tokens};
}

void Scheduler::shed_unreachable() {
  if (waiting_.empty() || !cost_.ready()) return;
  const std::chrono::steady_clock::time_point now = this->now();
  std::vector<SeqLoad> running, waiting;
  std::vector<double> deadline_in_s;
  for (const auto& s : running_) running.push_back(s->load());
  for (const auto& s : waiting_) {
    waiting.push_back(s->load());
    deadline_in_s.push_back(s->req.deadline == std::chrono::steady_clock::time_point::max()
                                ? std::numeric_limits<double>::infinity()
                                : std::chrono::duration<double>(s->req.deadline - now).count());
  }
  // A few at a time: the rest, if any, at the next step.
  const std::vector<ShedChoice> shed =
      choose_shed(cost_, running, waiting, deadline_in_s, projection_limits(), 1.0, 16);
  for (auto c = shed.rbegin(); c != shed.rend(); ++c) {  // from the back: indices stay valid
    auto it = waiting_.begin() + static_cast<std::ptrdiff_t>(c->index);
    const double retry_after_s = std::max(1.0, std::ceil(c->finish_s - deadline_in_s[c->index]));
    if (options_.metrics) options_.metrics->count_shed(ShedReason::kDeadline);
    finish(it->get(), FinishReason::kCancelled,
           with_retry_after(absl::ResourceExhaustedError(absl::StrFormat(
                                "deadline: shed while waiting: it would finish in about %.1f s, "
                                "after its deadline in %.1f s; retry after %.0f s",
                                c->finish_s, deadline_in_s[c->index], retry_after_s)),
                            retry_after_s));
    waiting_.erase(it);
  }
}

std::list<std::unique_ptr<Scheduler::Sequence>>::iterator Scheduler::pick_victim(
    std::list<std::unique_ptr<Sequence>>::iterator from) {
  // Not in flight: `from`, the newer ones, and the older ones already in this plan (they hold
  // blocks for it and can still yield them).
  std::vector<std::list<std::unique_ptr<Sequence>>::iterator> candidates;
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it == from || !(*it)->busy) candidates.push_back(it);
  const bool aware = options_.admission && cost_.ready() && candidates.size() > 1;
  std::vector<VictimCandidate> costs(candidates.size());
  if (aware) {
    std::vector<SeqLoad> running, waiting;
    for (const auto& s : running_) running.push_back(s->load());
    for (const auto& s : waiting_) waiting.push_back(s->load());
    const Projection p = project(cost_, running, waiting, projection_limits());
    const std::chrono::steady_clock::time_point now = this->now();
    size_t index = 0, c = 0;
    for (auto it = running_.begin(); it != running_.end() && c < candidates.size(); ++it, ++index) {
      if (it != candidates[c]) continue;
      const Sequence& s = **it;
      if (s.req.deadline != std::chrono::steady_clock::time_point::max())
        costs[c].slack_s =
            std::chrono::duration<double>(s.req.deadline - now).count() - p.running_s[index];
      // Preempted, it waits (first in line) until blocks free up, at the earliest when another
      // running sequence ends, then recomputes its tokens.
      double wait_s = std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < p.running_s.size(); ++j)
        if (j != index) wait_s = std::min(wait_s, p.running_s[j]);
      if (std::isinf(wait_s)) wait_s = 0;
      costs[c].recompute_s =
          wait_s + cost_.step_seconds(static_cast<int32_t>(s.tokens.size()));
      ++c;
    }
  }
  return candidates[choose_victim(costs, aware)];
}

void Scheduler::publish_loads() {
  std::vector<SeqLoad> running, waiting;
  std::vector<std::chrono::steady_clock::time_point> running_deadline, waiting_deadline;
  for (const auto& s : running_) {
    running.push_back(s->load());
    running_deadline.push_back(s->req.deadline);
  }
  for (const auto& s : waiting_) {
    waiting.push_back(s->load());
    waiting_deadline.push_back(s->req.deadline);
  }
  std::lock_guard<std::mutex> lock(mu_);
  published_cost_ = cost_;
  published_running_.swap(running);
  published_waiting_.swap(waiting);
  published_running_deadline_.swap(running_deadline);
  published_waiting_deadline_.swap(waiting_deadline);
}

}  // namespace ltm
