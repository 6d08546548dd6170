#include "runtime/sched/admission.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace ltm {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// How strongly the slope is pulled toward the prior, in tokens^2 of variance: negligible once
// the steps seen differ by a few tokens, decisive while they are all the same size.
constexpr double kSlopePrior = 1.0;
constexpr char kRetryAfterUrl[] = "ltm/retry-after-s";

}  // namespace

StepCostModel::StepCostModel(double prior_a_s, double prior_b_s, double decay)
    : prior_a_(prior_a_s), prior_b_(prior_b_s), decay_(decay), a_(prior_a_s), b_(prior_b_s) {}

void StepCostModel::observe(int32_t tokens, double s) {
  if (tokens <= 0 || !std::isfinite(s) || s < 0) return;
  const double x = tokens;
  w_ = decay_ * w_ + 1;
  sx_ = decay_ * sx_ + x;
  sy_ = decay_ * sy_ + s;
  sxx_ = decay_ * sxx_ + x * x;
  sxy_ = decay_ * sxy_ + x * s;
  n_++;
  refit();
}

void StepCostModel::refit() {
  const double mx = sx_ / w_, my = sy_ / w_;
  const double var = std::max(0.0, sxx_ / w_ - mx * mx);
  const double cov = sxy_ / w_ - mx * my;
  double b = (cov + kSlopePrior * prior_b_) / (var + kSlopePrior);
  if (b < 0) b = 0;
  double a = my - b * mx;
  if (a < 0) {  // the line through the origin that fits best
    a = 0;
    b = sxx_ > 0 ? std::max(0.0, sxy_ / sxx_) : prior_b_;
  }
  a_ = a;
  b_ = b;
}

double StepCostModel::step_seconds(int32_t tokens) const {
  return std::max(1e-6, a_ + b_ * std::max(0, tokens));
}

Projection project(const StepCostModel& model, const std::vector<SeqLoad>& running,
                   const std::vector<SeqLoad>& waiting, ProjectionLimits limits) {
  struct Sim {
    int32_t compute;
    int32_t generate;
    size_t index;
    bool waiting;
    int32_t chunk;
  };
  Projection p;
  p.running_s.assign(running.size(), 0.0);
  p.waiting_s.assign(waiting.size(), 0.0);
  const size_t max_running = static_cast<size_t>(std::max(1, limits.max_running));
  const int32_t budget0 = std::max(1, limits.max_batch_tokens);
  std::vector<Sim> live;
  for (size_t i = 0; i < running.size(); ++i)
    if (running[i].to_generate > 0)
      live.push_back({std::max(0, running[i].to_compute), running[i].to_generate, i, false, 0});
  auto record = [&](const Sim& s, double t) { (s.waiting ? p.waiting_s : p.running_s)[s.index] = t; };
  auto drop_finished = [&](double t) {
    live.erase(std::remove_if(live.begin(), live.end(),
                              [&](const Sim& s) {
                                if (s.generate > 0) return false;
                                record(s, t);
                                return true;
                              }),
               live.end());
  };
  size_t next = 0;
  double t = 0;
  int64_t guard = 0;
  while (!live.empty() || next < waiting.size()) {
    if (++guard > 4'000'000) {  // cannot happen with sane loads; never loop for ever
      for (const Sim& s : live) record(s, kInf);
      for (; next < waiting.size(); ++next) p.waiting_s[next] = kInf;
      break;
    }
    const bool can_admit = next < waiting.size() && live.size() < max_running;
    const bool all_decode =
        std::all_of(live.begin(), live.end(), [](const Sim& s) { return s.compute == 0; });
    if (all_decode && !can_admit && static_cast<int64_t>(live.size()) <= budget0) {
      // Every sequence decodes one token a step until the next one finishes: jump there.
      int32_t k = live.front().generate;
      for (const Sim& s : live) k = std::min(k, s.generate);
      t += k * model.step_seconds(static_cast<int32_t>(live.size()));
      for (Sim& s : live) s.generate -= k;
      drop_finished(t);
      continue;
    }
    int32_t budget = budget0, tokens = 0;
    for (Sim& s : live) {
      s.chunk = budget > 0 ? std::min(std::max(1, s.compute), budget) : 0;
      budget -= s.chunk;
      tokens += s.chunk;
    }
    while (next < waiting.size() && budget > 0 && live.size() < max_running) {
      const SeqLoad& w = waiting[next];
      Sim s{std::max(1, w.to_compute), w.to_generate, next, true, 0};
      ++next;
      if (s.generate <= 0) {
        p.waiting_s[s.index] = t;
        continue;
      }
      s.chunk = std::min(s.compute, budget);
      budget -= s.chunk;
      tokens += s.chunk;
      live.push_back(s);
    }
    if (tokens == 0) continue;  // only finished waiting entries were taken
    t += model.step_seconds(tokens);
    for (Sim& s : live) {
      if (s.chunk == 0) continue;
      if (s.compute > 0) {
        s.compute -= s.chunk;
        if (s.compute == 0) s.generate--;  // the prompt's last row samples the next token
      } else {
        s.generate--;
      }
      s.chunk = 0;
    }
    drop_finished(t);
  }
  return p;
}

