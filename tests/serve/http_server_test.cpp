// HttpServer (runtime/serve/http_server.h) in-process, against a fake sink that the test drives as
// the step thread would: whole and streamed completions on one keep-alive connection, a client
// that disconnects mid-stream (its CancelFlag is set), 429 with Retry-After, draining, and a final
// event that comes after the server is gone (run under ASan by scripts/test_asan).
#include "runtime/serve/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/serve/toy_vocab.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

Tokenizer toy_tokenizer() {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(testing_vocab::byte_spelling(b), b);
  vocab.emplace_back("he", 256);
  vocab.emplace_back("ll", 257);
  vocab.emplace_back("hell", 258);
  vocab.emplace_back("<|endoftext|>", 259);
  absl::StatusOr<Tokenizer> t = Tokenizer::from_tables(
      vocab, {{"h", "e"}, {"l", "l"}, {"he", "ll"}}, "toy");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

// Holds submitted requests until the test answers them.
class FakeSink final : public RequestSink {
 public:
  struct Call {
    GenerationRequest request;
    EventCallback on_event;
  };
  absl::Status submit(GenerationRequest request, EventCallback on_event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!refuse_.ok()) return refuse_;
    calls_.push_back({std::move(request), std::move(on_event)});
    cv_.notify_all();
    return absl::OkStatus();
  }
  Call take() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 10s, [&] { return !calls_.empty(); })) << "no request came";
    Call c = std::move(calls_.front());
    calls_.pop_front();
    return c;
  }
  void refuse(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_ = std::move(s);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call> calls_;
  absl::Status refuse_;
};

GenerationEvent tokens(std::vector<int32_t> ids, std::string text) {
  GenerationEvent e;
  e.token_ids = std::move(ids);
  e.text = std::move(text);
  return e;
}
GenerationEvent final_event(FinishReason reason, int32_t prompt, int32_t completion) {
  GenerationEvent e;
  e.finished = true;
  e.finish_reason = reason;
  e.prompt_tokens = prompt;
  e.completion_tokens = completion;
  return e;
}

