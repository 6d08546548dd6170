// Adapter names: resolve_adapter_dir refuses every name that could leave --lora-dir.
#include "runtime/serve/adapters.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(Adapters, NamesStayInsideTheFolder) {
  std::string tmpl = ::testing::TempDir() + "/ltm_adapters_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path root = fs::path(tmpl) / "lora";
  fs::create_directories(root / "good");
  std::ofstream(root / "good" / "adapter_config.json") << "{}";
  fs::create_directories(fs::path(tmpl) / "secret");
  fs::create_directory_symlink(fs::path(tmpl) / "secret", root / "link");
  fs::create_directory_symlink(root / "good", root / "alias");

  absl::StatusOr<std::string> ok = resolve_adapter_dir(root.string(), "good");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, fs::canonical(root / "good").string());
  EXPECT_TRUE(resolve_adapter_dir(root.string(), "alias").ok());  // a link that stays inside
  for (const char* bad : {"../secret", "..", ".", ".hidden", "a/b", "/etc", "x\\y", "good\n"}) {
    absl::StatusOr<std::string> r = resolve_adapter_dir(root.string(), bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("never a path")) << bad;
  }
  absl::StatusOr<std::string> link = resolve_adapter_dir(root.string(), "link");
  EXPECT_EQ(link.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(link.status().message()), HasSubstr("outside --lora-dir"));
  EXPECT_EQ(resolve_adapter_dir(root.string(), "absent").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(resolve_adapter_dir(root.string(), "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(resolve_adapter_dir(root.string(), std::string(200, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(resolve_adapter_dir("", "good").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(list_adapter_dirs(root.string()), (std::vector<std::string>{"alias", "good"}));
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace ltm
