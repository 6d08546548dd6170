#include "runtime/serve/http_server.h"


#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/serve/front_door.h"
#include "runtime/serve/grpc_server.h"  // max_request_bytes
#include "runtime/serve/http_session.h"
#include "spdlog/spdlog.h"

namespace ltm {

namespace beast = boost::beast;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace http_server_internal {

namespace {

// A failed accept (EMFILE, ENFILE: no descriptor; ENOBUFS, ENOMEM: no kernel memory) leaves the
// connection in the listen backlog, so the listener stays readable and an accept retried at once
// fails again at once: a thread spinning at 100% for as long as the shortage lasts. Instead the
// next try waits, 5 ms at first, doubling to 100 ms, back to none after an accept succeeds; one
// warning starts a burst of failures and one line ends it.
constexpr std::chrono::milliseconds kFirstAcceptBackoff{5};
constexpr std::chrono::milliseconds kMaxAcceptBackoff{100};

void do_accept(const std::shared_ptr<State>& state);

void on_accept_failed(const std::shared_ptr<State>& state, const beast::error_code& ec) {
  state->failed_accepts.fetch_add(1);
  if (state->burst_failures++ == 0)
    spdlog::warn("http: accept on {} failed: {} ({} connections open); retrying every {} to {} ms "
                 "until it succeeds", state->port, ec.message(), state->connections.load(),
                 kFirstAcceptBackoff.count(), kMaxAcceptBackoff.count());
  state->accept_backoff = state->accept_backoff.count() == 0
                              ? kFirstAcceptBackoff
                              : std::min(state->accept_backoff * 2, kMaxAcceptBackoff);
  state->accept_timer->expires_after(state->accept_backoff);
  state->accept_timer->async_wait([state](beast::error_code wait_ec) {
    if (wait_ec || !state->acceptor->is_open()) return;  // cancelled: shutting down
    do_accept(state);
  });
}

void do_accept(const std::shared_ptr<State>& state) {
  state->acceptor->async_accept(
      net::make_strand(state->ioc), [state](beast::error_code ec, tcp::socket socket) {
        // On accept_strand (the acceptor's executor).
        if (ec == net::error::operation_aborted || !state->acceptor->is_open()) return;
        if (ec) return on_accept_failed(state, ec);
        if (state->burst_failures > 0) {
          spdlog::info("http: accepting connections again after {} failed accepts",
                       state->burst_failures);
          state->burst_failures = 0;
        }
        state->accept_backoff = std::chrono::milliseconds(0);
        const int64_t max = state->options.max_connections;
        if (state->connections.load() - state->evicting.load() >= max &&
            !evict_idle_session(*state)) {
          beast::error_code ignored;
          socket.close(ignored);  // every connection is busy: refuse at once, keep no state
        } else {
          start_session(state, std::move(socket));
        }
        do_accept(state);
      });
}

}  // namespace
}  // namespace http_server_internal

using http_server_internal::State;

absl::StatusOr<HttpAddress> parse_http_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("--http ", address, ": not HOST:PORT"));
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  net::ip::make_address(host, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("--http ", address, ": ", host, " is not an IP address"));
  return HttpAddress{host, port};
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options,
                                                              RequestSink& sink,
                                                              const Tokenizer& tokenizer,
                                                              EngineInfo info) {
  if (info.max_context() <= 0 || info.model.vocab_size <= 0)
    return absl::InvalidArgumentError(
        "engine info must give the model's vocab_size and context length (n_positions)");
  if (options.threads < 1 || options.threads > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("the HTTP server needs 1 to 64 threads, got ", options.threads));
  if (options.max_connections < 1)
    return absl::InvalidArgumentError("max_connections must be >= 1");
  if (!(options.idle_timeout_s > 0))
    return absl::InvalidArgumentError("the HTTP idle timeout must be > 0 seconds");
  absl::StatusOr<HttpAddress> parsed = parse_http_address(options.address);
  if (!parsed.ok()) return parsed.status();
  const size_t colon = options.address.rfind(':');
  const int port = parsed->port;
  boost::system::error_code ec;
  const net::ip::address ip = net::ip::make_address(parsed->ip, ec);

  auto state = std::make_shared<State>();
  state->options = options;
  state->sink = &sink;
  state->tokenizer = &tokenizer;
  const FrontDoorLimits door = front_door_limits(info, tokenizer);
  state->ctx.tokenizer = &tokenizer;
  state->ctx.limits = door.limits;
  state->ctx.model_name = info.model_name;
  state->ctx.chat = options.chat.get();
  state->info = std::move(info);
  state->created = static_cast<int64_t>(std::time(nullptr));
  // The largest valid request as JSON: every prompt byte escaped (\u00XX), or every id with its
  // comma, the stop strings escaped, and slack for the other fields.
  int64_t max_body = options.max_body_bytes;
  if (max_body == 0) {
    const int64_t prompt = std::max(door.limits.max_prompt_bytes * 6, door.max_prompt_tokens * 12);
    max_body = std::max<int64_t>(prompt + kMaxStopStrings * int64_t{kMaxStopBytes} * 6 + 65536,
                                 int64_t{1} << 20);
    max_body = std::min<int64_t>(max_body, int64_t{256} << 20);
  }
  if (max_body < 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("the HTTP body limit must be at least 1024 bytes, got ", max_body));
  state->max_body_bytes = max_body;

  tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
  state->acceptor.emplace(state->accept_strand);
  state->accept_timer.emplace(state->accept_strand);
  state->acceptor->open(endpoint.protocol(), ec);
  if (!ec) state->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) state->acceptor->bind(endpoint, ec);
  if (!ec) state->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.address, " (HTTP): ", ec.message()));
  state->port = state->acceptor->local_endpoint().port();

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->state_ = state;
  server->address_ = absl::StrCat(options.address.substr(0, colon), ":", state->port);
  state->work.emplace(state->ioc.get_executor());
  net::dispatch(state->accept_strand, [state] { http_server_internal::do_accept(state); });
  for (int i = 0; i < options.threads; ++i) {
    state->threads.emplace_back([raw = state.get()] {
      for (;;) {
        try {
          raw->ioc.run();
          return;
        } catch (const std::exception& e) {
          spdlog::error("http: a connection failed: {}", e.what());
        }
      }
    });
  }
  spdlog::info("serving the OpenAI API (HTTP) on {} ({} threads; bodies up to {} bytes)",
               server->address_, options.threads, max_body);
  return server;
}

