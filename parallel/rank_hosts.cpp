#include "parallel/rank_hosts.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ltm::parallel {
namespace {

// Published once through an atomic pointer: readers on other threads (an abort on a pipeline
// thread) see either nothing or the whole table.
std::atomic<const std::vector<std::string>*> g_hosts{nullptr};

const std::string& empty() {
  static const std::string e;
  return e;
}

}  // namespace

void set_rank_hosts(std::vector<std::string> hosts) {
  // Leaked on purpose: a message may be built while the process exits.
  g_hosts.store(new std::vector<std::string>(std::move(hosts)), std::memory_order_release);
}

const std::string& rank_host(int world_rank) {
  const std::vector<std::string>* hosts = g_hosts.load(std::memory_order_acquire);
  if (hosts == nullptr || world_rank < 0 || world_rank >= static_cast<int>(hosts->size()))
    return empty();
  return (*hosts)[world_rank];
}

std::string describe_ranks(const std::vector<int>& world_ranks) {
  // Runs of consecutive entries on the same host become "ranks a, b on host".
  std::vector<std::string> parts;
  bool any_known = false;
  size_t i = 0;
  while (i < world_ranks.size()) {
    const std::string& host = rank_host(world_ranks[i]);
    std::vector<int> run{world_ranks[i]};
    size_t j = i + 1;
    while (!host.empty() && j < world_ranks.size() && rank_host(world_ranks[j]) == host)
      run.push_back(world_ranks[j++]);
    std::string part = absl::StrCat(run.size() == 1 ? "rank " : "ranks ", absl::StrJoin(run, ", "));
    if (!host.empty()) {
      any_known = true;
      absl::StrAppend(&part, " on ", host);
    }
    parts.push_back(std::move(part));
    i = j;
  }
  return any_known ? absl::StrJoin(parts, "; ") : std::string();
}

}  // namespace ltm::parallel
