// The coordinator's HTTP front door (rank 0, beside gRPC): the OpenAI completions API, model
// list, health and Prometheus metrics, with Boost.Beast over one asio io_context.
//
//   POST /v1/completions   OpenAI completions (runtime/serve/openai_api.h); "stream": true sends
//                          server-sent events, one "data: {json}" per chunk, then "data: [DONE]"
//   POST /v1/chat/completions  OpenAI chat completions: the messages rendered by the model's chat
//                          template (runtime/serve/chat_format.h), streamed as delta chunks
//   GET  /v1/models        the served model ({"object": "list", "data": [...]}), with its dtypes
//   GET  /v1/models/{id}   that model, or 404
//   GET  /health           200 {"status": "ok"} once ready() (every rank up, a step has run);
//                          503 {"status": "loading" | "draining"} otherwise
//   GET  /metrics          ServeMetrics::render() (text/plain; version=0.0.4)
//
// Requests go to the same RequestSink (the scheduler) as gRPC's, validated by the same code
// (make_generation_request, via the OpenAI field mapping). Errors are OpenAI error objects:
// 400 for a bad body (JSON, types, ranges, unknown model; error.param names the field), 401 for a
// missing or wrong API key (Authorization: Bearer, as gRPC's; /health needs none), 404/405 for
// other paths and methods, 413 for a body over max_body_bytes, 429 with Retry-After when the
// queue is full, 503 while draining or when the engine failed, 500 for a failed request.
//
// Connections: HTTP/1.1 keep-alive; a fixed pool of `threads` threads runs every connection (no
// thread per connection); each connection is a strand. Memory per client is bounded: headers up
// to 16 KiB, a body up to max_body_bytes, one request at a time per connection, at most
// max_connections connections (when full, a new connection closes the one that has waited
// longest for a request; if every one is busy, the new one is closed at once). A failed accept
// (no descriptor, no kernel memory) is retried after 5 ms doubling to 100 ms, never in a loop
// (http_server.cpp). A client that is silent for
// idle_timeout_s between requests, or takes longer than that to send one, is disconnected. While
// a request is generating, the connection is watched: a client that disconnects (mid-stream or
// while waiting for a whole response) has its request cancelled, so the scheduler frees its KV
// blocks at its next step.
//
// Lifecycle: start() -> serving -> begin_drain() (new completions get 503, /health 503; running
// ones go on) -> shutdown(deadline) (stops accepting, closes idle connections, waits for running
// requests until the deadline, then closes the rest) -> destroyed. Thread-safe.
// Ownership: the sink, tokenizer and metrics must outlive the server. A request whose final event
// has not come when the server is destroyed keeps its connection state alive until it comes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/sched/engine_info.h"
#include "runtime/sched/metrics.h"
#include "runtime/sched/request.h"
#include "runtime/text/tokenizer.h"

namespace ltm {

class ChatFormat;

namespace http_server_internal {
struct State;
}

struct HttpServerOptions {
  // host:port; port 0 picks a free one (HttpServer::port()). Loopback unless told otherwise.
  std::string address = "127.0.0.1:8000";
  int threads = 2;                  // the io_context's threads
  int64_t max_body_bytes = 0;       // 0: enough for the largest valid request as JSON
  int max_connections = 1024;
  double idle_timeout_s = 60;
  int retry_after_s = 1;            // the Retry-After of a 429
  std::string api_key;              // non-empty: "Authorization: Bearer <key>" on /v1/* and /metrics
  ServeMetrics* metrics = nullptr;  // counts requests; /metrics renders it (404 when null)
  // /health is 200 only when this says so (and the server is not draining); null: always ready.
  std::function<bool()> ready;
  // The LoRA adapters a request's "model" may name, besides the base model (GET /v1/models lists
  // them); null: none.
  std::function<std::vector<std::string>()> adapters;
  // The model's chat template and end tokens (runtime/serve/chat_format.h); null: none, and
  // POST /v1/chat/completions answers 400 saying so.
  std::shared_ptr<const ChatFormat> chat;
};

// --http's HOST:PORT as an IP address (localhost: 127.0.0.1; [v6] without brackets) and a port.
struct HttpAddress {
  std::string ip;
  int port = 0;
};
absl::StatusOr<HttpAddress> parse_http_address(const std::string& address);

class HttpServer {
 public:
  // Binds and starts the threads. Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options,
                                                           RequestSink& sink,
                                                           const Tokenizer& tokenizer,
                                                           EngineInfo info);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  const std::string& address() const { return address_; }

  void begin_drain();
  bool draining() const;
  void shutdown(std::chrono::steady_clock::time_point deadline);

  int64_t active_requests() const;  // completions generating or being answered
  int64_t connections() const;      // open connections
  int64_t failed_accepts() const;   // accept() calls that failed (EMFILE, ...), ever

 private:
  HttpServer() = default;
  std::shared_ptr<http_server_internal::State> state_;
  std::string address_;
};

}  // namespace ltm
