// Which host each world rank runs on, so that failure messages name what was lost ("rank 2 on h1")
// and not only the rank that noticed it.
//
// MpiWorld fills the table once at start-up (an all-gather of host names under the watchdog);
// before that, or in a process without MPI, it is empty and describe_ranks() returns "".
// Threading: set once on the main thread before any communicator is used; read from any thread.
#pragma once

#include <string>
#include <vector>

namespace ltm::parallel {

// hosts[r] is the host name of world rank r.
void set_rank_hosts(std::vector<std::string> hosts);
// The host of world rank r, or "" when unknown.
const std::string& rank_host(int world_rank);

// "rank 2 on h1", "ranks 0, 1 on h0; rank 2 on h1" (ranks grouped by host in the order given);
// "" when no host is known for any of them. A rank with no known host is listed as "rank 5".
std::string describe_ranks(const std::vector<int>& world_ranks);

}  // namespace ltm::parallel
