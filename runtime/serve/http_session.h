// Internal to the HTTP server (runtime/serve/http_server.cpp, http_session.cpp): the state the
// listener and its connections share, and the two things the listener asks of a connection.
// One connection (http_session.cpp) reads requests, runs completions through the RequestSink and
// writes responses or server-sent events, all on its strand.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/serve/front_door.h"
#include "runtime/serve/http_server.h"
#include "runtime/sched/metrics.h"
#include "runtime/serve/openai_api.h"

namespace ltm::http_server_internal {

namespace net = boost::asio;
using tcp = net::ip::tcp;

class Session;

struct State {
  net::io_context ioc;  // first member: destroyed last
  // The accept loop (http_server.cpp) runs on this strand: the acceptor, the timer that spaces
  // out retries after a failed accept, and the fields below it.
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_timer;
  std::chrono::milliseconds accept_backoff{0};  // 0: the last accept succeeded
  int64_t burst_failures = 0;                   // failed accepts since the last success
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;

  HttpServerOptions options;
  RequestSink* sink = nullptr;
  const Tokenizer* tokenizer = nullptr;
  EngineInfo info;
  CompletionContext ctx;
  int64_t max_body_bytes = 0;
  int64_t created = 0;  // the model's "created" (server start, Unix seconds)
  RequestIds ids{"cmpl"};
  int port = 0;

  std::atomic<bool> draining{false};
  std::atomic<bool> shut_down{false};
  std::atomic<int64_t> active{0};
  std::atomic<int64_t> connections{0};
  std::atomic<int64_t> failed_accepts{0};  // ever (HttpServer::failed_accepts)
  std::atomic<int64_t> evicting{0};        // idle connections closed for new ones, not yet gone

  std::mutex mu;  // guards sessions
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;

  std::chrono::steady_clock::duration idle() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options.idle_timeout_s));
  }
  void count(Outcome o) {
    if (options.metrics) options.metrics->count_request(FrontDoor::kHttp, o);
  }
};

// Starts serving one accepted connection (it registers itself in state->sessions).
void start_session(const std::shared_ptr<State>& state, tcp::socket socket);

// Closes every open connection: force = false lets a running generation finish first.
void close_sessions(State& state, bool force);

// At the connection cap: closes the connection that has waited longest for its next request (or
// for the rest of one), so that a new client is served instead of refused; nginx does the same
// with idle keep-alive connections. False when every connection is busy, or when kMaxEvicting
// closes are already under way (so open connections stay under the cap + kMaxEvicting).
inline constexpr int64_t kMaxEvicting = 16;
bool evict_idle_session(State& state);

}  // namespace ltm::http_server_internal
