// SafetensorsFile: parsing, validation messages, and robustness against corrupt files.
// Files are written byte by byte here (no Python needed).
#include "runtime/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/ltm_safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  std::string dir_;
};

// 8-byte little-endian length + header (not padded unless the caller pads) + data.
std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string f32_bytes(const std::vector<float>& values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

absl::Status open_status(const std::string& path) { return SafetensorsFile::open(path).status(); }

TEST_F(SafetensorsTest, ParsesHandWrittenFile) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F16","shape":[3],"data_offsets":[16,22]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  std::string data = f32_bytes({1.0f, -2.0f, 0.5f, 3.0f});
  data += std::string("\x00\x3c\x00\xc0\x01\x00", 6);  // f16: 1.0, -2.0, 2^-24
  const std::string path = write("a.safetensors", file_bytes(header, data));

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), 2u);
  EXPECT_EQ(file->tensors()[0].name, "a");  // sorted by name
  EXPECT_EQ(file->data_offset(), 8 + header.size());

  const SafetensorsTensor* a = file->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a->numel, 4);
  EXPECT_EQ(a->bytes(), 16u);
  float values[4];
  convert_to_f32(DType::kF32, file->tensor_data(*a), 4, values);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(values[3], 3.0f);

  const SafetensorsTensor* b = file->find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF16);
  float halves[3];
  convert_to_f32(DType::kF16, file->tensor_data(*b), 3, halves);
  EXPECT_EQ(halves[0], 1.0f);
  EXPECT_EQ(halves[1], -2.0f);
  EXPECT_EQ(halves[2], 0x1p-24f);

  EXPECT_EQ(file->find("c"), nullptr);
  EXPECT_EQ(file->find("__metadata__"), nullptr);
}

TEST_F(SafetensorsTest, KeepsDTypesLtmDoesNotComputeWith) {
  const std::string header =
      R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
      R"("m":{"dtype":"U8","shape":[1,1,2,2],"data_offsets":[8,12]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[12,16]},)"
      R"("e":{"dtype":"BF16","shape":[0,4],"data_offsets":[16,16]}})";
  auto file = SafetensorsFile::open(write("x.safetensors", file_bytes(header, std::string(16, 'z'))));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->find("x")->dtype_name, "F64");
  EXPECT_FALSE(file->find("x")->dtype.has_value());
  EXPECT_FALSE(file->find("m")->dtype.has_value());
  EXPECT_EQ(file->find("s")->numel, 1);  // scalar
  EXPECT_EQ(file->find("e")->numel, 0);
}

TEST_F(SafetensorsTest, WriterRoundTripsAndPadsHeader) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::string a_bytes = f32_bytes(a);
  const std::string b_bytes("\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  const std::string path = dir_ + "/w.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"first", "F32", {2, 3}, a_bytes},
                                       {"second", "BF16", {2}, b_bytes}})
                  .ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->data_offset() % 8, 0u);
  const SafetensorsTensor* first = file->find("first");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->data_begin, 0u);
  EXPECT_EQ(std::memcmp(file->tensor_data(*first), a_bytes.data(), a_bytes.size()), 0);
  const SafetensorsTensor* second = file->find("second");
  ASSERT_NE(second, nullptr);
  float out[2];
  convert_to_f32(DType::kBF16, file->tensor_data(*second), 2, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);

  const absl::Status bad = write_safetensors(path, {{"t", "F32", {3}, a_bytes}});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("\"t\""));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const absl::Status s = open_status(dir_ + "/nope.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nope.safetensors"));
  const absl::Status d = open_status(dir_);
  EXPECT_EQ(d.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.message()), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsTest, TooShortFile) {
  const absl::Status s = open_status(write("short.safetensors", "abc"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("short.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("too short"));
  EXPECT_EQ(open_status(write("empty.safetensors", "")).code(), absl::StatusCode::kDataLoss);
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
  std::string bytes = file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                 std::string(4, '\0'));
  bytes[0] = static_cast<char>(0xff);
  bytes[3] = 0x01;
  const absl::Status s = open_status(write("len.safetensors", bytes));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("len.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("header length 16777471"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("larger than the file"));
  // All 64 bits set must not overflow the comparison.
  std::string huge = bytes;
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>(0xff);
  EXPECT_THAT(std::string(open_status(write("huge.safetensors", huge)).message()),
              HasSubstr("larger than the file"));
}

TEST_F(SafetensorsTest, HeaderLengthAboveLimit) {
  // A sparse file big enough to hold the claimed header: the limit must catch it first.
  const std::string path = dir_ + "/sparse.safetensors";
  const uint64_t header_len = 100'000'001;
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  write("sparse.safetensors", head);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + header_len + 16)), 0);
  const absl::Status s = open_status(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("exceeds the limit"));
}

