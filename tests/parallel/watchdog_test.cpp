// The collective watchdog.
//  - poll_until and Deadline, without MPI: completion, timeouts on time, idle waits.
//  - whole runs: `mpirun -n 4 watchdog_victim ...` where one rank hangs or SIGKILLs itself in
//    the middle of a collective. The run must end non-zero within timeout + 10 s, and for a hang
//    with the watchdog's message naming host, rank, operation and group. Also: an idle wait longer
//    than the timeout must not fire, and ranks left behind by a SIGKILLed mpirun must go away.
//
// Needs mpirun (LTM_MPIEXEC, else mpirun on PATH) and the watchdog_victim executable
// (LTM_WATCHDOG_VICTIM, else next to this test).
#include "parallel/watchdog.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "parallel/group_abort.h"

namespace ltm::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- poll_until and Deadline ---------------------------------------------------------------

TEST(Deadline, NeverAndAfter) {
  EXPECT_TRUE(Deadline::never().is_never());
  EXPECT_TRUE(Deadline::after(0).is_never());
  EXPECT_TRUE(Deadline::after(-1).is_never());
  const Deadline d = Deadline::after(2.5);
  EXPECT_FALSE(d.is_never());
  EXPECT_EQ(d.seconds(), 2.5);
  EXPECT_FALSE(d.expired(Clock::now()));
  EXPECT_TRUE(d.expired(Clock::now() + std::chrono::seconds(3)));
}

TEST(PollUntil, DoneAtOnce) {
  int calls = 0;
  EXPECT_EQ(poll_until([&] { return ++calls > 0; }, Deadline::after(1), WatchdogOptions{}),
            PollResult::kDone);
  EXPECT_EQ(calls, 1);
}

TEST(PollUntil, DoneAfterAWhileIsNoticedPromptly) {
  const auto start = Clock::now();
  const auto ready = start + std::chrono::milliseconds(30);
  const PollResult result =
      poll_until([&] { return Clock::now() >= ready; }, Deadline::after(5), WatchdogOptions{});
  const double took = seconds_since(start);
  EXPECT_EQ(result, PollResult::kDone);
  EXPECT_GE(took, 0.030);
  // Noticed within ~1/8 of the wait (4 ms) on a quiet machine; the margin is for loaded ones.
  EXPECT_LT(took, 0.030 + 0.025);
}

// Counts the polls made after `quiet_after` of waiting, when the spinning is long over.
struct PollCounter {
  Clock::time_point start = Clock::now();
  std::chrono::milliseconds quiet_after{50};
  int all = 0;
  int late = 0;
  void count() {
    ++all;
    if (Clock::now() - start >= quiet_after) ++late;
  }
};

TEST(PollUntil, TimesOutOnTimeAndNapsWhileWaiting) {
  PollCounter polls;
  const PollResult result =
      poll_until([&] { return polls.count(), false; }, Deadline::after(0.2), WatchdogOptions{});
  const double took = seconds_since(polls.start);
  EXPECT_EQ(result, PollResult::kTimedOut);
  EXPECT_GE(took, 0.2);
  EXPECT_LT(took, 0.3);
  // After the first 50 ms the naps are at their 250 us cap: ~600 polls in the last 150 ms.
  std::printf("poll_until: %d polls in %.3f s, %d after the first 50 ms\n", polls.all, took,
              polls.late);
  EXPECT_LT(polls.late, 1000);
  EXPECT_GT(polls.late, 50);
}

TEST(PollUntil, IdleWaitHasNoDeadlineAndNapsLonger) {
  PollCounter polls;
  const auto ready = polls.start + std::chrono::milliseconds(300);
  EXPECT_EQ(poll_until([&] { return polls.count(), Clock::now() >= ready; }, Deadline::never(),
                       WatchdogOptions{}),
            PollResult::kDone);
  const double took = seconds_since(polls.start);
  // Naps of up to 2 ms once waiting is long: ~125 polls in the last 250 ms.
  std::printf("poll_until idle: %d polls in %.3f s, %d after the first 50 ms\n", polls.all, took,
              polls.late);
  EXPECT_LT(polls.late, 250);
  EXPECT_LT(took, 0.300 + 0.030);
}

TEST(PollUntil, LauncherGoneIsNoticedWithinASecondOrSo) {
  watch_launcher(getppid() + 100000);  // not our parent: as if the launcher had died
  const auto start = Clock::now();
  EXPECT_EQ(poll_until([] { return false; }, Deadline::never(), WatchdogOptions{}),
            PollResult::kLauncherGone);
  EXPECT_LT(seconds_since(start), 1.5);
  watch_launcher(0);
  EXPECT_TRUE(launcher_alive());
}

TEST(Watchdog, TimeoutMessageNamesHostRankOpGroupBytes) {
  Watchdog watchdog("tp", WatchdogOptions{});
  EXPECT_EQ(watchdog.timeout_s(), 300);
  watchdog.set_timeout(2);
  EXPECT_EQ(watchdog.timeout_s(), 2);
  EXPECT_EQ(watchdog.timeout_message("all_reduce_sum", 3072, 2),
            "ltm: " + this_host() +
                ":-1: collective all_reduce_sum on group tp (3072 bytes) did not finish within 2 s;"
                " a peer rank is dead or stuck; aborting the group");
}

