// The raw-byte check of request messages (runtime/serve/wire_precheck.h): oversized repeated
// fields and strings are refused, naming the field, before the typed parse allocates for them.
#include "runtime/serve/wire_precheck.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ltm/v1/ltm.pb.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;

PrecheckLimits generate_limits() {
  PrecheckLimits l;
  l.fields = {{1, -1, 4000, "bytes"}, {2, 1023, -1, "ids"}, {9, 16, 1024, "strings"},
              {11, -1, 256, "bytes"}};
  return l;
}

absl::Status check(const std::string& bytes) {
  return precheck_message(bytes, *v1::GenerateRequest::descriptor(), generate_limits());
}

TEST(WirePrecheck, ValidRequestsPass) {
  v1::GenerateRequest r;
  r.set_prompt("Hello, world");
  r.set_max_new_tokens(8);
  r.set_temperature(0.5f);
  r.set_seed(1234567890123ull);
  for (int i = 0; i < 16; ++i) r.add_stop(std::string(1024, 'x'));
  r.set_request_id(std::string(256, 'r'));
  r.set_ignore_eos(true);
  EXPECT_TRUE(check(r.SerializeAsString()).ok());
  v1::GenerateRequest ids;
  for (int i = 0; i < 1023; ++i) ids.add_prompt_token_ids(50000);
  EXPECT_TRUE(check(ids.SerializeAsString()).ok());
  EXPECT_TRUE(check("").ok());  // empty message: the typed validation says what is missing
}

// The request of the issue: 1.4 M one-byte stop strings in a 4 MiB message.
TEST(WirePrecheck, MillionsOfStopStringsAreCountedNotParsed) {
  std::string bytes;
  bytes.reserve(3 * 1400000);
  for (int i = 0; i < 1400000; ++i) bytes += std::string("\x4a\x01x", 3);  // field 9, len 1
  const absl::Status s = check(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "stop has 1400000 strings; at most 16 are allowed");
}

TEST(WirePrecheck, TooManyIdsPackedAndUnpacked) {
  v1::GenerateRequest packed;
  for (int i = 0; i < 5000; ++i) packed.add_prompt_token_ids(i);
  absl::Status s = check(packed.SerializeAsString());
  EXPECT_EQ(s.message(), "prompt_token_ids has 5000 ids; at most 1023 are allowed");
  std::string unpacked;
  for (int i = 0; i < 1500; ++i) unpacked += std::string("\x10\x07", 2);  // field 2, varint 7
  s = check(unpacked);
  EXPECT_EQ(s.message(), "prompt_token_ids has 1500 ids; at most 1023 are allowed");
}

TEST(WirePrecheck, OversizedStringsAreNamed) {
  v1::GenerateRequest r;
  r.set_prompt(std::string(4001, 'a'));
  EXPECT_EQ(check(r.SerializeAsString()).message(), "prompt is 4001 bytes long; at most 4000 are allowed");
  v1::GenerateRequest st;
  st.add_stop("ok");
  st.add_stop(std::string(1025, 's'));
  EXPECT_EQ(check(st.SerializeAsString()).message(), "stop[1] is 1025 bytes long; at most 1024 are allowed");
  v1::GenerateRequest id;
  id.set_request_id(std::string(300, 'i'));
  EXPECT_THAT(std::string(check(id.SerializeAsString()).message()), HasSubstr("request_id is 300 bytes"));
}

TEST(WirePrecheck, InvalidUtf8IsNamed) {
  std::string bytes = std::string("\x0a\x02\xc3\x28", 4);  // prompt = C3 28
  EXPECT_EQ(check(bytes).message(), "prompt is not valid UTF-8");
  bytes = std::string("\x4a\x01" "a" "\x4a\x01\xff", 6);
  EXPECT_EQ(check(bytes).message(), "stop[1] is not valid UTF-8");
}

// ChatRequest's messages are submessages: their strings are checked too, named by position.
TEST(WirePrecheck, StringsOfSubmessagesAreChecked) {
  v1::ChatRequest r;
  r.add_messages()->set_role("user");
  r.add_messages()->set_content("fine");
  const std::string good = r.SerializeAsString();
  EXPECT_TRUE(precheck_message(good, *v1::ChatRequest::descriptor(), {}).ok());
  // messages[2] = {content: C3 28}
  const std::string bad = good + std::string("\x0a\x04\x12\x02\xc3\x28", 6);
  EXPECT_EQ(precheck_message(bad, *v1::ChatRequest::descriptor(), {}).message(),
            "messages[2]: content is not valid UTF-8");
  const std::string cut = good + std::string("\x0a\x02\x12\x05", 4);  // content past its message
  EXPECT_EQ(precheck_message(cut, *v1::ChatRequest::descriptor(), {}).message(),
            "messages[2]: the request is not a valid ltm.v1.ChatMessage message");
}

