// File descriptors of a serving process: how many it may open, and how the front doors' connection
// caps fit below that with room for everything else (docs/architecture.md "Hardening").
//
// Every client connection costs one descriptor; so does every checkpoint shard while it is mapped,
// every adapter file while it loads, and every MPI link (Open MPI keeps a TCP socket or a shared
// memory segment per peer, plus its daemon's pipes). A server that lets connections take the last
// descriptor fails a LoadAdapter, or an MPI reconnect, that had nothing to do with them. So:
//   - at start-up the soft RLIMIT_NOFILE is raised to the hard one (the soft default, 1024, is a
//     relic of select(); nothing here uses select);
//   - kReservedDescriptors + kDescriptorsPerRank x world size stay for files and MPI;
//   - HTTP gets at most half of the rest (--http-max-connections; 0: min(1024, that half)); gRPC
//     connections, which gRPC 1.51 cannot count, share the other half (each gets at most
//     --max-streams-per-connection calls, and idle ones are closed: grpc_server.cpp).
// An explicit --http-max-connections that does not fit is refused (InvalidArgument naming the flag
// and the numbers); the automatic one is clamped, and the plan's summary says so.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ltm {

inline constexpr int64_t kReservedDescriptors = 256;  // checkpoint shards, adapters, logs, eventfds
inline constexpr int64_t kDescriptorsPerRank = 4;     // MPI: a link per peer and its daemon's
inline constexpr int kDefaultHttpMaxConnections = 1024;

struct DescriptorLimit {
  int64_t soft_before = 0;  // the soft limit this process started with
  int64_t soft = 0;         // the soft limit now
  int64_t hard = 0;         // the hard limit (RLIM_INFINITY reads as INT64_MAX)
};

// Raises the soft RLIMIT_NOFILE to the hard one (to /proc/sys/fs/nr_open where the hard one is
// unlimited) and says what it found and did. Never fails: a limit that cannot be raised stays.
DescriptorLimit raise_descriptor_limit();

struct DescriptorPlan {
  int64_t limit = 0;          // descriptors this process may hold
  int64_t reserved = 0;       // kept for files and MPI
  int http_max_connections = 0;
  int64_t grpc_share = 0;     // what is left for gRPC's connections
  std::string summary;        // one line for the start-up log
};

// The plan for a server under `limit` with a world of `world_size` ranks. `http_max_connections`
// is the flag (0: automatic); `with_http` whether --http is given.
absl::StatusOr<DescriptorPlan> plan_descriptors(const DescriptorLimit& limit, int world_size,
                                                int http_max_connections, bool with_http);

}  // namespace ltm
