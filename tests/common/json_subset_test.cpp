// The GPU-only build's JSON stand-in (common/fallback/json_subset.h) against nlohmann's, on the
// same texts and the same building calls: what parse_json (common/json_parse.h) accepts and
// refuses (and where), the values it builds (compared through their dumps), and what the
// writers the GPU-only targets use produce (compact, indented, ordered, invalid UTF-8 replaced).
#include "common/fallback/json_subset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/json_parse.h"

namespace ltm {
namespace {

using Ours = json_subset::json;
using OursOrdered = json_subset::ordered_json;
using Theirs = nlohmann::json;
using TheirsOrdered = nlohmann::ordered_json;

TEST(JsonSubset, ParsesAndDumpsAsNlohmannDoes) {
  const std::vector<std::string> texts = {
      R"({"a": [1, -2, 3.5, true, false, null, "x\u00e9\ud83d\ude00"], "b": {"c": {}}, "d": []})",
      "[]", "{}", "0", "-0", "-0.0", "\"s\"", "  {\"k\": 18446744073709551615}  ", "true", "null",
      "[1e308, -1e-400, 12345678901234567890123, 18446744073709551616, -9223372036854775808]",
      "[-9223372036854775809, 0.1, 3.141592653589793, 1E-7, 1e10, 2.5e+3, 1e21, 123456789.125]",
      "[1.7976931348623157e308, 5e-324, 0.30000000000000004, 100, 1.0, -1.5e-10]",
      "[1e15, 1e16, 123456789012345.6, 0.0001, 0.00001, 0.00012345, -2.5e-5, 1e-300, 4.0e2]",
      "[0.5, 12.0, 1234567890123456.0, 9007199254740993.0, 3e-4, 7.25e14, 1.5e15]",
      R"(["\"\\\/\b\f\n\r\t", "\u0001\u001f\u007f", "caf\u00e9", "\u20ac", "日本語"])",
      R"({"z": 1, "a": 2, "m": {"y": [3, {"x": "w"}]}, "": 0})",
      " \t\r\n[ 1 , [ ] , { } ] \n"};
  for (const std::string& text : texts) {
    absl::StatusOr<Theirs> theirs = parse_json<Theirs>(text);
    absl::StatusOr<Ours> ours = parse_json<Ours>(text);
    ASSERT_TRUE(theirs.ok()) << text << ": " << theirs.status();
    ASSERT_TRUE(ours.ok()) << text << ": " << ours.status();
    EXPECT_EQ(ours->dump(), theirs->dump()) << text;
    EXPECT_EQ(ours->dump(2), theirs->dump(2)) << text;
    EXPECT_EQ(ours->dump(-1, ' ', true), theirs->dump(-1, ' ', true)) << text;
    EXPECT_EQ(std::string(ours->type_name()), std::string(theirs->type_name())) << text;
    EXPECT_EQ(ours->size(), theirs->size()) << text;
  }
}

TEST(JsonSubset, RefusesWhatNlohmannRefusesAtTheSamePlace) {
  const std::vector<std::string> texts = {
      "", " ", "[", "{", "{\"a\":}", "[1,]", "{\"a\" 1}", "{\"a\":1,}", "{1:2}", "01", "1.",
      ".5", "-", "1e", "+1", "tru", "nul", "[1] x", "\"abc", "\"\\x\"", "\"\\u12\"",
      "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"a\x01\"", "\"\xff\"", "\"\xc3\"",
      "\"\xed\xa0\x80\"", "{\"a\": [1, 2, tru]}", "{\"a\": {\"b\": 1e400}}", "[-1e400]",
      "{\"k\": 1, \"k\": 2}", std::string(65, '[') + std::string(65, ']'), "[1 2]", "NaN",
      "Infinity", "[1]]", "'a'", "/* c */ 1"};
  for (const std::string& text : texts) {
    JsonFault theirs_fault, ours_fault;
    absl::StatusOr<Theirs> theirs = parse_json<Theirs>(text, &theirs_fault);
    absl::StatusOr<Ours> ours = parse_json<Ours>(text, &ours_fault);
    ASSERT_FALSE(theirs.ok()) << text;
    EXPECT_FALSE(ours.ok()) << text << " was accepted: " << ours->dump();
    if (ours.ok()) continue;
    EXPECT_EQ(ours_fault.path, theirs_fault.path) << text;
    EXPECT_EQ(ours_fault.field, theirs_fault.field) << text;
    // The bounded parser's own reasons (depth, duplicate keys, a number out of range) are
    // the same words; the lexer's syntax messages are each library's own.
    const std::string t(theirs.status().message()), o(ours.status().message());
    for (const char* own : {"duplicate key", "nests deeper", "is out of range"}) {
      EXPECT_EQ(o.find(own) != std::string::npos, t.find(own) != std::string::npos)
          << text << "\n ours: " << o << "\n theirs: " << t;
      if (t.find(own) != std::string::npos) {
        EXPECT_EQ(o, t);
      }
    }
  }
}

