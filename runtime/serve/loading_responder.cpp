#include "runtime/serve/loading_responder.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/serve/http_server.h"

namespace ltm {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kMaxHead = 16 * 1024;                   // request line + headers read, at most
constexpr auto kClientTimeout = std::chrono::seconds(2);  // for the whole exchange

std::string response(bool health) {
  const std::string body =
      health ? std::string(R"({"status":"loading"})")
             : std::string(R"({"error":{"message":"the model is loading; retry shortly",)"
                           R"("type":"service_unavailable","param":null,"code":"loading"}})");
  return absl::StrCat("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                      "Retry-After: 1\r\nConnection: close\r\nContent-Length: ",
                      body.size(), "\r\n\r\n", body);
}

// One connection: read its head (bounded, timed), answer, close.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  explicit Exchange(tcp::socket socket)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), buf_(kMaxHead) {}

  void run() {
    auto self = shared_from_this();
    timer_.expires_after(kClientTimeout);
    timer_.async_wait([self](boost::system::error_code ec) {
      if (!ec) self->socket_.close();
    });
    net::async_read_until(socket_, buf_, "\r\n\r\n", [self](boost::system::error_code ec, size_t) {
      // A head too large or cut short still gets the answer (it says the same either way).
      (void)ec;
      const char* data = static_cast<const char*>(self->buf_.data().data());
      const std::string_view head(data, self->buf_.size());
      const bool health = head.starts_with("GET /health ") || head.starts_with("HEAD /health ");
      self->reply_ = response(health);
      net::async_write(self->socket_, net::buffer(self->reply_),
                       [self](boost::system::error_code, size_t) {
                         boost::system::error_code ignored;
                         self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
                         self->socket_.close(ignored);
                         self->timer_.cancel();
                       });
    });
  }

 private:
  tcp::socket socket_;
  net::steady_timer timer_;
  net::streambuf buf_;
  std::string reply_;
};

}  // namespace

struct LoadingResponder::State {
  net::io_context ioc{1};
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> retry;
  std::chrono::milliseconds backoff{0};
  std::thread thread;

  void accept() {
    acceptor->async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
      if (ec) {
        // EMFILE and the like leave the connection queued: retrying at once would spin
        // (the same backoff as the HttpServer's, http_server.cpp).
        backoff = backoff.count() == 0 ? std::chrono::milliseconds(5)
                                       : std::min(backoff * 2, std::chrono::milliseconds(100));
        retry->expires_after(backoff);
        retry->async_wait([this](boost::system::error_code wait_ec) {
          if (!wait_ec && acceptor->is_open()) accept();
        });
        return;
      }
      backoff = std::chrono::milliseconds(0);
      ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);  // as the acceptor's
      std::make_shared<Exchange>(std::move(socket))->run();
      accept();
    });
  }
};

LoadingResponder::LoadingResponder(std::unique_ptr<State> state) : state_(std::move(state)) {}

LoadingResponder::~LoadingResponder() {
  net::post(state_->ioc, [s = state_.get()] {
    boost::system::error_code ignored;
    s->acceptor->close(ignored);
    s->retry->cancel();
  });
  state_->ioc.stop();
  if (state_->thread.joinable()) state_->thread.join();
  // The acceptor (and every socket) closes here, before the real server binds the address.
}

absl::StatusOr<std::unique_ptr<LoadingResponder>> LoadingResponder::start(
    const std::string& address) {
  absl::StatusOr<HttpAddress> parsed = parse_http_address(address);
  if (!parsed.ok()) return parsed.status();
  auto state = std::make_unique<State>();
  boost::system::error_code ec;
  const tcp::endpoint endpoint(net::ip::make_address(parsed->ip),
                               static_cast<unsigned short>(parsed->port));
  state->acceptor.emplace(state->ioc);
  state->retry.emplace(state->ioc);
  state->acceptor->open(endpoint.protocol(), ec);
  // Close-on-exec: MPI_Init, which comes later, starts helper processes (a singleton's orted)
  // that would otherwise inherit the socket and keep the port bound after we close it.
  if (!ec && ::fcntl(state->acceptor->native_handle(), F_SETFD, FD_CLOEXEC) != 0)
    ec = boost::system::error_code(errno, boost::system::system_category());
  if (!ec) state->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) state->acceptor->bind(endpoint, ec);
  if (!ec) state->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (HTTP): ", ec.message()));
  state->accept();
  State* s = state.get();
  state->thread = std::thread([s] { s->ioc.run(); });
  return std::unique_ptr<LoadingResponder>(new LoadingResponder(std::move(state)));
}

}  // namespace ltm