TEST_F(SafetensorsTest, InvalidJsonHeader) {
  const absl::Status s =
      open_status(write("json.safetensors", file_bytes(R"({"a":{"dtype":"F32",)", "")));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("json.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("invalid JSON header"));

  const absl::Status arr = open_status(write("arr.safetensors", file_bytes("[1, 2]", "")));
  EXPECT_THAT(std::string(arr.message()), HasSubstr("must be an object"));

  const absl::Status utf = open_status(write("utf.safetensors", file_bytes("{\"\xff\":1}", "")));
  EXPECT_EQ(utf.code(), absl::StatusCode::kDataLoss);
}

// A tensor named twice in the header: which entry is it? And the header's depth is bounded.
TEST_F(SafetensorsTest, DuplicateTensorsAndDeepHeadersAreRefused) {
  const std::string entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  absl::Status s = open_status(write(
      "dup.safetensors", file_bytes("{\"w\":" + entry + ",\"w\":" + entry + "}", f32_bytes({1}))));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("invalid JSON header: w: duplicate key"));
  s = open_status(write("deep.safetensors",
                        file_bytes("{\"__metadata__\":" + std::string(5000, '[') +
                                       std::string(5000, ']') + "}",
                                   "")));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nests deeper than 64 levels"));
}

struct BadEntryCase {
  std::string header;
  std::string data;
  std::vector<std::string> expected;  // substrings of the message
};

TEST_F(SafetensorsTest, BadEntries) {
  const std::vector<BadEntryCase> cases = {
      {R"({"w":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}})", std::string(4, 0),
       {"tensor \"w\"", "unknown dtype \"X9\"", "F64"}},
      {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, 0), {"\"w\"", "dtype"}},
      {R"({"w":[1,2]})", "", {"\"w\"", "must be an object"}},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, 0),
       {"\"w\"", "non-negative integers"}},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", std::string(4, 0),
       {"\"w\"", "non-negative integers"}},
      {R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, 0), {"\"w\"", "shape"}},
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})",
       std::string(4, 0), {"\"w\"", "too large"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", std::string(4, 0),
       {"\"w\"", "data_offsets"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", std::string(4, 0),
       {"\"w\"", "data_offsets [4, 0] end before they begin"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(4, 0),
       {"\"w\"", "hold 4 bytes", "shape [2] of F32 needs 2 x 4 = 8 bytes"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, 0),
       {"\"w\"", "reach past the end of the data section (4 bytes)", "truncated"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 0),
       {"\"w\"", "begin at 4 but the data section begins at 0", "gap"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       std::string(8, 0), {"\"b\"", "tensor \"a\" ends at 8", "overlap"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(12, 0),
       {"data section has 12 bytes", "cover 4", "trailing"}},
  };
  int i = 0;
  for (const BadEntryCase& c : cases) {
    const std::string name = "bad" + std::to_string(i++) + ".safetensors";
    const absl::Status s = open_status(write(name, file_bytes(c.header, c.data)));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.header << "\n" << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(name)) << c.header;
    for (const std::string& e : c.expected) EXPECT_THAT(std::string(s.message()), HasSubstr(e)) << c.header;
  }
}

TEST_F(SafetensorsTest, MappedFileMovesAndUnmaps) {
  const std::string path = write("m.bin", "0123456789");
  auto file = MappedFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  MappedFile moved = std::move(*file);
  EXPECT_EQ(file->data(), nullptr);
  ASSERT_EQ(moved.size(), 10u);
  EXPECT_EQ(moved.data()[3], '3');
  MappedFile other;
  other = std::move(moved);
  EXPECT_EQ(other.data()[9], '9');
  EXPECT_EQ(other.path(), path);
}

// A FIFO in place of a file is refused at once; before, open() waited for a writer (forever).
TEST_F(SafetensorsTest, FifoIsRefusedWithoutWaiting) {
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const absl::Status s = open_status(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a regular file"));
}

// A file held in memory parses as the mapped one does; the bytes move with the object.
TEST_F(SafetensorsTest, ParsesBytesHeldInMemory) {
  const std::string bytes =
      file_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32_bytes({1.5f, -2}));
  SafetensorsFile file = *SafetensorsFile::parse(
      MappedFile::from_bytes("mem.safetensors", std::vector<uint8_t>(bytes.begin(), bytes.end())));
  SafetensorsFile moved = std::move(file);
  const SafetensorsTensor* t = moved.find("t");
  ASSERT_NE(t, nullptr);
  float v[2];
  std::memcpy(v, moved.tensor_data(*t), sizeof(v));
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[1], -2.0f);
  const absl::Status bad =
      SafetensorsFile::parse(MappedFile::from_bytes("mem.safetensors", {1, 2, 3})).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("mem.safetensors"));
}

