// A small MPI program for watchdog_test: 4 ranks (tp 2 x pp 2) run collectives while one rank
// misbehaves. Not a test itself; watchdog_test starts it under mpirun and reads its exit code and
// stderr.
//
//   watchdog_victim <mode> <victim rank> <op> <timeout s> [pid dir]
//   mode: hang     the victim sleeps forever instead of joining <op>
//         kill     the victim SIGKILLs itself instead of joining <op>
//         ok       nobody misbehaves: <op> completes, exit 0
//         idle     rank 0 stays idle for 2 x timeout before posting the next plan, the others
//                  wait in recv_wait for its posted plan: must complete, exit 0
//         truncate stage 1 receives into a buffer smaller than stage 0 sends (an MPI error, not a
//                  timeout): must end with the "MPI ... failed" message, exit 2
//         assert   the victim fails an LTM_ASSERT, the others wait in <op>: the group must go
//                  down through the group abort (exit 7, host and rank named), not SIGABRT
//         pipe     the victim takes a SIGPIPE (as Open MPI's writev to a vanished peer does),
//                  then waits in <op> for peers that never come: must end with the broken-pipe
//                  message, exit 5, long before <timeout s>
//         orphan   every other rank waits in recv_wait forever (rank 0 sleeps); the test kills
//                  mpirun and checks the ranks go away (each writes <pid dir>/rank<r>.pid, and
//                  its stderr goes to <pid dir>/rank<r>.err, since mpirun no longer forwards it)
//   op:   all_reduce (tp group), all_gather (tp), broadcast (world), send (pp: stage 0 -> 1),
//         barrier (world)
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "parallel/watchdog.h"
#include "parallel/world.h"

namespace {

using ltm::parallel::MpiCommunicator;
using ltm::parallel::MpiWorld;
using ltm::parallel::WorldLayout;

[[noreturn]] void sleep_forever() {
  for (;;) pause();
}

// Runs `op` on this rank's group; every rank of that group must call it.
void run_op(const std::string& op, MpiWorld& world, const WorldLayout& layout) {
  std::vector<float> data(768, 1.0f);
  if (op == "all_reduce") {
    world.tp().all_reduce_sum(data.data(), data.size());
  } else if (op == "all_gather") {
    std::vector<float> out(data.size() * layout.tp);
    world.tp().all_gather(data.data(), out.data(), data.size() * sizeof(float));
  } else if (op == "broadcast") {
    world.world().broadcast(data.data(), data.size() * sizeof(float), 0);
  } else if (op == "send") {
    if (layout.pp_rank() == 0) world.pp().send(data.data(), data.size() * sizeof(float), 1, 7);
    if (layout.pp_rank() == 1) world.pp().recv(data.data(), data.size() * sizeof(float), 0, 7);
  } else if (op == "barrier") {
    world.world().barrier();
  } else {
    std::fprintf(stderr, "watchdog_victim: unknown op %s\n", op.c_str());
    std::exit(64);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(
        stderr,
        "usage: %s <hang|kill|ok|idle|truncate|pipe|assert|orphan> <victim rank> <op> <timeout s> [pid dir]\n",
        argv[0]);
    return 64;
  }
  const std::string mode = argv[1];
  const int victim = std::atoi(argv[2]);
  const std::string op = argv[3];
  const double timeout_s = std::atof(argv[4]);

  MpiWorld world(&argc, &argv);
  world.set_collective_timeout(timeout_s);
  auto layout = world.create_groups(2, world.size() / 2);
  if (!layout.ok()) {
    std::fprintf(stderr, "watchdog_victim: %s\n", std::string(layout.status().message()).c_str());
    return 64;
  }
  if (argc > 5) {  // for a test that outlives mpirun: where to find this rank and its messages
    const std::string base = std::string(argv[5]) + "/rank" + std::to_string(world.rank());
    std::ofstream(base + ".pid") << getpid() << "\n";
    if (!std::freopen((base + ".err").c_str(), "w", stderr)) return 66;
  }

  run_op("all_reduce", world, *layout);  // everyone healthy once
  world.world().barrier();

  if (mode == "idle" || mode == "orphan") {
    int plan[4] = {0, 0, 0, 0};
    if (world.rank() == 0) {
      if (mode == "orphan") sleep_forever();
      usleep(static_cast<useconds_t>(2 * timeout_s * 1e6));  // idle longer than the timeout
      plan[0] = 42;
      for (int r = 1; r < world.world().size(); ++r)  // as Engine posts its step plans
        world.world().post(plan, sizeof(plan), r, 7);
      world.world().flush();
    } else {
      world.world().recv_wait(plan, sizeof(plan), 0, 7);
    }
    if (plan[0] != 42) {
      std::fprintf(stderr, "watchdog_victim: rank %d got plan %d, not 42\n", world.rank(), plan[0]);
      return 65;
    }
    run_op(op, world, *layout);  // and work goes on under the normal timeout
    std::printf("watchdog_victim: rank %d finished\n", world.rank());
    return 0;
  }

  if (mode == "truncate") {
    std::vector<char> buffer(3072);
    if (layout->pp_rank() == 0) world.pp().send(buffer.data(), 3072, 1, 9);
    if (layout->pp_rank() == 1) world.pp().recv(buffer.data(), 1024, 0, 9);
    world.world().barrier();
    return 0;
  }
  if (mode == "pipe") {
    if (world.rank() != victim) sleep_forever();
    ltm::parallel::watch_broken_pipes();
    raise(SIGPIPE);
    run_op(op, world, *layout);
    return 0;
  }
  if (world.rank() == victim) {
    if (mode == "hang") sleep_forever();
    if (mode == "kill") raise(SIGKILL);
    if (mode == "assert") LTM_ASSERT(victim < 0, "the victim's invariant, ", 42);
  }
  run_op(op, world, *layout);
  run_op("all_reduce", world, *layout);  // ranks outside the victim's group get stuck here
  // Only ranks outside the victim's groups get here; they wait for the others far longer than
  // the victim's peers do, so the first timeout (the message the tests expect) is always a
  // peer's, even on a loaded machine where a peer starts its wait late.
  world.set_collective_timeout(4 * timeout_s);
  world.world().barrier();
  std::printf("watchdog_victim: rank %d finished\n", world.rank());
  return 0;
}
