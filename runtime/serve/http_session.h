// Internal to the HTTP server (runtime/serve/http_server.cpp, http_session.cpp): the state the
// listener and its connections share, and the two things the listener asks of a connection.
// One connection (http_session.cpp) reads requests, runs completions through the RequestSink and
// writes responses or server-sent events, all on its strand.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

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
#include "runtime/serve/metrics.h"
#include "runtime/serve/openai_api.h"

namespace ltm::http_server_internal {

namespace net = boost::asio;
using tcp = net::ip::tcp;

class Session;

struct State {
  net::io_context ioc;  // first member: destroyed last
  std::optional<tcp::acceptor> acceptor;
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

}  // namespace ltm::http_server_internal
