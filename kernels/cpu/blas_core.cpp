#include "kernels/cpu/blas_core.h"

#include <cblas.h>  // OpenBLAS's, or the GPU-only build's stand-in (defines LTM_CBLAS_SUBSET)

#include <strings.h>

#include <cstdlib>
#include <optional>

#ifndef LTM_CBLAS_SUBSET
// OpenBLAS's dynamic dispatch (driver/others/dynamic.c): weak, so that an OpenBLAS built without
// it links too. The GPU-only build has no OpenBLAS and references none of these
// (gpu_only_build_test checks that ltm-worker has no undefined OpenBLAS symbol, weak or not).
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}
#endif

namespace ltm::kernels::cpu {

const char* blas_core_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "Haswell";
    case Isa::kPortable: return "Prescott";
    case Isa::kAvx512: return nullptr;
  }
  return nullptr;
}

#ifdef LTM_CBLAS_SUBSET
std::string blas_core() { return ""; }
std::string select_blas_core(const char*) { return ""; }
#else
std::string blas_core() {
  if (gotoblas_dynamic_init == nullptr) return "";
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

namespace {

// Runs OpenBLAS's dispatch again with OPENBLAS_CORETYPE set to `core` (nullptr: the process's own
// value, or detection where it has none), then puts the process's own value back.
void redispatch(const char* core, const std::optional<std::string>& saved) {
  if (core != nullptr) setenv("OPENBLAS_CORETYPE", core, 1);
  else if (!saved) unsetenv("OPENBLAS_CORETYPE");
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (saved) setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  else unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace

std::string select_blas_core(const char* core) {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return "";
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> saved = env ? std::optional<std::string>(env) : std::nullopt;
  const std::string before = blas_core();
  redispatch(core, saved);
  std::string after = blas_core();
  // A name OpenBLAS does not know leaves it on a core of its own fallback rule, not on the one it
  // ran ("Core not found", then Haswell on an AMD Zen 3 whose own core is Zen): the old one is
  // selected again by its name.
  if (core != nullptr && !before.empty() && strcasecmp(after.c_str(), core) != 0 &&
      strcasecmp(after.c_str(), before.c_str()) != 0) {
    redispatch(before.c_str(), saved);
    after = blas_core();
  }
  return after.empty() ? before : after;
}
#endif

}  // namespace ltm::kernels::cpu
