// Bounded JSON parsing (common/json_parse.h): the value nlohmann's parse gives, except that depth,
// duplicate keys and the faults of the lexer are refused naming their place; and the cost of a
// body of many keys is O(n log n) key comparisons (counted), not ordered_json's O(n^2) scan.
#include "common/json_parse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

namespace ltm {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

struct Refusal {
  std::string message;
  JsonFault fault;
};
Refusal refuse(const std::string& text, int max_depth = kMaxJsonDepth) {
  JsonFault f;
  absl::StatusOr<json> j = parse_json(text, &f, max_depth);
  EXPECT_FALSE(j.ok()) << text << " was accepted";
  if (j.ok()) return {};
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  return {std::string(j.status().message()), f};
}

TEST(JsonParse, GivesWhatNlohmannGives) {
  for (const char* text :
       {R"({"a": [1, -2, 3.5, true, false, null, "x\u00e9\ud83d\ude00"], "b": {"c": {}}, "d": []})",
        "[]", "0", "\"s\"", "  {\"k\": 18446744073709551615}  ",
        "[1e308, -1e-400, 12345678901234567890123]"}) {
    absl::StatusOr<json> j = parse_json(text);
    ASSERT_TRUE(j.ok()) << text << ": " << j.status();
    EXPECT_EQ(*j, json::parse(text)) << text;
  }
}

TEST(JsonParse, SyntaxErrorsAreNlohmannsMessages) {
  Refusal r = refuse("{\"a\": ");
  EXPECT_THAT(r.message, HasSubstr("a: [json.exception.parse_error.101]"));
  EXPECT_EQ(r.fault.field, "a");
  r = refuse("{} x");
  EXPECT_THAT(r.message, HasSubstr("parse_error"));
  EXPECT_EQ(r.fault.path, "");
  r = refuse("");
  EXPECT_THAT(r.message, HasSubstr("parse_error"));
  r = refuse("{\"a\": \"\xff\"}");  // invalid UTF-8
  EXPECT_THAT(r.message, HasSubstr("a: "));
  EXPECT_THAT(r.message, HasSubstr("ill-formed UTF-8"));
}

TEST(JsonParse, DuplicateKeysAreRefusedWithTheirPath) {
  Refusal r = refuse(R"({"temperature": 1, "top_p": 1, "temperature": 2})");
  EXPECT_EQ(r.message, "temperature: duplicate key");
  EXPECT_EQ(r.fault.field, "temperature");
  r = refuse(R"({"stream_options": {"include_usage": true, "include_usage": false}})");
  EXPECT_EQ(r.message, "stream_options.include_usage: duplicate key");
  EXPECT_EQ(r.fault.field, "stream_options");
  r = refuse(R"({"a": [{}, {"x": 1, "x": 1}]})");
  EXPECT_EQ(r.message, "a[1].x: duplicate key");
  // The same key in different objects is not a duplicate.
  EXPECT_TRUE(parse_json(R"({"x": {"x": 1}, "y": [{"x": 1}, {"x": 2}]})").ok());
}

TEST(JsonParse, NumbersPastADoubleAreRefusedNamingTheField) {
  Refusal r = refuse(R"({"prompt": "hi", "temperature": 1e400})");
  EXPECT_EQ(r.message, "temperature: number 1e400 is out of range");
  EXPECT_EQ(r.fault.field, "temperature");
  r = refuse(R"({"stop": [1, -1e400]})");
  EXPECT_EQ(r.message, "stop[1]: number -1e400 is out of range");
  // A number token of a megabyte is cut in the message.
  r = refuse("[" + std::string(1 << 20, '9') + "e9999]");
  EXPECT_LT(r.message.size(), 100u);
  EXPECT_THAT(r.message, HasSubstr("is out of range"));
}

TEST(JsonParse, LoneSurrogatesAreRefusedNamingTheField) {
  Refusal r = refuse(R"({"prompt": "a\ud800"})");
  EXPECT_THAT(r.message, HasSubstr("prompt: "));
  EXPECT_THAT(r.message, HasSubstr("surrogate"));
  EXPECT_EQ(r.fault.field, "prompt");
  r = refuse(R"({"stop": ["ok", "\udc00"]})");
  EXPECT_THAT(r.message, HasSubstr("stop[1]: "));
  EXPECT_EQ(r.fault.field, "stop");
  // In a key: the place is the object holding it.
  r = refuse(R"({"o": {"\ud800": 1}})");
  EXPECT_THAT(r.message, HasSubstr("o: "));
  EXPECT_THAT(r.message, HasSubstr("surrogate"));
}

TEST(JsonParse, DepthIsBoundedWhenTheContainerOpens) {
  std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(parse_json(ok).ok());
  Refusal r = refuse(std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']'));
  EXPECT_THAT(r.message, HasSubstr("nests deeper than 64 levels"));
  // A million '['s and nothing else: refused at the 65th, not at the end of the text (which
  // would be a syntax error: the message says depth).
  r = refuse(std::string(1000000, '['));
  EXPECT_THAT(r.message, HasSubstr("nests deeper than 64 levels"));
  r = refuse(R"({"a": {"b": [[1]]}})", 3);
  EXPECT_EQ(r.message, "a.b[0]: nests deeper than 3 levels");
  EXPECT_EQ(r.fault.field, "a");
}