// What the GPU-only targets build and write (launcher reports, safetensors headers, plans).
template <class J>
std::string build_and_dump(int indent) {
  J j;
  j["perplexity"] = 12.5;
  j["tokens"] = size_t{42};
  j["negative"] = -7;
  j["ids"] = std::vector<int32_t>{3, 1, 2};
  j["logprobs"] = std::vector<float>{-0.5f, -1.25f};
  j["text"] = std::string("héllo \"q\"\n");
  j["flag"] = true;
  j["none"] = nullptr;
  j["timings"] = {{"load_s", 0.25}, {"total_s", 3.0}, {"rate", 1e-9}};
  J arr = J::array();
  arr.push_back({{"pp_rank", 0}, {"layers", std::vector<int64_t>{0, 1}}});
  arr.push_back({{"pp_rank", 1}, {"layers", J::array()}});
  j["stages"] = arr;
  j["pair"] = {uint64_t{8}, uint64_t{16}};
  J extra = {{"tp", 2}, {"pp", 1}, {"perplexity", "replaced"}};
  j.update(extra);
  j["recommended"] = false ? J{{"tp", 1}} : J(nullptr);
  J list;
  list.emplace_back(1);
  list.emplace_back("two");
  list.back() = "2";
  j["list"] = list;
  return j.dump(indent);
}

TEST(JsonSubset, BuildsWhatNlohmannBuilds) {
  EXPECT_EQ(build_and_dump<Ours>(-1), build_and_dump<Theirs>(-1));
  EXPECT_EQ(build_and_dump<Ours>(4), build_and_dump<Theirs>(4));
  EXPECT_EQ(build_and_dump<OursOrdered>(-1), build_and_dump<TheirsOrdered>(-1));
}

TEST(JsonSubset, ReadsMembersAsNlohmannDoes) {
  const std::string text =
      R"({"s": "x", "i": -3, "u": 7, "f": 2.5, "b": true, "n": null, "a": [1, "y", [2]],
          "o": {"k": "v", "j": 1}})";
  absl::StatusOr<Ours> parsed = parse_json<Ours>(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Ours& j = *parsed;
  EXPECT_TRUE(j.contains("s"));
  EXPECT_FALSE(j.contains("missing"));
  EXPECT_TRUE(j["missing"].is_null());
  EXPECT_EQ(j.find("missing"), j.end());
  EXPECT_EQ(j.at("s").get<std::string>(), "x");
  EXPECT_EQ(j.at("s").get_ref<const std::string&>(), "x");
  EXPECT_THROW(j.at("missing"), json_subset::out_of_range);
  EXPECT_THROW(j.at("s").get<int>(), json_subset::type_error);
  EXPECT_THROW(j.at("i").get<bool>(), json_subset::type_error);
  EXPECT_TRUE(j["i"].is_number_integer());
  EXPECT_FALSE(j["i"].is_number_unsigned());
  EXPECT_TRUE(j["u"].is_number_unsigned());
  EXPECT_TRUE(j["f"].is_number_float());
  EXPECT_EQ(j["i"].get<int64_t>(), -3);
  EXPECT_EQ(j["u"].get<uint64_t>(), 7u);
  EXPECT_EQ(j["f"].get<double>(), 2.5);
  EXPECT_EQ(j["f"].get<int>(), 2);
  EXPECT_TRUE(j["b"].get<bool>());
  EXPECT_EQ(j.value("s", "d"), "x");
  EXPECT_EQ(j.value("missing", "d"), "d");
  EXPECT_EQ(j.value("u", int64_t{9}), 7);
  EXPECT_EQ(j.value("missing", false), false);
  EXPECT_TRUE(j["s"] == "x");
  EXPECT_TRUE(j["s"] != "y");
  EXPECT_TRUE(j["u"] == 7);
  EXPECT_TRUE(j["u"] == 7.0);
  EXPECT_FALSE(j["i"] == 3u);
  EXPECT_EQ(j["a"].size(), 3u);
  EXPECT_EQ(j["a"][1].get<std::string>(), "y");
  EXPECT_TRUE(j["a"][7].is_null());
  EXPECT_EQ(j["n"].size(), 0u);
  EXPECT_EQ(j["s"].size(), 1u);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j["o"].items()) keys.push_back(k + "=" + v.dump());
  EXPECT_THAT(keys, ::testing::ElementsAre("j=1", "k=\"v\""));
  auto it = j.find("o");
  ASSERT_NE(it, j.end());
  EXPECT_EQ(it.key(), "o");
  EXPECT_EQ(it->begin().key(), "j");
  EXPECT_EQ(it->begin().value().get<int>(), 1);
  int elements = 0;
  for (const Ours& e : j["a"]) elements += e.is_array() ? 10 : 1;
  EXPECT_EQ(elements, 12);
  EXPECT_EQ(j["a"].get<std::vector<Ours>>().size(), 3u);
  EXPECT_EQ(j["a"][2].get<std::vector<int>>(), std::vector<int>{2});
}

TEST(JsonSubset, InvalidUtf8IsAnErrorOrReplacedAsNlohmannDoes) {
  const std::string bad = std::string("a\xff") + "b\xc3";
  Ours ours = bad;
  Theirs theirs = bad;
  EXPECT_THROW(ours.dump(), json_subset::type_error);
  EXPECT_THROW(theirs.dump(), nlohmann::json::type_error);
  EXPECT_EQ(ours.dump(-1, ' ', false, Ours::error_handler_t::replace),
            theirs.dump(-1, ' ', false, Theirs::error_handler_t::replace));
}

}  // namespace
}  // namespace ltm
