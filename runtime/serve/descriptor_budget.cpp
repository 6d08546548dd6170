#include "runtime/serve/descriptor_budget.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ltm {
namespace {

constexpr int64_t kMinConnections = 16;  // below this a server is not worth starting

int64_t as_count(rlim_t v) {
  return v == RLIM_INFINITY ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}

// The kernel's ceiling for any process (fs.nr_open), or 1 Mi where it cannot be read.
int64_t nr_open() {
  std::ifstream in("/proc/sys/fs/nr_open");
  int64_t n = 0;
  if (in >> n && n > 0) return n;
  return int64_t{1} << 20;
}

}  // namespace

DescriptorLimit raise_descriptor_limit() {
  DescriptorLimit out;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return out;
  out.soft_before = out.soft = as_count(rl.rlim_cur);
  out.hard = as_count(rl.rlim_max);
  const int64_t target = std::min(out.hard, nr_open());
  if (target > out.soft) {
    rlimit raised = rl;
    raised.rlim_cur = static_cast<rlim_t>(target);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) out.soft = target;
  }
  return out;
}

absl::StatusOr<DescriptorPlan> plan_descriptors(const DescriptorLimit& limit, int world_size,
                                                int http_max_connections, bool with_http) {
  DescriptorPlan plan;
  plan.limit = limit.soft;
  plan.reserved = kReservedDescriptors + kDescriptorsPerRank * std::max(world_size, 1);
  const int64_t rest = plan.limit - plan.reserved;
  const bool unlimited = limit.hard == std::numeric_limits<int64_t>::max();
  const std::string raise_it = absl::StrCat(
      "raise the hard limit (ulimit -Hn, LimitNOFILE= in a systemd unit, or the Slurm node's "
      "limits), now ", unlimited ? std::string("unlimited") : absl::StrCat(limit.hard));
  if (rest < 2 * kMinConnections)
    return absl::FailedPreconditionError(absl::StrCat(
        "the descriptor limit (RLIMIT_NOFILE) is ", plan.limit, ": after ", plan.reserved,
        " reserved for checkpoint, adapter and MPI files it leaves ", std::max<int64_t>(rest, 0),
        " for client connections, fewer than ", 2 * kMinConnections, "; ", raise_it));
  const int64_t http_room = with_http ? rest / 2 : 0;
  if (with_http) {
    if (http_max_connections > http_room)
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-max-connections ", http_max_connections, " does not fit the descriptor limit ",
          plan.limit, ": after ", plan.reserved, " reserved for checkpoint, adapter and MPI files, "
          "HTTP may have at most half of the other ", rest, " (", http_room,
          "; gRPC connections share the rest); give at most ", http_room, ", or ", raise_it));
    plan.http_max_connections =
        http_max_connections > 0
            ? http_max_connections
            : static_cast<int>(std::min<int64_t>(kDefaultHttpMaxConnections, http_room));
  }
  plan.grpc_share = rest - plan.http_max_connections;
  const std::string raised =
      limit.soft_before != limit.soft ? absl::StrCat(" (raised from ", limit.soft_before, ")") : "";
  const bool clamp = with_http && http_max_connections == 0 &&
                     plan.http_max_connections < kDefaultHttpMaxConnections;
  const std::string clamped =
      clamp ? absl::StrCat(" (not ", kDefaultHttpMaxConnections, ": the limit is too low)") : "";
  plan.summary = absl::StrCat(
      "descriptors: limit ", plan.limit, raised, ", ", plan.reserved,
      " kept for checkpoint, adapter and MPI files; ",
      with_http ? absl::StrCat("HTTP connections up to ", plan.http_max_connections, clamped, "; ")
                : std::string(),
      "gRPC connections share the other ", plan.grpc_share);
  return plan;
}

}  // namespace ltm
