#include "runtime/sched/adapters.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ltm {

namespace fs = std::filesystem;

absl::StatusOr<std::string> resolve_adapter_dir(const std::string& lora_dir, const std::string& name) {
  if (lora_dir.empty())
    return absl::FailedPreconditionError(
        "this server has no adapter folder (start it with --lora-dir DIR to load adapters by name)");
  if (name.empty()) return absl::InvalidArgumentError("name is empty: name an adapter folder");
  if (name.size() > kMaxAdapterNameBytes)
    return absl::InvalidArgumentError(absl::StrCat("name is ", name.size(), " bytes long; at most ",
                                                   kMaxAdapterNameBytes, " are allowed"));
  const bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
  if (!chars_ok || name[0] == '.')
    return absl::InvalidArgumentError(absl::StrCat(
        "name \"", name, "\" is refused: an adapter name is a folder inside --lora-dir (letters, "
        "digits, '.', '_', '-', not starting with '.'), never a path"));
  std::error_code ec;
  const fs::path root = fs::canonical(lora_dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("--lora-dir ", lora_dir, ": ", ec.message()));
  const fs::path dir = root / name;
  if (!fs::exists(dir, ec))
    return absl::NotFoundError(absl::StrCat("adapter \"", name, "\": no folder ", dir.string()));
  const fs::path real = fs::canonical(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("adapter \"", name, "\": ", ec.message()));
  if (real.parent_path() != root)
    return absl::InvalidArgumentError(absl::StrCat("name \"", name, "\" is refused: it resolves to ",
                                                   real.string(), ", outside --lora-dir ",
                                                   root.string()));
  return real.string();
}

std::vector<std::string> list_adapter_dirs(const std::string& lora_dir) {
  std::vector<std::string> names;
  if (lora_dir.empty()) return names;
  std::error_code ec;
  for (fs::directory_iterator it(lora_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] != '.' && fs::is_regular_file(it->path() / "adapter_config.json", ec))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ltm
