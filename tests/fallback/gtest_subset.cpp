// The runner of tests/fallback/gtest/gtest.h (the GPU-only build's GoogleTest stand-in): test
// registry, --gtest_filter, failure records, skips, traces and the death-test child.
#include "gtest/gtest.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace testing {
namespace internal {
namespace {

struct RunState {
  bool failed = false;
  bool fatal = false;
  bool skipped = false;
  std::vector<std::string> traces;
};
RunState g_run;
std::string g_filter = "*";
bool g_list = false;
std::string g_argv0;
std::string g_current_test;
// In a death-test child: the statement to run ("file:line"), else empty.
std::string g_death_statement;
constexpr int kDidNotDie = 97;

bool glob(const char* p, const char* s) {
  if (*p == '\0') return *s == '\0';
  if (*p == '*') return glob(p + 1, s) || (*s != '\0' && glob(p, s + 1));
  if (*s == '\0') return false;
  return (*p == '?' || *p == *s) && glob(p + 1, s + 1);
}

bool any_glob(const std::string& patterns, const std::string& name) {
  size_t start = 0;
  while (start <= patterns.size()) {
    const size_t end = std::min(patterns.find(':', start), patterns.size());
    if (glob(patterns.substr(start, end - start).c_str(), name.c_str())) return true;
    start = end + 1;
  }
  return false;
}

bool selected(const std::string& name) {
  const size_t dash = g_filter.find('-');
  const std::string positive = dash == std::string::npos ? g_filter : g_filter.substr(0, dash);
  const std::string negative = dash == std::string::npos ? "" : g_filter.substr(dash + 1);
  if (!(positive.empty() ? true : any_glob(positive, name))) return false;
  return negative.empty() || !any_glob(negative, name);
}

bool quiet() { return !g_death_statement.empty(); }

}  // namespace

std::vector<TestEntry>& registry() {
  static std::vector<TestEntry> r;
  return r;
}
std::vector<ParamPattern>& param_patterns() {
  static std::vector<ParamPattern> r;
  return r;
}
std::vector<ParamInstantiation>& param_instantiations() {
  static std::vector<ParamInstantiation> r;
  return r;
}

void report(const char* file, int line, const std::string& what, const std::string& message,
            bool fatal) {
  g_run.failed = true;
  if (fatal) g_run.fatal = true;
  std::fprintf(stdout, "%s:%d: Failure\n%s\n", file, line, what.c_str());
  if (!message.empty()) std::fprintf(stdout, "%s\n", message.c_str());
  for (auto it = g_run.traces.rbegin(); it != g_run.traces.rend(); ++it)
    std::fprintf(stdout, "%s\n", it->c_str());
  std::fflush(stdout);
}

void mark_skipped(const std::string& message) {
  g_run.skipped = true;
  if (!quiet()) std::fprintf(stdout, "Skipped: %s\n", message.c_str());
}

void push_trace(const char* file, int line, const std::string& message) {
  g_run.traces.push_back(std::string("Google Test trace:\n") + file + ":" +
                         std::to_string(line) + ": " + message);
}
void pop_trace() {
  if (!g_run.traces.empty()) g_run.traces.pop_back();
}

void set_flag(const char*, const char*) {}  // every death test is "threadsafe" here

bool in_death_child() { return !g_death_statement.empty(); }

bool is_death_statement(const char* file, int line) {
  return g_death_statement == std::string(file) + ":" + std::to_string(line);
}

void death_statement_returned() {
  std::fflush(nullptr);
  std::_Exit(kDidNotDie);
}

DeathOutcome run_death_test(const char* file, int line, const std::function<bool(int)>& predicate,
                            const char* regex, const char* statement_text) {
  int err[2];
  if (pipe(err) != 0) return {false, "death test: pipe() failed"};
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return {false, "death test: fork() failed"};
  if (pid == 0) {
    // The child execs this binary at once (nothing else runs in the forked copy).
    dup2(err[1], STDERR_FILENO);
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) dup2(null_fd, STDOUT_FILENO);
    close(err[0]);
    close(err[1]);
    const std::string filter = "--gtest_filter=" + g_current_test;
    const std::string which = std::string("--ltm_death_statement=") + file + ":" +
                              std::to_string(line);
    execl("/proc/self/exe", g_argv0.c_str(), filter.c_str(), which.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err[1]);
  std::string output;
  char buf[4096];
  ssize_t n;
  while ((n = read(err[0], buf, sizeof(buf))) > 0) output.append(buf, static_cast<size_t>(n));
  close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == kDidNotDie)
    return {false, std::string("Death test: ") + statement_text +
                       "\n    Result: failed to die.\n Error msg:\n" + output};
  if (!predicate(status))
    return {false, std::string("Death test: ") + statement_text +
                       "\n    Result: died but not in the expected way (" +
                       (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                          : "signal " + std::to_string(WTERMSIG(status))) +
                       ").\n Error msg:\n" + output};
  if (!std::regex_search(output, std::regex(regex)))
    return {false, std::string("Death test: ") + statement_text +
                       "\n    Result: died but not with the expected error.\n  Expected: " +
                       regex + "\nActual msg:\n" + output};
  return {true, ""};
}

}  // namespace internal

