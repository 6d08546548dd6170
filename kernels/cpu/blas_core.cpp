#include "kernels/cpu/blas_core.h"

#include <cblas.h>  // OpenBLAS's, or the GPU-only build's stand-in (defines LTM_CBLAS_SUBSET)

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

std::string select_blas_core(const char* core) {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return "";
  // gotoblas_dynamic_init reads OPENBLAS_CORETYPE (detection when unset); the process's own value
  // is put back after.
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> saved = env ? std::optional<std::string>(env) : std::nullopt;
  const std::string before = blas_core();
  if (core != nullptr) setenv("OPENBLAS_CORETYPE", core, 1);
  else if (!saved) unsetenv("OPENBLAS_CORETYPE");
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (saved) setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  else unsetenv("OPENBLAS_CORETYPE");
  const std::string after = blas_core();
  return after.empty() ? before : after;
}
#endif

}  // namespace ltm::kernels::cpu