HttpServer::~HttpServer() {
  if (state_) shutdown(std::chrono::steady_clock::now());
}

int HttpServer::port() const { return state_->port; }

void HttpServer::begin_drain() { state_->draining.store(true); }
bool HttpServer::draining() const { return state_->draining.load(); }
int64_t HttpServer::active_requests() const { return state_->active.load(); }
int64_t HttpServer::connections() const { return state_->connections.load(); }
int64_t HttpServer::failed_accepts() const { return state_->failed_accepts.load(); }

void HttpServer::shutdown(std::chrono::steady_clock::time_point deadline) {
  if (state_->shut_down.exchange(true)) return;
  begin_drain();
  const auto close_sessions = [this](bool force) {
    http_server_internal::close_sessions(*state_, force);
  };
  net::post(state_->accept_strand, [state = state_] {
    beast::error_code ec;
    state->acceptor->close(ec);
    state->accept_timer->cancel();
  });
  close_sessions(false);
  while (state_->active.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  close_sessions(true);
  state_->work.reset();
  // Let the closes run; then stop whatever is left (a client that will not read).
  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (state_->connections.load() > 0 && std::chrono::steady_clock::now() < stop_at)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  state_->ioc.stop();
  for (std::thread& t : state_->threads) t.join();
  state_->threads.clear();
  spdlog::info("HTTP server on {} stopped", address_);
}

}  // namespace ltm