TEST(JsonParse, LongKeysAreCutInTheMessage) {
  const std::string key(1 << 20, 'k');
  Refusal r = refuse("{\"" + key + "\": 1, \"" + key + "\": 2}");
  EXPECT_EQ(r.message, std::string(32, 'k') + "...: duplicate key");
  // Not inside a UTF-8 sequence: 31 ASCII bytes and a 2-byte character.
  const std::string k2 = std::string(31, 'a') + "\xc3\xa9" + "zz";
  r = refuse("{\"" + k2 + "\": 1, \"" + k2 + "\": 2}");
  EXPECT_EQ(r.message, std::string(31, 'a') + "...: duplicate key");
  // A path 65 levels of long keys deep is cut; the reason is kept whole.
  std::string deep;
  for (int i = 0; i <= kMaxJsonDepth; ++i) deep += "{\"" + key.substr(0, 100) + "\": ";
  r = refuse(deep);
  EXPECT_THAT(r.message, ::testing::EndsWith("...: nests deeper than 64 levels"));
  EXPECT_LT(r.message.size(), 600u);
  // And a string token of a megabyte in nlohmann's message.
  r = refuse("{\"a\": \"" + key + "\\ud800\"}");
  EXPECT_THAT(r.message, HasSubstr("a: [json.exception.parse_error.101]"));
  EXPECT_LT(r.message.size(), 600u);
}

TEST(JsonParse, BriefDescribesContainersBySize) {
  EXPECT_EQ(json_brief(json::parse("[1, [2, 3]]")), "a list of 2 elements");
  EXPECT_EQ(json_brief(json::parse(R"({"a": 1})")), "an object of 1 keys");
  EXPECT_EQ(json_brief(json("x")), "\"x\"");
  EXPECT_EQ(json_brief(json(std::string(1000, 'y'))), "\"" + std::string(64, 'y') + "...\"");
  EXPECT_EQ(json_brief(json(7)), "7");
}

// --- the cost of many keys, counted --------------------------------------------------------------
// An object type whose comparator counts: parse_json into it and count the key comparisons a
// body of n distinct keys costs. ordered_json (what the HTTP body was parsed into) finds a key by
// comparing it with every key before it: n (n - 1) / 2 comparisons, 2.8e9 for 75,000 keys.
int64_t g_comparisons = 0;
struct CountingLess {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    ++g_comparisons;
    return std::less<>()(a, b);
  }
};
template <class K, class V, class C, class A>
using CountingMap = std::map<K, V, CountingLess, A>;
using CountingJson = nlohmann::basic_json<CountingMap>;

int64_t comparisons_for_keys(int n) {
  std::string body = "{";
  for (int i = 0; i < n; ++i) absl::StrAppend(&body, i ? "," : "", "\"k", i * 7919 % n, "\":", i);
  body += "}";
  g_comparisons = 0;
  absl::StatusOr<CountingJson> j = parse_json<CountingJson>(body);
  EXPECT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->size(), static_cast<size_t>(n));
  return g_comparisons;
}

TEST(JsonParse, ManyKeysCostLogarithmicComparisonsEach) {
  const int n = 75000;
  const int64_t c = comparisons_for_keys(n);
  // One map insertion per key, finding the duplicate too: about log2(75000) = 16.2 comparisons
  // (std::map's red-black tree is at most 2 log2 n deep).
  EXPECT_LT(c, int64_t{n} * 2 * 17) << c << " comparisons for " << n << " keys";
  EXPECT_GT(c, int64_t{n}) << "the counter counts";
  // And it grows as n log n: twice the keys, about twice the comparisons.
  const int64_t c2 = comparisons_for_keys(2 * n);
  EXPECT_LT(static_cast<double>(c2) / static_cast<double>(c), 2.3) << c2 << " / " << c;
}

// The default the callers use is a std::map object (ordered_json's object is a vector searched
// linearly).
static_assert(std::is_same_v<nlohmann::json::object_t,
                             std::map<std::string, nlohmann::json, std::less<>>>);

}  // namespace
}  // namespace ltm
