// The coordinator's gRPC front end: serves ltm.v1.Generation (proto/ltm/v1/ltm.proto), the
// standard health service (grpc.health.v1.Health) and server reflection on one address.
//
// A call is validated (runtime/request_validation.h) and handed to the RequestSink; the sink's
// events are streamed back as they come (GenerateStream) or collected (Generate: the same path).
// Status mapping:
//   - bad request -> INVALID_ARGUMENT (message names the field); nothing reaches the sink;
//   - sink.submit() error -> the same code (ResourceExhausted -> RESOURCE_EXHAUSTED,
//     Unavailable -> UNAVAILABLE, ...), with its message;
//   - final event kError -> its status's code (the scheduler says Unavailable when the engine
//     or group is gone, Internal for a failure of this request; no text is parsed); kCancelled ->
//     its status when a shutdown cut it (Unavailable), else CANCELLED, or DEADLINE_EXCEEDED when
//     the call's deadline has passed;
//   - a request message over options.max_receive_message_bytes -> RESOURCE_EXHAUSTED (gRPC);
//   - a call without the API key (options.api_key set) -> UNAUTHENTICATED (every method of
//     ltm.v1.Generation; the health service answers without one).
//
// Bounded memory (docs/architecture.md, "Hardening"): the receive limit defaults to the largest
// valid request (prompt bytes or ids of a full context, the stop-string limits, slack), a
// request's raw bytes are checked field by field before the typed parse
// (runtime/serve/wire_precheck.h), a gRPC ResourceQuota caps the memory spent on calls in flight,
// and each connection may have at most max_concurrent_streams calls at once.
// A client that cancels, disconnects or runs out of deadline has its call ended at once and the
// request's CancelFlag set, so the engine frees it within a step; the call's deadline is also
// copied into GenerationRequest::deadline.
//
// Threading: uses gRPC's callback API, so a call holds no thread while it waits for tokens (any
// number of concurrent streams). Events from the sink are written without blocking the sink's
// thread. Validation and tokenization run on gRPC's threads.
//
// Ownership: the sink and the tokenizer must outlive the GrpcServer. A call whose final event has
// not arrived when the server is destroyed keeps its own state alive until it does (the sink
// guarantees exactly one final event), so the sink may answer after the server is gone.
//
// Lifecycle: start() -> serving (health SERVING) -> begin_drain() (new Generate/GenerateStream
// calls get UNAVAILABLE "server is draining", health NOT_SERVING; running calls go on; Tokenize
// and GetModelInfo still answer) -> shutdown(deadline) (stops listening, waits for running calls
// until the deadline, then cancels them) -> destroyed. The destructor shuts down with a zero
// deadline if shutdown() was not called. Methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/sched/engine_info.h"
#include "runtime/sched/metrics.h"
#include "runtime/sched/request.h"
#include "runtime/serve/chat_format.h"
#include "runtime/text/tokenizer.h"

namespace grpc {
class Server;
}

namespace ltm {

namespace grpc_server_internal {
struct State;   // shared with the calls; outlives the server while calls wait for the engine
class Service;  // the ltm.v1.Generation implementation
}  // namespace grpc_server_internal

struct GrpcServerOptions {
  // host:port; port 0 picks a free port (read it back with GrpcServer::port()). Loopback unless
  // told otherwise: binding every interface (0.0.0.0, [::]) is the caller's explicit choice.
  std::string address = "127.0.0.1:50051";
  // Larger requests get RESOURCE_EXHAUSTED. 0: max_request_bytes(), the largest valid request.
  int64_t max_receive_message_bytes = 0;
  int max_send_message_bytes = 64 << 20;
  int max_concurrent_streams = 256;           // per connection (HTTP/2 SETTINGS)
  int64_t request_memory_bytes = 256 << 20;   // gRPC ResourceQuota of the server
  // TLS: PEM files. Both cert and key, or neither (plaintext). client_ca: mutual TLS, every
  // client must present a certificate signed by it.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  std::string api_key;                        // non-empty: "authorization: Bearer <key>" required
  bool reflection = false;                    // serve grpc.reflection (no API key check)
  // Counts every Generate/GenerateStream call by outcome when set (runtime/sched/metrics.h);
  // must outlive the server.
  ServeMetrics* metrics = nullptr;
  // The model's chat template and end tokens (runtime/serve/chat_format.h) for Chat and
  // ChatStream; null: those calls get FAILED_PRECONDITION.
  std::shared_ptr<const ChatFormat> chat;
};

// The largest valid GenerateRequest in bytes for a model with this context and a tokenizer
// whose longest token has `max_token_bytes` bytes: a prompt of context_length - 1 tokens (as text
// or ids), 16 stop strings of 1024 bytes, a request id and every scalar, plus 4 KiB of slack.
int64_t max_request_bytes(int64_t context_length, int64_t max_token_bytes);

class GrpcServer {
 public:
  // Builds and starts the server. Unavailable when the address cannot be bound. `info` is copied.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> start(const GrpcServerOptions& options,
                                                           RequestSink& sink,
                                                           const Tokenizer& tokenizer,
                                                           EngineInfo info);
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const { return port_; }        // the bound port
  const std::string& address() const { return address_; }  // host:port actually bound

  // New generation calls get UNAVAILABLE from now on; health reports NOT_SERVING. Idempotent.
  void begin_drain();
  bool draining() const;
  // Drains, stops accepting calls, waits for running calls until `deadline`, then cancels the
  // rest and returns once every call has ended. Idempotent (later calls return at once).
  void shutdown(std::chrono::system_clock::time_point deadline);
  // Blocks until shutdown() has finished (e.g. a main thread waiting while a signal handler
  // thread calls shutdown).
  void wait();

  // Calls currently running (Generate + GenerateStream), for tests and logs.
  int64_t active_calls() const;

 private:
  GrpcServer() = default;

  std::shared_ptr<grpc_server_internal::State> state_;
  std::unique_ptr<grpc_server_internal::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

}  // namespace ltm
