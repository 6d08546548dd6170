// The bearer-token check (runtime/serve/auth.h).
#include "runtime/serve/auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace ltm {
namespace {

TEST(Auth, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secret", "secreT"));
  EXPECT_FALSE(constant_time_equal("secret", "secret2"));
  EXPECT_FALSE(constant_time_equal("secret", ""));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), "a"));
}

TEST(Auth, CheckBearer) {
  const std::string_view ok = "Bearer k3y";
  EXPECT_TRUE(check_bearer(&ok, "k3y").ok());
  EXPECT_EQ(check_bearer(nullptr, "k3y").code(), absl::StatusCode::kUnauthenticated);
  for (std::string_view bad : {"Bearer k3", "Bearer k3yy", "bearer k3y", "Basic k3y", "k3y", "",
                               "Bearer "}) {
    const absl::Status s = check_bearer(&bad, "k3y");
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(std::string(s.message()).find("k3"), std::string::npos) << "quotes the key: " << s;
  }
}

TEST(Auth, ReadApiKeyFile) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ltm-auth-" + std::to_string(::getpid()))).string();
  std::ofstream(path) << "  s3cret-token \r\n";
  absl::StatusOr<std::string> key = read_api_key_file(path);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, "s3cret-token");
  std::ofstream(path) << "\n";
  EXPECT_EQ(read_api_key_file(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(path) << "a\x01b";
  EXPECT_EQ(read_api_key_file(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(path) << std::string(5000, 'k');
  EXPECT_EQ(read_api_key_file(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
  EXPECT_EQ(read_api_key_file(path).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ltm