TEST(WirePrecheck, MalformedBytesAreRefused) {
  const char* expected = "the request is not a valid ltm.v1.GenerateRequest message";
  EXPECT_EQ(check(std::string("\x0a\x05" "ab", 4)).message(), expected);        // length past the end
  EXPECT_EQ(check(std::string("\x08", 1)).message(), expected);                  // varint missing
  EXPECT_EQ(check(std::string(11, '\xff')).message(), expected);                 // varint too long
  EXPECT_EQ(check(std::string("\x0b", 1)).message(), expected);                  // group start
  EXPECT_EQ(check(std::string("\x00\x01", 2)).message(), expected);              // field 0
  EXPECT_EQ(check(std::string("\x12\x03\x80\x80\x80", 5)).message(), expected);  // packed varint cut
}

TEST(WirePrecheck, UnknownFieldsAreBounded) {
  std::string bytes;
  for (int i = 0; i < 64; ++i) bytes += std::string("\xa0\x06\x01", 3);  // field 100, varint
  EXPECT_TRUE(check(bytes).ok());
  bytes += std::string("\xa0\x06\x01", 3);
  EXPECT_THAT(std::string(check(bytes).message()), HasSubstr("more than 64 unknown fields"));
}

// A known field sent with a wire type its type does not take is kept by protobuf as an unknown
// field, one allocation each; such fields count against the same cap.
TEST(WirePrecheck, FieldsOfTheWrongWireTypeCountAsUnknown) {
  std::string bytes;
  for (int i = 0; i < 64; ++i) bytes += std::string("\x20\x01", 2);  // temperature (float) as varint
  EXPECT_TRUE(check(bytes).ok());
  v1::GenerateRequest parsed;  // what the typed parse makes of them: unknown fields
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_FALSE(parsed.has_temperature());
  EXPECT_EQ(parsed.GetReflection()->GetUnknownFields(parsed).field_count(), 64);
  bytes += std::string("\x20\x01", 2);
  EXPECT_EQ(check(bytes).message(),
            "the request has more than 64 unknown fields (counting fields of the wrong wire "
            "type, such as temperature sent as wire type 0)");
  // Each kind of mismatch, and unknown fields beside them, share the one cap.
  std::string mixed;
  for (int i = 0; i < 13; ++i) {
    mixed += std::string("\x1d\x01\x02\x03\x04", 5);  // max_new_tokens (int32) as fixed32
    mixed += std::string("\x49\x01\x02\x03\x04\x05\x06\x07\x08", 9);  // stop (string) as fixed64
    mixed += std::string("\x5d\x01\x02\x03\x04", 5);  // request_id (string) as fixed32
    mixed += std::string("\x61\x01\x02\x03\x04\x05\x06\x07\x08", 9);  // ignore_eos (bool) as fixed64
    mixed += std::string("\xa0\x06\x01", 3);  // field 100: unknown
  }
  EXPECT_THAT(std::string(check(mixed).message()), HasSubstr("more than 64 unknown fields"));
  // The wire types protobuf does take are not counted: packed and unpacked repeated scalars,
  // and a singular scalar given many times (the last one wins; nothing is kept).
  std::string fine;
  for (int i = 0; i < 1000; ++i) fine += std::string("\x25\x00\x00\x80\x3f", 5);  // temperature 1.0
  fine += std::string("\x12\x02\x01\x02", 4);  // prompt_token_ids packed
  fine += std::string("\x10\x03", 2);            // and unpacked
  EXPECT_TRUE(check(fine).ok());
}

// Millions of them are refused at the cap, before the typed parse would allocate one each.
TEST(WirePrecheck, MillionsOfWrongWireTypeFieldsAreRefused) {
  std::string bytes;
  bytes.reserve(2 * 2000000);
  for (int i = 0; i < 2000000; ++i) bytes += std::string("\x20\x01", 2);
  const absl::Status s = check(bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("such as temperature"));
}

}  // namespace
}  // namespace ltm
