// Assertions and Status plumbing shared by every folder.
//
// Three tiers of errors (see docs/architecture.md):
//  - LTM_ASSERT: a broken invariant of our own code (never reachable from a request, a file or
//    a peer: those get a Status). Names file:line and ends the process; under MPI through the
//    group abort (exit 7), so the whole group goes down with one clear message.
//  - LTM_RETURN_IF_ERROR / LTM_ASSIGN_OR_RETURN: propagate absl::Status for bad user data
//    (config, checkpoint, request, flag) so the caller can report it and keep serving.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ltm::detail {

// Where a failed LTM_ASSERT goes once a process is part of a group: parallel/ installs the
// group abort (message with host and rank, requests answered UNAVAILABLE, exit code 7 through
// MPI_Abort, so the other ranks go down too) when it sets up MPI. Without one (tools, tests),
// std::abort as before.
using AssertHandler = void (*)(const std::string& message);
inline std::atomic<AssertHandler>& assert_handler() {
  static std::atomic<AssertHandler> handler{nullptr};
  return handler;
}

[[noreturn]] inline void assert_fail(const char* file, int line, const char* cond,
                                     const std::string& msg) {
  const std::string message = ::absl::StrCat("internal error at ", file, ":", line, ": check `",
                                             cond, "` failed", msg.empty() ? "" : ": ", msg);
  if (AssertHandler h = assert_handler().load()) h(message);  // does not return
  std::fprintf(stderr, "ltm: %s\n", message.c_str());
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
