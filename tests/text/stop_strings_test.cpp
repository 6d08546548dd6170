// StopMatcher: hand-written streams (stops across pushes, overlapping stops, held prefixes that
// fail, multibyte UTF-8) and a randomized check of the contract against a direct reference.
#include "runtime/text/stop_strings.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ltm {
namespace {

struct StreamRun {
  std::vector<std::string> emits;
  std::string flushed;
  std::string all;     // emits + flush
  int stopped_at = -1;  // index of the push that reported the stop, or -1
  bool stopped = false;
};

StreamRun run(const std::vector<std::string>& stops, const std::vector<std::string>& pushes) {
  StopMatcher m(stops);
  StreamRun r;
  for (size_t i = 0; i < pushes.size(); ++i) {
    StopMatcher::Result res = m.push(pushes[i]);
    if (res.stopped && r.stopped_at < 0) r.stopped_at = static_cast<int>(i);
    r.emits.push_back(res.emit);
    r.all += res.emit;
  }
  r.flushed = m.flush();
  r.all += r.flushed;
  r.stopped = m.stopped();
  return r;
}

// The contract, computed directly on the whole text.
std::string reference(const std::vector<std::string>& stops, const std::string& text) {
  size_t first = std::string::npos;
  for (const std::string& s : stops)
    if (!s.empty()) first = std::min(first, text.find(s));
  return first == std::string::npos ? text : text.substr(0, first);
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t j = 1; j < len; ++j)
      if ((static_cast<unsigned char>(s[i + j]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

TEST(StopMatcher, NoStopsPassesTextThrough) {
  const StreamRun r = run({}, {"Hello", ", ", "world"});
  EXPECT_EQ(r.emits, (std::vector<std::string>{"Hello", ", ", "world"}));
  EXPECT_EQ(r.flushed, "");
  EXPECT_FALSE(r.stopped);
}

TEST(StopMatcher, StopInsideOnePush) {
  const StreamRun r = run({"END"}, {"Hello END world"});
  EXPECT_EQ(r.emits[0], "Hello ");
  EXPECT_EQ(r.stopped_at, 0);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.all, "Hello ");
}

TEST(StopMatcher, StopSpanningPushesIsHeldThenDropped) {
  const StreamRun r = run({"END"}, {"Hel", "lo E", "N", "D more", "ignored"});
  EXPECT_EQ(r.emits, (std::vector<std::string>{"Hel", "lo ", "", "", ""}));
  EXPECT_EQ(r.stopped_at, 3);
  EXPECT_EQ(r.all, "Hello ");
}

TEST(StopMatcher, HeldPrefixThatFailsIsReleased) {
  const StreamRun r = run({"END"}, {"abcE", "x", "EN", "d"});
  EXPECT_EQ(r.emits, (std::vector<std::string>{"abc", "Ex", "", "ENd"}));
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.all, "abcExENd");
}

TEST(StopMatcher, FlushReleasesAnUnfinishedPrefix) {
  const StreamRun r = run({"END"}, {"abc EN"});
  EXPECT_EQ(r.emits[0], "abc ");
  EXPECT_EQ(r.flushed, "EN");
  EXPECT_FALSE(r.stopped);
}

TEST(StopMatcher, StopAtTheVeryStart) {
  const StreamRun r = run({"<|end|>"}, {"<|end|>", "text"});
  EXPECT_EQ(r.all, "");
  EXPECT_EQ(r.stopped_at, 0);
}

TEST(StopMatcher, EarliestStartWinsOverEarliestCompletion) {
  // "bc" completes first, but "abcd" starts earlier: wait for it.
  StreamRun r = run({"abcd", "bc"}, {"ab", "c", "d"});
  EXPECT_EQ(r.emits, (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(r.stopped_at, 2);
  EXPECT_EQ(r.all, "");
  // The longer one fails: the shorter one's match stands.
  r = run({"abcd", "bc"}, {"ab", "c", "e"});
  EXPECT_EQ(r.stopped_at, 2);
  EXPECT_EQ(r.all, "a");
  // The stream ends while the longer one is pending: flush cuts at the shorter one.
  r = run({"abcd", "bc"}, {"xabc"});
  EXPECT_EQ(r.emits[0], "x");
  EXPECT_FALSE(r.stopped_at >= 0);
  EXPECT_EQ(r.flushed, "a");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcher, SelfOverlappingStop) {
  const StreamRun r = run({"aab"}, {"a", "a", "a", "b", "c"});
  EXPECT_EQ(r.emits, (std::vector<std::string>{"", "", "a", "", ""}));
  EXPECT_EQ(r.stopped_at, 3);
  EXPECT_EQ(r.all, "a");
}

TEST(StopMatcher, OneStopInsideAnother) {
  EXPECT_EQ(run({"xyz", "y"}, {"axyz"}).all, "a");    // both at 1/2: "xyz" starts first
  EXPECT_EQ(run({"xyz", "y"}, {"ax", "yq"}).all, "ax");  // "xyz" fails; "y" at 2
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  const StreamRun r = run({"", "STOP"}, {"go on", " STOP"});
  EXPECT_EQ(r.all, "go on ");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcher, MultibyteStopFedByteByByte) {
  const std::string text = "你好世界! more";
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  const StreamRun r = run({"世界"}, bytes);
  EXPECT_EQ(r.all, "你好");
  EXPECT_TRUE(r.stopped);
  for (const std::string& e : r.emits) EXPECT_TRUE(valid_utf8(e)) << e;
}

TEST(StopMatcher, SplitCharactersAreHeldUntilComplete) {
  // "é" is C3 A9, "€" is E2 82 AC, "😀" is F0 9F 98 80.
  const StreamRun r = run({"STOP"}, {"caf\xC3", "\xA9 \xE2\x82", "\xAC \xF0\x9F", "\x98", "\x80!"});
  EXPECT_EQ(r.emits, (std::vector<std::string>{"caf", "\xC3\xA9 ", "\xE2\x82\xAC ", "", "\xF0\x9F\x98\x80!"}));
  EXPECT_EQ(r.all, "café € 😀!");
  // A stream that ends inside a character hands the bytes over at flush.
  const StreamRun cut = run({}, {"ab\xE2\x82"});
  EXPECT_EQ(cut.emits[0], "ab");
  EXPECT_EQ(cut.flushed, "\xE2\x82");
}

TEST(StopMatcher, StopsThatShareAMultibytePrefix) {
  // "éa" and "éb" share the bytes of "é"; "é" followed by "c" is released.
  const StreamRun r = run({"\xC3\xA9" "a", "\xC3\xA9" "b"}, {"x\xC3", "\xA9", "c\xC3\xA9", "b tail"});
  EXPECT_EQ(r.all, "x\xC3\xA9" "c");
  EXPECT_EQ(r.stopped_at, 3);
}

TEST(StopMatcher, RandomStreamsMatchTheContract) {
  // Small alphabets make stops frequent, overlapping and partially matched.
  const std::vector<std::string> alphabet = {"a", "b", "c", "\xC3\xA9", "\xE4\xB8\x96"};
  uint64_t state = 12345;
  auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  int stopped_runs = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::string> stops(1 + next(3));
    for (std::string& s : stops)
      for (uint64_t len = 1 + next(4); len > 0; --len) s += alphabet[next(alphabet.size())];
    std::string text;
    for (uint64_t len = next(30); len > 0; --len) text += alphabet[next(alphabet.size())];
    // Split anywhere, even inside characters.
    std::vector<std::string> pushes;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t len = std::min(text.size() - pos, static_cast<size_t>(next(6)));
      pushes.push_back(text.substr(pos, len));
      pos += len;
    }
    const StreamRun r = run(stops, pushes);
    const std::string want = reference(stops, text);
    ASSERT_EQ(r.all, want) << "iteration " << iter << " text '" << text << "'";
    ASSERT_EQ(r.stopped, want.size() < text.size()) << "iteration " << iter;
    for (const std::string& e : r.emits) ASSERT_TRUE(valid_utf8(e)) << "iteration " << iter;
    // Once a push reports the stop, every later push emits nothing.
    if (r.stopped_at >= 0) {
      for (size_t i = r.stopped_at + 1; i < r.emits.size(); ++i) ASSERT_EQ(r.emits[i], "");
    }
    stopped_runs += r.stopped;
  }
  EXPECT_GT(stopped_runs, 2000);  // the test exercised stops, not only pass-through
}

}  // namespace
}  // namespace ltm