void InitGoogleTest(int* argc, char** argv) {
  using namespace internal;
  if (*argc > 0) g_argv0 = argv[0];
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--gtest_filter=", 0) == 0) {
      g_filter = a.substr(15);
    } else if (a == "--gtest_list_tests") {
      g_list = true;
    } else if (a.rfind("--ltm_death_statement=", 0) == 0) {
      g_death_statement = a.substr(22);
    } else if (a.rfind("--gtest_", 0) == 0) {
      // Other GoogleTest flags (colour, repeat, ...) are accepted and ignored.
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
}

int RunAllTests() {
  using namespace internal;
  std::vector<TestEntry> tests = registry();
  for (const ParamInstantiation& inst : param_instantiations())
    inst.expand(param_patterns(), &tests);
  std::vector<const TestEntry*> chosen;
  for (const TestEntry& t : tests)
    if (selected(t.suite + "." + t.name)) chosen.push_back(&t);
  if (g_list) {
    std::string suite;
    for (const TestEntry* t : chosen) {
      if (t->suite != suite) std::printf("%s.\n", (suite = t->suite).c_str());
      std::printf("  %s\n", t->name.c_str());
    }
    return 0;
  }
  std::set<std::string> suites;
  for (const TestEntry* t : chosen) suites.insert(t->suite);
  if (!quiet())
    std::printf("[==========] Running %zu tests from %zu test suites.\n", chosen.size(),
                suites.size());
  std::vector<std::string> failed, skipped;
  size_t passed = 0;
  const auto t_all = std::chrono::steady_clock::now();
  for (const TestEntry* t : chosen) {
    const std::string name = t->suite + "." + t->name;
    g_current_test = name;
    g_run = RunState();
    if (!quiet()) std::printf("[ RUN      ] %s\n", name.c_str());
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    current_param() = t->param.get();
    std::unique_ptr<Test> test(t->make());
    test->SetUp();
    if (!g_run.fatal && !g_run.skipped) test->TestBody();
    test->TearDown();
    test.reset();
    const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - t0).count();
    if (quiet()) continue;
    if (g_run.failed) {
      failed.push_back(name);
      std::printf("[  FAILED  ] %s (%lld ms)\n", name.c_str(), ms);
    } else if (g_run.skipped) {
      skipped.push_back(name);
      std::printf("[  SKIPPED ] %s (%lld ms)\n", name.c_str(), ms);
    } else {
      ++passed;
      std::printf("[       OK ] %s (%lld ms)\n", name.c_str(), ms);
    }
    std::fflush(stdout);
  }
  if (quiet()) return g_run.failed ? 1 : 0;
  const long long ms_all = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - t_all).count();
  std::printf("[==========] %zu tests from %zu test suites ran. (%lld ms total)\n", chosen.size(),
              suites.size(), ms_all);
  std::printf("[  PASSED  ] %zu tests.\n", passed);
  if (!skipped.empty()) {
    std::printf("[  SKIPPED ] %zu tests, listed below:\n", skipped.size());
    for (const std::string& s : skipped) std::printf("[  SKIPPED ] %s\n", s.c_str());
  }
  if (!failed.empty()) {
    std::printf("[  FAILED  ] %zu tests, listed below:\n", failed.size());
    for (const std::string& f : failed) std::printf("[  FAILED  ] %s\n", f.c_str());
  }
  std::fflush(stdout);
  return failed.empty() ? 0 : 1;
}

}  // namespace testing