// ---- whole runs under mpirun ---------------------------------------------------------------

struct RunResult {
  int exit_code = -1;  // the exit status, or 128 + signal
  double seconds = 0;
  std::string output;  // stdout and stderr together
};

std::string mpiexec() {
  const char* env = std::getenv("LTM_MPIEXEC");
  return env && *env ? env : "mpirun";
}

std::string victim_path() {
  if (const char* env = std::getenv("LTM_WATCHDOG_VICTIM"); env && *env) return env;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "watchdog_victim")
      .string();
}

std::string temp_dir() {
  char tmpl[] = "/tmp/ltm_watchdog_test_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  return dir ? dir : "/tmp";
}

// Starts `mpirun -n 4 <victim> <args>` with output to a file; returns its pid.
pid_t start_run(const std::vector<std::string>& args, const std::string& output_path) {
  std::vector<std::string> argv = {mpiexec(), "-n", "4", "--oversubscribe", victim_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own process group, so a stray run can be killed whole
    const int fd = open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_orte_base_help_aggregate", "0", 1);
    std::vector<char*> c_argv;
    for (auto& a : argv) c_argv.push_back(a.data());
    c_argv.push_back(nullptr);
    execvp(c_argv[0], c_argv.data());
    _exit(127);
  }
  return pid;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits up to `limit_s` for the run; kills its process group if it is still going.
RunResult wait_run(pid_t pid, const std::string& output_path, double limit_s) {
  const auto start = Clock::now();
  RunResult result;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (seconds_since(start) > limit_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.output = "(killed by the test after " + std::to_string(limit_s) + " s)\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = seconds_since(start);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.output += read_file(output_path);
  return result;
}

RunResult run_victim(const std::vector<std::string>& args, double limit_s) {
  const std::string dir = temp_dir();
  const std::string output = dir + "/output.txt";
  const auto start = Clock::now();
  RunResult result = wait_run(start_run(args, output), output, limit_s);
  result.seconds = seconds_since(start);
  std::filesystem::remove_all(dir);
  return result;
}

class WatchdogRun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(victim_path())) {
      GTEST_FAIL() << "watchdog_victim not found at " << victim_path()
                   << " (build it, or set LTM_WATCHDOG_VICTIM)";
    }
  }
  static constexpr double kTimeout = 2;            // --collective-timeout of the victims
  static constexpr double kLimit = kTimeout + 10;  // what the group may take to go down
  std::string host_ = this_host();
};

TEST_F(WatchdogRun, RankHangingInAllReduceBringsTheGroupDown) {
  // Rank 1 never joins its TP all-reduce; rank 0 (its TP peer) must time out.
  const RunResult run = run_victim({"hang", "1", "all_reduce", "2"}, 60);
  std::printf("hang in all_reduce: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_EQ(run.exit_code, kExitCollectiveTimeout) << run.output;
  EXPECT_LT(run.seconds, kLimit) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("ltm: " + host_ +
                        ":0: collective all_reduce_sum on group tp (3072 bytes) did not "
                        "finish within 2 s; a peer rank is dead or stuck; aborting the "
                        "group (members: ranks 0, 1 on " + host_ + ")"));
}