AdmissionVerdict decide_admission(bool model_ready, double finish_s, double deadline_in_s,
                                  double fill) {
  AdmissionVerdict v;
  v.finish_s = finish_s;
  if (!model_ready || std::isinf(deadline_in_s) || finish_s <= fill * deadline_in_s) return v;
  v.admit = false;
  // The work ahead of it drains at the rate it was projected at: after the overshoot, the same
  // request would fit.
  v.retry_after_s = std::max(1.0, std::ceil(finish_s / fill - std::max(0.0, deadline_in_s)));
  if (!std::isfinite(v.retry_after_s)) v.retry_after_s = 3600;
  v.retry_after_s = std::min(v.retry_after_s, 3600.0);
  return v;
}

double harm_to_others(const Projection& without, const Projection& with,
                      const std::vector<double>& running_deadline_in_s,
                      const std::vector<double>& waiting_deadline_in_s) {
  double worst = 0;
  auto check = [&](const std::vector<double>& before, const std::vector<double>& after,
                   const std::vector<double>& deadline) {
    const size_t n = std::min({before.size(), after.size(), deadline.size()});
    for (size_t i = 0; i < n; ++i)
      if (before[i] <= deadline[i] && after[i] > deadline[i])
        worst = std::max(worst, after[i] - deadline[i]);
  };
  check(without.running_s, with.running_s, running_deadline_in_s);
  check(without.waiting_s, with.waiting_s, waiting_deadline_in_s);
  return worst;
}

std::vector<ShedChoice> choose_shed(const StepCostModel& model, const std::vector<SeqLoad>& running,
                                const std::vector<SeqLoad>& waiting,
                                const std::vector<double>& deadline_in_s, ProjectionLimits limits,
                                double fill, size_t max_shed) {
  std::vector<ShedChoice> shed;
  if (!model.ready()) return shed;
  std::vector<size_t> kept;  // indices into `waiting` still in the projection
  for (size_t i = 0; i < waiting.size(); ++i) kept.push_back(i);
  std::vector<SeqLoad> loads = waiting;
  size_t from = 0;  // entries before this one were reachable and stay so when later ones go
  while (shed.size() < max_shed) {
    const Projection p = project(model, running, loads, limits);
    size_t j = from;
    while (j < loads.size() && !(p.waiting_s[j] > fill * deadline_in_s[kept[j]])) ++j;
    if (j == loads.size()) break;
    shed.push_back({kept[j], p.waiting_s[j]});
    kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(j));
    loads.erase(loads.begin() + static_cast<std::ptrdiff_t>(j));
    from = j;
  }
  return shed;
}

size_t choose_victim(const std::vector<VictimCandidate>& candidates, bool deadline_aware) {
  const size_t newest = candidates.size() - 1;
  if (!deadline_aware) return newest;
  for (size_t i = candidates.size(); i-- > 0;)
    if (candidates[i].slack_s - candidates[i].recompute_s >= 0) return i;
  return newest;
}

absl::Status with_retry_after(absl::Status status, double retry_after_s) {
  const int64_t s = static_cast<int64_t>(std::max(1.0, std::ceil(retry_after_s)));
  status.SetPayload(kRetryAfterUrl, absl::Cord(std::to_string(s)));
  return status;
}

std::optional<int64_t> retry_after_of(const absl::Status& status) {
  const auto p = status.GetPayload(kRetryAfterUrl);
  int64_t s = 0;
  if (!p || !absl::SimpleAtoi(std::string(*p), &s)) return std::nullopt;
  return s;
}

}  // namespace ltm
