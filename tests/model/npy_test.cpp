// .npy writer/reader: round trips, the exact header layout, and numpy (Debian's /usr/bin/python3)
// reading what we write and writing what we read.
#include "runtime/model/npy.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ltm {
namespace {

namespace fs = std::filesystem;

class NpyTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ltm_npy_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool have_numpy() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return ok;
}

// Runs a Python snippet and returns its stdout.
std::string python(const std::string& code) {
  std::string out;
  FILE* p = ::popen(("/usr/bin/python3 -c \"" + code + "\"").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  EXPECT_EQ(::pclose(p), 0) << code;
  return out;
}

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(std::sin(0.1 * i) * 100.0 + 0.25 * i);
  return v;
}

TEST_F(NpyTest, HeaderIsVersion1PaddedTo64) {
  const std::vector<float> v = ramp(6);
  ASSERT_TRUE(write_npy_f32(path("a.npy"), v, {2, 3}).ok());
  const std::string bytes = read_bytes(path("a.npy"));
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(bytes[6], '\x01');
  EXPECT_EQ(bytes[7], '\x00');
  const size_t header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u) << header;
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(bytes.size(), 10 + header_len + 6 * sizeof(float));
}

TEST_F(NpyTest, RoundTripsShapes) {
  struct Case {
    std::vector<int64_t> shape;
    size_t n;
  };
  for (const Case& c : {Case{{}, 1}, Case{{5}, 5}, Case{{0}, 0}, Case{{3, 0, 2}, 0}, Case{{2, 3, 4}, 24},
                        Case{{1, 50257}, 50257}, Case{{1, 1, 1, 1, 1, 1, 7}, 7}}) {
    std::vector<float> v = ramp(c.n);
    if (c.n > 2) {
      v[0] = -std::numeric_limits<float>::infinity();
      v[1] = std::numeric_limits<float>::denorm_min();
    }
    ASSERT_TRUE(write_npy_f32(path("r.npy"), v, c.shape).ok());
    auto got = read_npy_f32(path("r.npy"));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->second, c.shape);
    EXPECT_EQ(got->first, v);
  }
}

TEST_F(NpyTest, RejectsShapeThatDoesNotMatchTheData) {
  const std::vector<float> v = ramp(6);
  absl::Status s = write_npy_f32(path("bad.npy"), v, {4, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("(4, 2)"), std::string::npos) << s.message();
  s = write_npy_f32(path("bad.npy"), v, {-2, -3});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(path("bad.npy")));
}

// A shape whose header does not fit format 1.0's 16-bit length is an error (it aborted before).
TEST_F(NpyTest, RejectsShapeTooLongForTheHeader) {
  const std::vector<float> v = ramp(1);
  absl::Status s = write_npy_f32(path("long.npy"), v, std::vector<int64_t>(30000, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("30000 dimensions"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(path("long.npy")));
}

TEST_F(NpyTest, ReportsFileErrors) {
  const std::vector<float> v = ramp(2);
  absl::Status s = write_npy_f32(path("no/such/dir/x.npy"), v, {2});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("no/such/dir/x.npy"), std::string::npos);
  EXPECT_EQ(read_npy_f32(path("missing.npy")).status().code(), absl::StatusCode::kNotFound);

  std::ofstream(path("text.npy")) << "not numpy";
  EXPECT_EQ(read_npy_f32(path("text.npy")).status().code(), absl::StatusCode::kInvalidArgument);

  // Truncated data.
  ASSERT_TRUE(write_npy_f32(path("t.npy"), ramp(100), {100}).ok());
  const std::string bytes = read_bytes(path("t.npy"));
  std::ofstream(path("t.npy"), std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  const absl::Status t = read_npy_f32(path("t.npy")).status();
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.message().find("shorter"), std::string::npos) << t;
}

TEST_F(NpyTest, NumpyLoadsWhatWeWrite) {
  ASSERT_TRUE(have_numpy()) << "needs /usr/bin/python3 with numpy, a declared dependency (scripts/setup installs it): fail, never skip";
  const std::vector<float> v = ramp(2 * 3 * 5);
  ASSERT_TRUE(write_npy_f32(path("w.npy"), v, {2, 3, 5}).ok());
  double sum = 0, weighted = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    sum += v[i];
    weighted += v[i] * static_cast<double>(i);
  }
  // The index-weighted sum checks C order, not only the values.
  const std::string out = python(
      "import numpy as np; a = np.load('" + path("w.npy") + "'); "
      "print(a.dtype, a.shape, a.flags['C_CONTIGUOUS'], repr(float(a.astype(np.float64).sum())), "
      "repr(float((a.astype(np.float64).ravel() * np.arange(a.size)).sum())))");
  char dtype[16] = {}, contiguous[8] = {};
  int d0 = 0, d1 = 0, d2 = 0;
  double np_sum = 0, np_weighted = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "%15s (%d, %d, %d) %7s %lf %lf", dtype, &d0, &d1, &d2, contiguous, &np_sum,
                        &np_weighted),
            7)
      << out;
  EXPECT_STREQ(dtype, "float32");
  EXPECT_EQ(d0, 2);
  EXPECT_EQ(d1, 3);
  EXPECT_EQ(d2, 5);
  EXPECT_STREQ(contiguous, "True");
  std::printf("numpy sum %.17g vs %.17g, weighted %.17g vs %.17g\n", np_sum, sum, np_weighted, weighted);
  EXPECT_NEAR(np_sum, sum, 1e-9 * std::abs(sum));
  EXPECT_NEAR(np_weighted, weighted, 1e-9 * std::abs(weighted));

  // A 0-d array and a 1-d array (the "(n,)" tuple) too.
  ASSERT_TRUE(write_npy_f32(path("s.npy"), std::vector<float>{2.5f}, {}).ok());
  ASSERT_TRUE(write_npy_f32(path("o.npy"), ramp(4), {4}).ok());
  EXPECT_EQ(python("import numpy as np; print(np.load('" + path("s.npy") + "').shape, np.load('" +
                   path("s.npy") + "')[()], np.load('" + path("o.npy") + "').shape)"),
            "() 2.5 (4,)\n");
}

TEST_F(NpyTest, ReadsWhatNumpyWrites) {
  ASSERT_TRUE(have_numpy()) << "needs /usr/bin/python3 with numpy, a declared dependency (scripts/setup installs it): fail, never skip";
  python("import numpy as np; np.save('" + path("np.npy") +
         "', (np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.5 - 3)); "
         "np.save('" + path("f8.npy") + "', np.zeros(3)); "
         "np.save('" + path("fortran.npy") + "', np.asfortranarray(np.ones((2, 3), dtype=np.float32)))");
  auto got = read_npy_f32(path("np.npy"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->second, (std::vector<int64_t>{2, 3, 4}));
  ASSERT_EQ(got->first.size(), 24u);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(got->first[i], static_cast<float>(i) * 0.5f - 3.0f);

  const absl::Status f8 = read_npy_f32(path("f8.npy")).status();
  EXPECT_EQ(f8.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f8.message().find("<f8"), std::string::npos) << f8;
  const absl::Status fortran = read_npy_f32(path("fortran.npy")).status();
  EXPECT_EQ(fortran.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fortran.message().find("Fortran"), std::string::npos) << fortran;
}

}  // namespace
}  // namespace ltm
