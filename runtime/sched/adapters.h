// LoRA adapters as the coordinator sees them: names, the folder they come from, their state, and
// the operations the LoadAdapter / UnloadAdapter RPCs ask of the scheduler.
//
// An adapter is named by a folder under the operator's --lora-dir. resolve_adapter_dir refuses a
// name that could leave that folder (a path separator, "..", a leading dot, characters outside
// [A-Za-z0-9._-], or a symbolic link that resolves outside it): InvalidArgument naming the name.
// Pure functions apart from reading the file system; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ltm {

inline constexpr size_t kMaxAdapterNameBytes = 128;

// What ListAdapters and GetModelInfo report of one adapter.
struct AdapterStatus {
  std::string name;
  std::string dir;
  bool loaded = false;       // resident (false: only found in --lora-dir)
  bool merged = false;       // folded into the weights at load (--lora-merge)
  bool unloading = false;    // an UnloadAdapter waits for its requests
  int32_t rank = 0;
  float alpha = 0;
  std::vector<std::string> target_modules;  // "attn.c_attn", ...
  int32_t active_requests = 0;              // queued or running requests naming it
};

// Checks `name` (see above) and returns the folder lora_dir/name, which must exist.
// FailedPrecondition when lora_dir is empty (the server has no --lora-dir); NotFound when the
// folder is not there.
absl::StatusOr<std::string> resolve_adapter_dir(const std::string& lora_dir, const std::string& name);

// The names of the sub-folders of lora_dir that hold an adapter_config.json, sorted.
std::vector<std::string> list_adapter_dirs(const std::string& lora_dir);

// An operation the step thread carries out between steps; `done` is called once, from the step
// thread, with the adapter's state (load, unload) or the error.
struct AdapterOp {
  enum class Kind { kLoad, kUnload } kind = Kind::kLoad;
  std::string name;
  std::string dir;     // kLoad: the resolved folder
  bool force = false;  // kUnload: fail the adapter's requests (ABORTED) instead of waiting for them
  std::function<void(absl::StatusOr<AdapterStatus>)> done;
};

}  // namespace ltm
