// LoadingResponder (runtime/serve/loading_responder.h): answers 503 "loading", and an accept that
// fails for want of a descriptor is retried with a backoff, not in a loop.
#include "runtime/serve/loading_responder.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace ltm {
namespace {

using namespace std::chrono_literals;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string health(int fd) {
  const std::string req = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
  EXPECT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  return out;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

TEST(LoadingResponder, AnswersLoading) {
  const int port = free_port();
  absl::StatusOr<std::unique_ptr<LoadingResponder>> r =
      LoadingResponder::start("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(r.ok()) << r.status();
  const int fd = connect_to(port);
  const std::string got = health(fd);
  ::close(fd);
  EXPECT_THAT(got, ::testing::StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(got, ::testing::HasSubstr(R"({"status":"loading"})"));
}

TEST(LoadingResponder, AFailedAcceptDoesNotSpin) {
  const int port = free_port();
  absl::StatusOr<std::unique_ptr<LoadingResponder>> r =
      LoadingResponder::start("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(r.ok()) << r.status();
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 1024);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fillers;  // every descriptor but one, which the client's socket takes
  for (int i = 0; i < 4096; ++i) {
    const int fd = ::open("/dev/null", O_RDONLY);
    if (fd < 0) break;
    fillers.push_back(fd);
  }
  ASSERT_GT(fillers.size(), 1u);
  ::close(fillers.back());
  fillers.pop_back();
  const int client = connect_to(port);  // queued: the responder's accept fails with EMFILE
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(500ms);
  const double cpu = process_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A thread retrying accept in a loop spends the whole interval on the CPU.
  EXPECT_LT(cpu, 0.25 * wall) << cpu << " s of CPU in " << wall << " s";
  ::close(fillers.back());  // a descriptor comes free: the next try accepts
  fillers.pop_back();
  EXPECT_THAT(health(client), ::testing::HasSubstr(R"({"status":"loading"})"));
  ::close(client);
  for (int fd : fillers) ::close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace ltm