// A blocking loopback client.
class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Client() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool try_send(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  void send(const std::string& s) { ASSERT_EQ(::send(fd_, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size())); }
  void post(const std::string& path, const std::string& body) {
    send("POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  // Reads until `done(buffer)` says the response is complete (or 10 s pass). Returns it and keeps
  // what came after.
  std::string read_until(const std::function<size_t(const std::string&)>& complete) {
    for (int i = 0; i < 1000; ++i) {
      if (const size_t n = complete(buf_); n > 0) {
        std::string out = buf_.substr(0, n);
        buf_.erase(0, n);
        return out;
      }
      char tmp[4096];
      const ssize_t got = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (got <= 0) break;
      buf_.append(tmp, static_cast<size_t>(got));
    }
    return std::exchange(buf_, std::string());
  }
  // One whole response (Content-Length or chunked).
  std::string response() {
    return read_until([](const std::string& b) -> size_t {
      const size_t head = b.find("\r\n\r\n");
      if (head == std::string::npos) return 0;
      const std::string h = b.substr(0, head);
      if (h.find("chunked") != std::string::npos) {
        const size_t end = b.find("\r\n0\r\n\r\n", head);
        return end == std::string::npos ? 0 : end + 7;
      }
      const size_t cl = h.find("Content-Length: ");
      const size_t len = cl == std::string::npos ? 0 : std::stoul(h.substr(cl + 16));
      return b.size() >= head + 4 + len ? head + 4 + len : 0;
    });
  }
  std::string until(const std::string& marker) {
    return read_until([&](const std::string& b) -> size_t {
      const size_t at = b.find(marker);
      return at == std::string::npos ? 0 : at + marker.size();
    });
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

std::string body_of(const std::string& response) {
  return response.substr(response.find("\r\n\r\n") + 4);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    info_.model_name = "toy";
    info_.model.vocab_size = 260;
    info_.model.n_positions = 32;
    info_.model.eos_token_id = 259;
    HttpServerOptions o;
    o.address = "127.0.0.1:0";
    o.metrics = &metrics_;
    o.ready = [this] { return ready_.load(); };
    absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::start(o, sink_, tokenizer_, info_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  template <typename F>
  static bool eventually(F f) {
    for (int i = 0; i < 1000; ++i) {
      if (f()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  Tokenizer tokenizer_ = toy_tokenizer();
  EngineInfo info_;
  FakeSink sink_;
  ServeMetrics metrics_;
  std::atomic<bool> ready_{true};
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, WholeAndStreamedCompletionsOnOneConnection) {
  Client c(server_->port());
  c.post("/v1/completions", R"({"prompt": "hello", "max_tokens": 3, "temperature": 0})");
  FakeSink::Call call = sink_.take();
  EXPECT_EQ(call.request.prompt_ids, (std::vector<int32_t>{258, 'o'}));
  EXPECT_EQ(call.request.max_new_tokens, 3);
  EXPECT_THAT(call.request.request_id, ::testing::StartsWith("cmpl-"));
  call.on_event(tokens({'a'}, "a"));
  call.on_event(tokens({'b'}, "b"));
  call.on_event(final_event(FinishReason::kLength, 2, 2));
  const std::string r = c.response();
  ASSERT_THAT(r, ::testing::StartsWith("HTTP/1.1 200 "));
  const nlohmann::json j = nlohmann::json::parse(body_of(r));
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["total_tokens"], 4);
  EXPECT_EQ(j["id"], call.request.request_id);

  c.post("/v1/completions", R"({"prompt": [1, 2], "stream": true})");
  FakeSink::Call s = sink_.take();
  s.on_event(tokens({'x'}, "x"));
  EXPECT_THAT(c.until("\n\n"), HasSubstr(R"("text":"x")"));  // the first chunk comes at once
  s.on_event(tokens({'y'}, "y"));
  s.on_event(final_event(FinishReason::kEos, 2, 2));
  const std::string rest = c.response();
  EXPECT_THAT(rest, HasSubstr(R"("text":"y")"));
  EXPECT_THAT(rest, HasSubstr(R"("finish_reason":"stop")"));
  EXPECT_THAT(rest, HasSubstr("data: [DONE]\n\n"));

  c.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");  // still the same connection
  EXPECT_THAT(c.response(), HasSubstr(R"({"status":"ok"})"));
  EXPECT_EQ(metrics_.requests(FrontDoor::kHttp, Outcome::kOk), 2u);
  EXPECT_TRUE(eventually([&] { return server_->active_requests() == 0; }));
}

TEST_F(HttpServerTest, DisconnectMidStreamCancels) {
  auto c = std::make_unique<Client>(server_->port());
  c->post("/v1/completions", R"({"prompt": "hi", "stream": true, "max_tokens": 20})");
  FakeSink::Call call = sink_.take();
  call.on_event(tokens({'a'}, "a"));
  EXPECT_THAT(c->until("\n\n"), HasSubstr("data: "));
  EXPECT_FALSE(call.request.cancel->cancelled.load());
  c.reset();  // the client goes away while tokens are still coming
  EXPECT_TRUE(eventually([&] { return call.request.cancel->cancelled.load(); }))
      << "the request was not cancelled";
  call.on_event(final_event(FinishReason::kCancelled, 1, 1));
  EXPECT_TRUE(eventually([&] { return server_->active_requests() == 0; }));
  EXPECT_TRUE(eventually([&] { return metrics_.requests(FrontDoor::kHttp, Outcome::kCancelled) == 1; }));

  // The same while waiting for a whole response.
  auto w = std::make_unique<Client>(server_->port());
  w->post("/v1/completions", R"({"prompt": "hi"})");
  FakeSink::Call call2 = sink_.take();
  w.reset();
  EXPECT_TRUE(eventually([&] { return call2.request.cancel->cancelled.load(); }));
  call2.on_event(final_event(FinishReason::kCancelled, 1, 0));
  EXPECT_TRUE(eventually([&] { return server_->active_requests() == 0; }));
}

TEST_F(HttpServerTest, QueueFullDrainingAndHealth) {
  sink_.refuse(absl::ResourceExhaustedError("queue is full (1 requests waiting); retry later"));
  Client c(server_->port());
  c.post("/v1/completions", R"({"prompt": "hi"})");
  const std::string r = c.response();
  EXPECT_THAT(r, ::testing::StartsWith("HTTP/1.1 429 "));
  EXPECT_THAT(r, HasSubstr("Retry-After: 1\r\n"));
  EXPECT_THAT(body_of(r), HasSubstr(R"("type":"rate_limit_error")"));
  EXPECT_EQ(metrics_.requests(FrontDoor::kHttp, Outcome::kQueueFull), 1u);

  ready_ = false;
  c.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  const std::string loading = c.response();
  EXPECT_THAT(loading, ::testing::StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(loading, HasSubstr(R"({"status":"loading"})"));
  ready_ = true;

  server_->begin_drain();
  Client d(server_->port());
  d.post("/v1/completions", R"({"prompt": "hi"})");
  EXPECT_THAT(d.response(), ::testing::StartsWith("HTTP/1.1 503 "));
  Client h(server_->port());
  h.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_THAT(h.response(), HasSubstr(R"({"status":"draining"})"));
}

TEST_F(HttpServerTest, AtTheLimitTheLongestIdleConnectionMakesRoomOrANewOneIsClosed) {
  HttpServerOptions o;
  o.address = "127.0.0.1:0";
  o.max_connections = 2;
  absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::start(o, sink_, tokenizer_, info_);
  ASSERT_TRUE(s.ok()) << s.status();
  // Two idle keep-alive connections fill the server; a third client closes the older one.
  Client a((*s)->port());
  a.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_THAT(a.response(), HasSubstr("200 OK"));
  // a's wait for its next request starts when the server's write handler for a's answer has run,
  // which may be a while after a has read it (a sanitized build, a loaded machine): give it that
  // while before b's requests, so that b's wait surely starts later. Without the pause the
  // ThreadSanitizer build failed here once (2026-12-03: c evicted b, then b's answer was empty).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Client b((*s)->port());
  // Twice, for the same reason: b's wait starts after its own second answer is written.
  for (int i = 0; i < 2; ++i) {
    b.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_THAT(b.response(), HasSubstr("200 OK"));
  }
  EXPECT_TRUE(eventually([&] { return (*s)->connections() == 2; }));
  Client c((*s)->port());
  c.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_THAT(c.response(), HasSubstr("200 OK"));
  EXPECT_EQ(a.response(), "");  // closed for c
  b.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_THAT(b.response(), HasSubstr("200 OK"));
  EXPECT_TRUE(eventually([&] { return (*s)->connections() == 2; }));

  // Both busy (generating): a new connection is closed at once, nothing read.
  b.post("/v1/completions", R"({"prompt": "hi"})");
  c.post("/v1/completions", R"({"prompt": "hi"})");
  {
    FakeSink::Call first = sink_.take(), second = sink_.take();
    Client d((*s)->port());
    EXPECT_EQ(d.response(), "");
    EXPECT_EQ((*s)->connections(), 2);
    first.on_event(final_event(FinishReason::kLength, 1, 0));
    second.on_event(final_event(FinishReason::kLength, 1, 0));
  }  // the callbacks hold their connections' state
  EXPECT_THAT(b.response(), HasSubstr("200 OK"));
  EXPECT_THAT(c.response(), HasSubstr("200 OK"));
  // Idle again (once the server has written both answers): a new client is served, the longer
  // idle of the two making room.
  EXPECT_TRUE(eventually([&] {
    Client e((*s)->port());
    return e.try_send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n") &&
           e.response().find("200 OK") != std::string::npos;
  }));
}

// accept() failing with EMFILE leaves the connection queued, so the listener stays readable: the
// server must wait between tries (5 ms doubling to 100 ms), not retry in a loop, and accept the
// connection once a descriptor is free again.
TEST_F(HttpServerTest, AFailedAcceptIsRetriedWithBackoffNotInALoop) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 1024);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  // Fill the descriptor table, then free one slot for the client's socket: the server's accept
  // finds none.
  std::vector<int> fillers;
  for (int i = 0; i < 4096; ++i) {
    const int fd = ::open("/dev/null", O_RDONLY);
    if (fd < 0) break;
    fillers.push_back(fd);
  }
  ASSERT_GT(fillers.size(), 1u);
  ::close(fillers.back());
  fillers.pop_back();
  const int64_t failed_before = server_->failed_accepts();
  const auto t0 = std::chrono::steady_clock::now();
  {
    Client c(server_->port());
    ASSERT_TRUE(eventually([&] { return server_->failed_accepts() > failed_before; }));
    std::this_thread::sleep_for(300ms);
    const int64_t failed = server_->failed_accepts() - failed_before;
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t0).count();
    // Backoff: a handful of tries per 100 ms (waits of 5, 10, 20, 40, 80, 100, 100, ... ms);
    // a loop would make tens of thousands. The bound allows 2 tries per 100 ms waited.
    EXPECT_GE(failed, 1);
    EXPECT_LE(failed, 8 + static_cast<int64_t>(ms / 50)) << "over " << ms << " ms";
    EXPECT_EQ(server_->connections(), 0);
    // A descriptor comes free: the next try accepts the waiting connection.
    ::close(fillers.back());
    fillers.pop_back();
    c.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_THAT(c.response(), HasSubstr("200 OK"));
  }
  for (int fd : fillers) ::close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

TEST_F(HttpServerTest, FinalEventAfterTheServerIsGone) {
  Client c(server_->port());
  c.post("/v1/completions", R"({"prompt": "hi", "stream": true})");
  FakeSink::Call call = sink_.take();
  server_->shutdown(std::chrono::steady_clock::now() + 100ms);  // the request is still running
  server_.reset();
  call.on_event(tokens({'a'}, "a"));  // must not touch freed memory
  call.on_event(final_event(FinishReason::kCancelled, 1, 1));
}

}  // namespace
}  // namespace ltm
