// Internal to the gRPC server (runtime/serve/grpc_server.cpp, grpc_calls.cpp): the state the
// service and its calls share, the helpers both use, and the two generation calls the service
// hands out (grpc_calls.cpp: turning a request into the engine's, folding its events into
// responses, cancellation and the final status).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "runtime/serve/auth.h"
#include "runtime/serve/chat_format.h"
#include "runtime/sched/engine_info.h"
#include "runtime/sched/metrics.h"
#include "runtime/sched/request.h"
#include "runtime/serve/request_validation.h"
#include "runtime/serve/wire_precheck.h"
#include "runtime/text/tokenizer.h"

namespace ltm::grpc_server_internal {

// Shared state: owned jointly by the server and the calls, so a call that outlives the server
// (waiting for its final event) still has somewhere to report.
struct State {
  RequestSink* sink = nullptr;             // valid while the server lives
  const Tokenizer* tokenizer = nullptr;    // likewise
  EngineInfo info;
  RequestLimits limits;
  PrecheckLimits generate_wire;            // raw-byte limits of GenerateRequest
  PrecheckLimits tokenize_wire;            // and of TokenizeRequest
  PrecheckLimits chat_wire;                // and of ChatRequest
  std::shared_ptr<const ChatFormat> chat;  // the chat template; null: Chat calls are refused
  std::string api_key;                     // empty: no key needed
  ServeMetrics* metrics = nullptr;         // requests by outcome, when set
  std::string id_prefix;                   // random, so ids differ across restarts
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};

  std::mutex mu;
  grpc::Server* server = nullptr;          // for the health service; null after shutdown
  bool shutdown_started = false;
  bool shutdown_done = false;
  std::condition_variable shutdown_cv;

  // OK when the call may go on: no key is configured, or it carries the right one.
  absl::Status authorize(const grpc::CallbackServerContext* ctx) const {
    if (api_key.empty()) return absl::OkStatus();
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it == md.end()) return check_bearer(nullptr, api_key);
    const std::string_view value(it->second.data(), it->second.size());
    return check_bearer(&value, api_key);
  }

  std::string make_request_id() {
    return absl::StrCat(id_prefix, "-", next_id.fetch_add(1, std::memory_order_relaxed));
  }
};

// absl and gRPC status codes share their numbering (google.rpc.Code).
grpc::Status to_grpc(const absl::Status& s);
// Parses a request message. Its raw bytes are checked first (runtime/serve/wire_precheck.h):
// repeated fields and string lengths against `limits`, and every string field for UTF-8, without
// allocating per field, so a message of a million tiny `stop` entries costs nothing before it is
// refused. The UTF-8 check also spares the typed parse, which would refuse such a string only after
// libprotobuf logs an ERROR line per request (a log any client could flood), and names the field:
// INVALID_ARGUMENT "prompt is not valid UTF-8".
absl::Status parse_message(const grpc::ByteBuffer& buffer, google::protobuf::Message& message,
                           const PrecheckLimits& limits);
grpc::ByteBuffer serialize(const google::protobuf::Message& message);

// The Generate (unary) and GenerateStream calls, or with `chat` Chat and ChatStream (a
// ChatRequest, rendered by the chat template into the prompt): each deletes itself when gRPC is
// done with it.
grpc::ServerUnaryReactor* start_unary_generation(std::shared_ptr<State> state,
                                                 grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer& request,
                                                 grpc::ByteBuffer* response, bool chat = false);
grpc::ServerWriteReactor<grpc::ByteBuffer>* start_stream_generation(
    std::shared_ptr<State> state, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& request,
    bool chat = false);

}  // namespace ltm::grpc_server_internal
