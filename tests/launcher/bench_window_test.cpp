// ltm-bench's prefill / decode split (launcher/bench_window.h) on made-up event times.
#include "launcher/bench_window.h"

#include <gtest/gtest.h>

namespace ltm {
namespace {

using Clock = std::chrono::steady_clock;
using Events = std::vector<std::vector<std::pair<Clock::time_point, int>>>;

Clock::time_point at_us(int64_t us) { return Clock::time_point{} + std::chrono::microseconds(us); }

// A sequence with one token at each of `times` (microseconds).
std::vector<std::pair<Clock::time_point, int>> seq(std::initializer_list<int64_t> times) {
  std::vector<std::pair<Clock::time_point, int>> ev;
  for (int64_t t : times) ev.emplace_back(at_us(t), 1);
  return ev;
}

TEST(DecodeWindow, OneSequenceCountsEveryTokenAfterTheFirst) {
  const DecodeWindow w = decode_window({seq({1000, 11000, 21000, 31000})});
  EXPECT_EQ(w.prefill_end, at_us(1000));
  EXPECT_EQ(w.decode_end, at_us(31000));
  EXPECT_EQ(w.tokens, 3);
  EXPECT_EQ(w.steps, 3);
}

TEST(DecodeWindow, TokensOfSequencesDecodingDuringPrefillDoNotCount) {
  // Sequence 0 starts first and, 10 ms a step, decodes beside sequence 1's prompt chunks; its last
  // token comes in the step that gives sequence 1 its first (handed out 2 us later), so neither
  // belongs to the decode window; then sequence 1 decodes alone for 4 steps.
  Events ev = {seq({0, 10000, 20000, 30000, 40002}), seq({40000, 50000, 60000, 70000, 80000})};
  DecodeWindow w = decode_window(ev);
  EXPECT_EQ(w.prefill_end, at_us(40000));
  EXPECT_EQ(w.decode_end, at_us(80000));
  EXPECT_EQ(w.tokens, 4);  // counting every token after the first ones would say 8
  EXPECT_EQ(w.steps, 4);
  // Two tokens an event (as speculative decoding hands out) count as two.
  ev[1].back().second = 2;
  EXPECT_EQ(decode_window(ev).tokens, 5);
}

TEST(DecodeWindow, ABatchDecodingTogether) {
  // Three sequences prefilled in two steps, then decoding together, one step each 5 ms; the
  // callbacks of a step a few microseconds apart, in any order.
  const DecodeWindow w = decode_window({seq({10000, 20003, 25001, 30002}),
                                        seq({10001, 20004, 25002, 30001}),
                                        seq({20000, 25000, 30000})});
  EXPECT_EQ(w.prefill_end, at_us(20000));
  EXPECT_EQ(w.decode_end, at_us(30002));
  EXPECT_EQ(w.tokens, 6);  // the steps at 25 and 30 ms, not the two tokens of the 20 ms step
  EXPECT_EQ(w.steps, 2);
}

TEST(DecodeWindow, NoDecodeStep) {
  const DecodeWindow one = decode_window({seq({1000}), seq({2000})});  // one token each
  EXPECT_EQ(one.prefill_end, at_us(2000));
  EXPECT_EQ(one.tokens, 0);
  EXPECT_EQ(one.steps, 0);
  const DecodeWindow none = decode_window({{}, {}});
  EXPECT_EQ(none.tokens, 0);
  EXPECT_EQ(none.steps, 0);
}

}  // namespace
}  // namespace ltm
