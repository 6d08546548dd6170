// ltm-bench's split of a batch's pass into prefill and decode (bench_main.cpp).
//
// Prefill ends when the last sequence gets its first token. Decode counts the tokens handed out in
// the steps after that one: with long prompts, continuous batching decodes the sequences that
// were admitted first while later ones are still in prefill (in the same steps as their prompt
// chunks), and those tokens do not belong to the decode window's time. A step's tokens are handed
// out together (one callback after another, microseconds apart); the steps of the last sequence
// to start (one event a step) mark the window's steps, and an event counts when it comes more
// than half of that sequence's shortest step after the end of prefill.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

namespace ltm {

struct DecodeWindow {
  std::chrono::steady_clock::time_point prefill_end, decode_end;
  int64_t tokens = 0;  // handed out in the steps after prefill_end's
  int64_t steps = 0;   // those steps
};

// events[s]: sequence s's events in order, (when, how many tokens); a sequence without one is
// ignored. decode_end is the last event.
inline DecodeWindow decode_window(
    const std::vector<std::vector<std::pair<std::chrono::steady_clock::time_point, int>>>& events) {
  using Clock = std::chrono::steady_clock;
  DecodeWindow w;
  const std::vector<std::pair<Clock::time_point, int>>* last_to_start = nullptr;
  for (const auto& ev : events) {
    if (ev.empty()) continue;
    if (last_to_start == nullptr || ev.front().first > w.prefill_end) {
      w.prefill_end = ev.front().first;
      last_to_start = &ev;
    }
    w.decode_end = std::max(w.decode_end, ev.back().first);
  }
  // No step after the one that ended prefill: nothing counts as decode.
  if (last_to_start == nullptr || last_to_start->size() < 2) return w;
  Clock::duration step = Clock::duration::max();
  for (size_t i = 1; i < last_to_start->size(); ++i)
    step = std::min(step, (*last_to_start)[i].first - (*last_to_start)[i - 1].first);
  const Clock::time_point cutoff = w.prefill_end + step / 2;
  w.steps = static_cast<int64_t>(last_to_start->size()) - 1;
  for (const auto& ev : events)
    for (const auto& [when, n] : ev)
      if (when > cutoff) w.tokens += n;
  return w;
}

}  // namespace ltm