// Every truncation and a range of byte edits of a valid file must give an error or a file
// whose tensors all lie inside the mapping (read completely here, so ASan/UBSan would notice).
void check_consistent(const SafetensorsFile& file) {
  uint64_t total = 0;
  for (const SafetensorsTensor& t : file.tensors()) {
    ASSERT_LE(file.data_offset() + t.data_end, file.file_size());
    volatile uint8_t sink = 0;
    const uint8_t* p = file.tensor_data(t);
    for (uint64_t k = 0; k < t.bytes(); ++k) sink = sink ^ p[k];
    total += t.bytes();
  }
  EXPECT_EQ(file.data_offset() + total, file.file_size());
}

TEST_F(SafetensorsTest, FuzzTruncationAndByteFlips) {
  std::vector<float> values(50);
  for (size_t k = 0; k < values.size(); ++k) values[k] = 0.25f * static_cast<float>(k);
  const std::string a = f32_bytes(values);
  const std::string path = dir_ + "/valid.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"a", "F32", {10, 5}, a},
                                       {"bb", "F16", {7}, std::string(14, '\x11')},
                                       {"c", "U8", {3}, "xyz"}})
                  .ok());
  std::string valid;
  {
    std::ifstream in(path, std::ios::binary);
    valid.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t len = 0; len < valid.size(); ++len) {
    const absl::Status s = open_status(write("cut.safetensors", valid.substr(0, len)));
    ASSERT_FALSE(s.ok()) << "truncated at " << len;
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << len << ": " << s;
  }
  auto whole = SafetensorsFile::open(write("whole.safetensors", valid));
  ASSERT_TRUE(whole.ok()) << whole.status();

  const uint64_t header_end = whole->data_offset();
  // Edits in place (pwrite) and restored, so that each try costs one open.
  const std::string flip_path = write("flip.safetensors", valid);
  const int fd = ::open(flip_path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  std::string edits;
  int opened = 0, failed = 0;
  for (uint64_t pos = 0; pos < header_end; ++pos) {
    edits.clear();
    for (unsigned char x : {0x01, 0x20, 0x80, 0xff}) edits += static_cast<char>(valid[pos] ^ x);
    edits += "09\"}, ";
    for (char c : edits) {
      ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(pos)), 1);
      auto file = SafetensorsFile::open(flip_path);
      if (file.ok()) {
        ++opened;
        check_consistent(*file);
      } else {
        ++failed;
        EXPECT_THAT(std::string(file.status().message()), HasSubstr("flip.safetensors"));
      }
    }
    ASSERT_EQ(::pwrite(fd, &valid[pos], 1, static_cast<off_t>(pos)), 1);
  }
  ::close(fd);
  EXPECT_GT(failed, 0);
  std::printf("byte flips: %d opened, %d rejected\n", opened, failed);
}

}  // namespace
}  // namespace ltm
