// Assertions and Status plumbing shared by every folder.
//
// Three tiers of errors (see docs/architecture.md):
//  - LTM_ASSERT: a broken invariant of our own code. Prints file:line and aborts the process
//    (under MPI the launcher takes the group down).
//  - LTM_RETURN_IF_ERROR / LTM_ASSIGN_OR_RETURN: propagate absl::Status for bad user data
//    (config, checkpoint, request, flag) so the caller can report it and keep serving.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ltm::detail {
[[noreturn]] inline void assert_fail(const char* file, int line, const char* cond,
                                     const std::string& msg) {
  std::fprintf(stderr, "ltm: internal error at %s:%d: check `%s` failed%s%s\n", file, line, cond,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace ltm::detail

// LTM_ASSERT(cond) or LTM_ASSERT(cond, "text", value, ...): the extra arguments go through StrCat.
#define LTM_ASSERT(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::ltm::detail::assert_fail(__FILE__, __LINE__, #cond, ::absl::StrCat(__VA_ARGS__)); \
  } while (0)

#define LTM_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status _ltm_status = (expr);       \
    if (!_ltm_status.ok()) return _ltm_status; \
  } while (0)

#define LTM_CONCAT_INNER_(a, b) a##b
#define LTM_CONCAT_(a, b) LTM_CONCAT_INNER_(a, b)
#define LTM_ASSIGN_OR_RETURN(lhs, expr)                                        \
  auto LTM_CONCAT_(_ltm_or_, __LINE__) = (expr);                               \
  if (!LTM_CONCAT_(_ltm_or_, __LINE__).ok())                                   \
    return std::move(LTM_CONCAT_(_ltm_or_, __LINE__)).status();                \
  lhs = std::move(LTM_CONCAT_(_ltm_or_, __LINE__)).value()