TEST_F(WatchdogRun, RankHangingInSendBringsTheGroupDown) {
  // Rank 1 (stage 0) never sends to rank 3 (stage 1) on the PP group.
  const RunResult run = run_victim({"hang", "1", "send", "2"}, 60);
  std::printf("hang in send: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_EQ(run.exit_code, kExitCollectiveTimeout) << run.output;
  EXPECT_LT(run.seconds, kLimit) << run.output;
  EXPECT_THAT(run.output, HasSubstr("ltm: " + host_ +
                                    ":3: collective recv(src=0,tag=7) on group pp (3072 bytes) did "
                                    "not finish within 2 s"));
  // The peer is named by its world rank and host: pp group rank 0 of tp_rank 1 is world rank 1.
  EXPECT_THAT(run.output, HasSubstr("aborting the group (peer: rank 1 on " + host_ + ")"));
}

TEST_F(WatchdogRun, RootHangingInBroadcastBringsTheGroupDown) {
  const RunResult run = run_victim({"hang", "0", "broadcast", "2"}, 60);
  std::printf("hang in broadcast: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_EQ(run.exit_code, kExitCollectiveTimeout) << run.output;
  EXPECT_LT(run.seconds, kLimit) << run.output;
  EXPECT_THAT(run.output,
              ContainsRegex("ltm: " + host_ +
                            ":[123]: collective broadcast\\(root=0\\) on group world \\(3072 "
                            "bytes\\) did not finish within 2 s"));
}

TEST_F(WatchdogRun, RankKilledMidCollectiveBringsTheGroupDown) {
  // Open MPI's mpirun sees the SIGKILLed rank and kills the job itself (usually before our
  // deadline); either way the run must end non-zero in time.
  const RunResult run = run_victim({"kill", "2", "all_reduce", "2"}, 60);
  std::printf("killed in all_reduce: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(run.seconds, kLimit) << run.output;
  EXPECT_THAT(run.output, ContainsRegex("rank 2.*(exited on signal 9|Killed)|collective"))
      << run.output;
}

TEST_F(WatchdogRun, MpiErrorBringsTheGroupDownWithItsMessage) {
  // Stage 1 receives 1024 bytes where stage 0 sends 3072: MPI_ERR_TRUNCATE on ranks 2 and 3.
  const RunResult run = run_victim({"truncate", "-1", "send", "2"}, 60);
  std::printf("truncated recv: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_EQ(run.exit_code, kExitMpiFailure) << run.output;
  EXPECT_LT(run.seconds, kLimit) << run.output;
  EXPECT_THAT(
      run.output,
      ContainsRegex("ltm: " + host_ +
                    ":[23]: MPI recv\\(src=0,tag=9\\) on group pp failed: MPI_ERR_TRUNCATE: "
                    "message truncated \\(peer: rank [01] on " + host_ +
                    "\\) \\(.*parallel/[a-z_]+\\.cpp:[0-9]+\\)"));
}

TEST_F(WatchdogRun, BrokenPipeWhileWaitingAbortsTheGroupNamingThePeers) {
  // Rank 1 takes a SIGPIPE (what Open MPI's writev to a vanished peer raises), then waits in its
  // TP all-reduce for rank 0, which never comes: the group goes down at once with exit 5, not
  // after the 60 s timeout, and not by the signal (141).
  const RunResult run = run_victim({"pipe", "1", "all_reduce", "60"}, 60);
  std::printf("broken pipe: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_EQ(run.exit_code, kExitMpiFailure) << run.output;
  EXPECT_LT(run.seconds, 30) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("ltm: " + host_ +
                        ":1: a connection to a peer broke (EPIPE, \"Broken pipe\") while this "
                        "rank waited in all_reduce_sum on group tp; a peer rank or its node was "
                        "lost; aborting the group (members: ranks 0, 1 on " + host_ + ")"));
}

TEST_F(WatchdogRun, FailedAssertTakesTheGroupDownThroughTheGroupAbort) {
  // Rank 2 fails an LTM_ASSERT while the others wait in a collective: one message naming host,
  // rank and the check, and the documented exit code (7), not SIGABRT's 134.
  const RunResult run = run_victim({"assert", "2", "all_reduce", "30"}, 60);
  std::printf("failed assert: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_EQ(run.exit_code, kExitInternalError) << run.output;
  EXPECT_LT(run.seconds, kLimit) << run.output;  // well before the 30 s collective timeout
  EXPECT_THAT(run.output, ContainsRegex("ltm: " + host_ +
                                        ":2: internal error at .*watchdog_victim.cpp:[0-9]+: check "
                                        "`victim < 0` failed: the victim's invariant, 42"));
}

TEST_F(WatchdogRun, IdleWaitLongerThanTheTimeoutIsFine) {
  // Rank 0 stays idle 2 x 1 s before posting its plan; the others wait in recv_wait.
  const RunResult run = run_victim({"idle", "-1", "all_reduce", "1"}, 60);
  std::printf("idle wait: exit %d after %.2f s\n", run.exit_code, run.seconds);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("rank 3 finished"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("did not finish")));
}

TEST_F(WatchdogRun, RanksLeftByAKilledMpirunGoAway) {
  const std::string dir = temp_dir();
  const pid_t mpirun = start_run({"orphan", "-1", "all_reduce", "2", dir}, dir + "/output.txt");
  // Wait until every rank wrote its pid (it is then past start-up, waiting for work).
  std::vector<pid_t> ranks;
  const auto start = Clock::now();
  while (ranks.size() < 4 && seconds_since(start) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ranks.clear();
    for (int r = 0; r < 4; ++r) {
      std::ifstream in(dir + "/rank" + std::to_string(r) + ".pid");
      pid_t pid = 0;
      if (in >> pid) ranks.push_back(pid);
    }
  }
  ASSERT_EQ(ranks.size(), 4u) << read_file(dir + "/output.txt");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(mpirun, SIGKILL);  // only mpirun: the ranks stay behind, orphaned
  waitpid(mpirun, nullptr, 0);
  const auto killed = Clock::now();
  std::vector<pid_t> alive = ranks;
  while (!alive.empty() && seconds_since(killed) < kLimit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::erase_if(alive, [](pid_t pid) { return kill(pid, 0) != 0; });
  }
  std::printf("orphaned ranks gone %.2f s after mpirun was killed\n", seconds_since(killed));
  std::string messages;
  for (int r = 0; r < 4; ++r) messages += read_file(dir + "/rank" + std::to_string(r) + ".err");
  EXPECT_TRUE(alive.empty()) << alive.size() << " ranks still running; " << messages;
  for (pid_t pid : alive) kill(pid, SIGKILL);
  std::printf("%s", messages.c_str());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ltm::parallel
