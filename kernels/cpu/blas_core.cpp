#include "kernels/cpu/blas_core.h"

#include <cstdlib>
#include <optional>

// OpenBLAS's dynamic dispatch (driver/others/dynamic.c): weak, so that a build without it links.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
}

namespace ltm::kernels::cpu {

std::string blas_core() {
  if (openblas_get_corename == nullptr || gotoblas_dynamic_init == nullptr) return "";
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

const char* blas_core_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "Haswell";
    case Isa::kPortable: return "Prescott";
    case Isa::kAvx512: return nullptr;
  }
  return nullptr;
}

std::string select_blas_core(const char* core) {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr ||
      openblas_get_corename == nullptr)
    return "";
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

}  // namespace ltm::kernels::cpu
