// Adapter names: resolve_adapter_dir refuses every name that could leave --lora-dir.
#include "runtime/sched/adapters.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "runtime/model/lora.h"

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

// A name that resolve_adapter_dir accepts is a folder inside --lora-dir, but the files inside it
// may still be links: LoraAdapter::open (what LoadAdapter runs on every rank) reads them only
// when they resolve inside --lora-dir, and fails the load naming the file otherwise.
TEST(Adapters, AnAdapterLoadedByNameReadsOnlyInsideTheFolder) {
  std::string tmpl = ::testing::TempDir() + "/ltm_adapters_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path root = fs::path(tmpl) / "lora";
  ModelConfig c;
  c.vocab_size = 50;
  c.n_positions = 16;
  c.n_embd = 4;
  c.n_layer = 1;
  c.n_head = 1;
  c.n_inner = 8;
  const std::vector<float> a(4, 0.5f), b(12, 0.25f);  // c_attn: A [1, 4], B [12, 1]
  auto write = [&](const fs::path& dir) {
    fs::create_directories(dir);
    std::ofstream(dir / "adapter_config.json") << R"({"r": 1, "target_modules": ["c_attn"]})";
    const std::string p = "base_model.model.transformer.h.0.attn.c_attn.";
    ASSERT_TRUE(write_safetensors(
                    (dir / "adapter_model.safetensors").string(),
                    {{p + "lora_A.weight", "F32", {1, 4},
                      {reinterpret_cast<const char*>(a.data()), a.size() * sizeof(float)}},
                     {p + "lora_B.weight", "F32", {12, 1},
                      {reinterpret_cast<const char*>(b.data()), b.size() * sizeof(float)}}})
                    .ok());
  };
  write(root / "good");
  write(root / "shares");  // its weights are a link to good's: inside --lora-dir
  fs::remove(root / "shares" / "adapter_model.safetensors");
  fs::create_symlink("../good/adapter_model.safetensors", root / "shares" / "adapter_model.safetensors");
  write(fs::path(tmpl) / "secret");
  write(root / "leaks");  // its config is a link to a file outside --lora-dir
  fs::remove(root / "leaks" / "adapter_config.json");
  fs::create_symlink(fs::path(tmpl) / "secret" / "adapter_config.json",
                     root / "leaks" / "adapter_config.json");

  for (const char* name : {"good", "shares"}) {
    absl::StatusOr<std::string> dir = resolve_adapter_dir(root.string(), name);
    ASSERT_TRUE(dir.ok()) << dir.status();
    absl::StatusOr<LoraAdapter> adapter = LoraAdapter::open(*dir, c, 16);
    EXPECT_TRUE(adapter.ok()) << name << ": " << adapter.status();
  }
  absl::StatusOr<std::string> dir = resolve_adapter_dir(root.string(), "leaks");
  ASSERT_TRUE(dir.ok()) << dir.status();  // the folder itself is inside
  absl::StatusOr<LoraAdapter> adapter = LoraAdapter::open(*dir, c, 16);
  EXPECT_EQ(adapter.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(adapter.status().message()),
              HasSubstr("leaks/adapter_config.json: resolves to " +
                        fs::canonical(fs::path(tmpl) / "secret" / "adapter_config.json").string() +
                        ", outside " + fs::canonical(root).string()));
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace ltm
