#include "runtime/serve/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/logging.h"
#include "google/protobuf/unknown_field_set.h"
#include "ltm/v1/ltm.grpc.pb.h"
#include "runtime/serve/auth.h"
#include "runtime/serve/front_door.h"
#include "runtime/serve/request_validation.h"
#include "runtime/serve/wire_precheck.h"
#include "spdlog/spdlog.h"

namespace ltm {

using Clock = std::chrono::steady_clock;

namespace {

// absl and gRPC status codes share their numbering (google.rpc.Code).
grpc::Status to_grpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

v1::FinishReason to_proto(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop: return v1::FINISH_REASON_STOP;
    case FinishReason::kEos: return v1::FINISH_REASON_EOS;
    case FinishReason::kCancelled: return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// The call's deadline on the engine's clock (max when the call has none).
Clock::time_point steady_deadline(std::chrono::system_clock::time_point deadline) {
  const auto remaining = deadline - std::chrono::system_clock::now();
  if (remaining > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(remaining);
}

// Parses a request message. Its raw bytes are checked first (runtime/serve/wire_precheck.h):
// repeated fields and string lengths against `limits`, and every string field for UTF-8, without
// allocating per field, so a message of a million tiny `stop` entries costs nothing before it is
// refused. The UTF-8 check also spares the typed parse, which would refuse such a string only after
// libprotobuf logs an ERROR line per request (a log any client could flood), and names the field:
// INVALID_ARGUMENT "prompt is not valid UTF-8".
absl::Status parse_message(const grpc::ByteBuffer& buffer, google::protobuf::Message& message,
                           const PrecheckLimits& limits) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError("the request is unreadable");
  std::string bytes;
  bytes.reserve(buffer.Length());  // bounded by the server's max receive message size
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  slices.clear();

  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  LTM_RETURN_IF_ERROR(precheck_message(bytes, *descriptor, limits));
  if (message.ParseFromString(bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", descriptor->full_name(), " message"));
}

// Linking grpc++_reflection registers its plugin with every ServerBuilder of the process (a static
// initializer); this option takes it off a builder again, so reflection is served only on request.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

grpc::ByteBuffer serialize(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

void to_proto(const AdapterStatus& a, v1::AdapterInfo* out) {
  out->set_name(a.name);
  out->set_loaded(a.loaded);
  out->set_merged(a.merged);
  out->set_rank(a.rank);
  out->set_alpha(a.alpha);
  for (const std::string& m : a.target_modules) out->add_target_modules(m);
  out->set_active_requests(a.active_requests);
  out->set_unloading(a.unloading);
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

namespace grpc_server_internal {

// Shared state: owned jointly by the server and the calls, so a call that outlives the server
// (waiting for its final event) still has somewhere to report.
struct State {
  RequestSink* sink = nullptr;             // valid while the server lives
  const Tokenizer* tokenizer = nullptr;    // likewise
  EngineInfo info;
  RequestLimits limits;
  PrecheckLimits generate_wire;            // raw-byte limits of GenerateRequest
  PrecheckLimits tokenize_wire;            // and of TokenizeRequest
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

// What both generation calls (unary and stream) share: turning the request into the engine's,
// folding events into responses, and the final status.
class GenerationCallCore {
 public:
  GenerationCallCore(std::shared_ptr<State> state, grpc::CallbackServerContext* ctx)
      : state_(std::move(state)), ctx_(ctx), arrival_(Clock::now()) {
    state_->active.fetch_add(1);
  }

  // Parses and validates; on success `request` is ready for the sink.
  absl::Status prepare(const grpc::ByteBuffer& buffer, GenerationRequest& request) {
    LTM_RETURN_IF_ERROR(state_->authorize(ctx_));
    if (state_->draining.load()) return absl::UnavailableError("server is draining");
    v1::GenerateRequest proto;
    LTM_RETURN_IF_ERROR(parse_message(buffer, proto, state_->generate_wire));
    LTM_ASSIGN_OR_RETURN(request,
                         make_generation_request(proto, *state_->tokenizer, state_->limits));
    if (request.request_id.empty()) request.request_id = state_->make_request_id();
    request.deadline = steady_deadline(ctx_->deadline());
    cancel_ = request.cancel;
    request_id_ = request.request_id;
    n_prompt_ = static_cast<int32_t>(request.prompt_ids.size());
    deadline_ = ctx_->deadline();
    return absl::OkStatus();
  }

  // Appends an event's tokens and text to `out`; on the final event also fills finish_reason,
  // usage and timings. Returns the status the call ends with when `event.finished`.
  grpc::Status fold(GenerationEvent& event, v1::GenerateResponse& out) {
    const Clock::time_point now = Clock::now();
    if (!event.token_ids.empty()) {
      if (n_generated_ == 0) first_token_ = now;
      n_generated_ += static_cast<int32_t>(event.token_ids.size());
      out.mutable_token_ids()->Add(event.token_ids.begin(), event.token_ids.end());
      out.mutable_logprobs()->Add(event.logprobs.begin(), event.logprobs.end());
    }
    out.mutable_text()->append(event.text);
    out.set_request_id(request_id_);
    if (!event.finished) return grpc::Status::OK;

    out.set_finish_reason(to_proto(event.finish_reason));
    out.mutable_usage()->set_prompt_tokens(event.prompt_tokens > 0 ? event.prompt_tokens
                                                                   : n_prompt_);
    out.mutable_usage()->set_completion_tokens(
        event.completion_tokens > 0 ? event.completion_tokens : n_generated_);
    out.mutable_timings()->set_time_to_first_token_ms(
        n_generated_ > 0 ? ms_between(arrival_, first_token_) : 0.0);
    out.mutable_timings()->set_total_ms(ms_between(arrival_, now));
    switch (event.finish_reason) {
      case FinishReason::kError: {
        // The error's kind is its code (Unavailable: the group is gone; Internal: this request).
        const absl::Status s = event.status.ok() ? absl::InternalError("the engine failed")
                                                 : event.status;
        LogRequestScope scope(request_id_);
        spdlog::warn("{}", s.ToString());
        return to_grpc(s);
      }
      case FinishReason::kCancelled:
        // Cut by a shutdown (--drain-timeout passed): the server is going away, retry elsewhere.
        if (!event.status.ok()) return to_grpc(event.status);
        // Otherwise the engine ends a request by itself only at its deadline (the client's cancellation
        // ends the call before the final event comes). Its clock may be a little ahead of ours.
        if (std::chrono::system_clock::now() + std::chrono::milliseconds(50) >= deadline_)
          return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
        return grpc::Status(grpc::StatusCode::CANCELLED, "the request was cancelled");
      default:
        return grpc::Status::OK;
    }
  }

  void set_cancelled() {
    if (cancel_) cancel_->cancelled.store(true);
  }
  void call_done() { state_->active.fetch_sub(1); }
  // Counts the call's outcome (once per call: just before its one Finish).
  void record(const grpc::Status& status) {
    if (state_->metrics)
      state_->metrics->count_request(
          FrontDoor::kGrpc, outcome_of(static_cast<absl::StatusCode>(status.error_code())));
  }
  RequestSink& sink() { return *state_->sink; }

 private:
  std::shared_ptr<State> state_;
  grpc::CallbackServerContext* ctx_;  // valid until OnDone
  Clock::time_point arrival_;
  Clock::time_point first_token_;
  std::chrono::system_clock::time_point deadline_ = std::chrono::system_clock::time_point::max();
  std::shared_ptr<CancelFlag> cancel_;
  std::string request_id_;
  int32_t n_prompt_ = 0;
  int32_t n_generated_ = 0;
};

// Life of a generation call object: gRPC holds one reference until OnDone, the sink one until
// its final event (taken only when submit() succeeds). The last to let go deletes it.
//
// No lock is held while calling into gRPC (StartWrite, Finish), so a reaction that gRPC runs
// inline cannot deadlock.

// GenerateStream: events are coalesced into `pending_` while a write is in flight, so a slow
// client gets fewer, larger messages and never blocks the engine.
class StreamCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  StreamCall(std::shared_ptr<State> state, grpc::CallbackServerContext* ctx,
             const grpc::ByteBuffer& request)
      : core_(std::move(state), ctx) {
    GenerationRequest engine_request;
    if (absl::Status s = core_.prepare(request, engine_request); !s.ok()) {
      finish_now(to_grpc(s));
      return;
    }
    refs_.store(2);
    absl::Status s = core_.sink().submit(std::move(engine_request),
                                         [this](GenerationEvent e) { on_event(std::move(e)); });
    if (!s.ok()) {
      refs_.fetch_sub(1);  // no event will come: the sink holds no reference
      finish_now(to_grpc(s));
    }
  }

  void OnWriteDone(bool ok) override {
    Action action;
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      if (!ok && !finished_) {  // the stream broke (client gone): stop the engine, end the call
        core_.set_cancelled();
        finished_ = true;
        action.finish = true;
        action.status = grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke");
      } else {
        action = next_action_locked();
      }
    }
    perform(action);
  }

  void OnCancel() override {
    core_.set_cancelled();
    Action action;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (!finished_ && !write_in_flight_) {  // else OnWriteDone(false) ends the call
        finished_ = true;
        action.finish = true;
        action.status = grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
      }
    }
    perform(action);
  }

  void OnDone() override {
    core_.call_done();
    unref();
  }

 private:
  struct Action {
    bool write = false;
    bool finish = false;
    grpc::Status status;
  };

  void finish_now(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    core_.record(status);
    Finish(status);
  }

  // Called by the sink, from its step thread.
  void on_event(GenerationEvent event) {
    const bool last = event.finished;
    Action action;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!finished_) {
        grpc::Status status = core_.fold(event, pending_);
        has_pending_ = has_pending_ || !event.token_ids.empty() || !event.text.empty() || last;
        if (last) {
          final_status_ = std::move(status);
          final_pending_ = true;
        }
        action = next_action_locked();
      }
    }
    perform(action);
    if (last) unref();
  }

  Action next_action_locked() {
    Action action;
    if (finished_ || write_in_flight_) return action;
    if (cancelled_) {
      finished_ = true;
      action.finish = true;
      action.status = grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
    } else if (has_pending_) {
      out_ = serialize(pending_);
      pending_.Clear();
      has_pending_ = false;
      write_in_flight_ = true;
      action.write = true;
    } else if (final_pending_) {
      finished_ = true;
      action.finish = true;
      action.status = final_status_;
    }
    return action;
  }

  void perform(const Action& action) {
    if (action.write) StartWrite(&out_);  // `out_` is untouched until OnWriteDone
    if (action.finish) {
      core_.record(action.status);
      Finish(action.status);
    }
  }

  void unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  GenerationCallCore core_;
  std::atomic<int> refs_{1};
  std::mutex mu_;
  v1::GenerateResponse pending_;  // folded events not yet written
  bool has_pending_ = false;
  bool final_pending_ = false;    // the final event arrived; finish once pending_ is written
  grpc::Status final_status_;
  bool write_in_flight_ = false;
  bool cancelled_ = false;
  bool finished_ = false;         // Finish() called (or about to be)
  grpc::ByteBuffer out_;          // the message being written
};

// Generate: the same path as the stream, all events folded into one response.
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(std::shared_ptr<State> state, grpc::CallbackServerContext* ctx,
            const grpc::ByteBuffer& request, grpc::ByteBuffer* response)
      : core_(std::move(state), ctx), response_(response) {
    GenerationRequest engine_request;
    if (absl::Status s = core_.prepare(request, engine_request); !s.ok()) {
      finish_once(to_grpc(s));
      return;
    }
    refs_.store(2);
    absl::Status s = core_.sink().submit(std::move(engine_request),
                                         [this](GenerationEvent e) { on_event(std::move(e)); });
    if (!s.ok()) {
      refs_.fetch_sub(1);
      finish_once(to_grpc(s));
    }
  }

  void OnCancel() override {
    core_.set_cancelled();
    finish_once(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  }

  void OnDone() override {
    core_.call_done();
    unref();
  }

 private:
  // Called by the sink, from its step thread.
  void on_event(GenerationEvent event) {
    const bool last = event.finished;
    bool finish = false;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!finished_) {
        status = core_.fold(event, collected_);
        if (last) {
          if (status.ok()) *response_ = serialize(collected_);
          finished_ = true;
          finish = true;
        }
      }
    }
    if (finish) {
      core_.record(status);
      Finish(status);
    }
    if (last) unref();
  }

  void finish_once(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    core_.record(status);
    Finish(status);
  }

  void unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  GenerationCallCore core_;
  grpc::ByteBuffer* response_;  // gRPC's, valid until OnDone; written only before Finish
  std::atomic<int> refs_{1};
  std::mutex mu_;
  v1::GenerateResponse collected_;
  bool finished_ = false;
};

class Service final
    : public v1::Generation::WithRawCallbackMethod_Generate<
          v1::Generation::WithRawCallbackMethod_GenerateStream<
              v1::Generation::WithRawCallbackMethod_Tokenize<
                  v1::Generation::WithCallbackMethod_GetModelInfo<
                      v1::Generation::WithCallbackMethod_LoadAdapter<
                          v1::Generation::WithCallbackMethod_UnloadAdapter<
                              v1::Generation::WithCallbackMethod_ListAdapters<
                                  v1::Generation::Service>>>>>>> {
 public:
  explicit Service(std::shared_ptr<State> state) : state_(std::move(state)) {}

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    return new UnaryCall(state_, ctx, *request, response);
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override {
    return new StreamCall(state_, ctx, *request);
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    v1::TokenizeResponse out;
    absl::Status s = state_->authorize(ctx);
    if (s.ok()) s = tokenize(*request, out);
    if (s.ok()) *response = serialize(out);
    reactor->Finish(to_grpc(s));
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest* /*request*/,
                                         v1::ModelInfo* out) override {
    if (absl::Status s = state_->authorize(ctx); !s.ok()) {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(to_grpc(s));
      return reactor;
    }
    const EngineInfo& info = state_->info;
    out->set_model_name(info.model_name);
    out->set_vocab_size(info.model.vocab_size);
    out->set_n_layer(info.model.n_layer);
    out->set_n_embd(info.model.n_embd);
    out->set_n_head(info.model.n_head);
    out->set_context_length(info.max_context());
    out->set_eos_token_id(info.model.eos_token_id);
    out->set_tp(info.tp);
    out->set_pp(info.pp);
    out->set_dtype(info.dtype);
    out->set_kv_dtype(info.kv_dtype);
    if (info.stats) {
      const EngineStats stats = info.stats();
      out->set_kv_blocks_total(stats.kv_blocks_total);
      out->set_kv_blocks_free(stats.kv_blocks_free);
      out->set_kv_block_size(stats.kv_block_size);
      out->set_queue_depth(stats.queue_depth);
      out->set_running(stats.running);
      out->set_requests_served(stats.requests_served);
    }
    if (info.adapters)
      for (const AdapterStatus& a : info.adapters()) to_proto(a, out->add_adapters());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // LoRA adapters: the scheduler carries the op out between steps and answers from its thread.
  grpc::ServerUnaryReactor* LoadAdapter(grpc::CallbackServerContext* ctx,
                                        const v1::LoadAdapterRequest* request,
                                        v1::AdapterInfo* out) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    absl::Status s = state_->authorize(ctx);
    absl::StatusOr<std::string> dir;
    if (s.ok()) s = adapters_enabled();
    if (s.ok()) {
      dir = resolve_adapter_dir(state_->info.lora_dir, request->name());
      s = dir.status();
    }
    if (!s.ok()) {
      reactor->Finish(to_grpc(s));
      return reactor;
    }
    AdapterOp op;
    op.kind = AdapterOp::Kind::kLoad;
    op.name = request->name();
    op.dir = *dir;
    op.done = [reactor, out, name = request->name()](absl::StatusOr<AdapterStatus> r) {
      if (r.ok()) {
        to_proto(*r, out);
        spdlog::info("LoRA adapter \"{}\" loaded (rank {})", name, r->rank);
      }
      reactor->Finish(to_grpc(r.status()));
    };
    state_->info.adapter_op(std::move(op));
    return reactor;
  }

  grpc::ServerUnaryReactor* UnloadAdapter(grpc::CallbackServerContext* ctx,
                                          const v1::UnloadAdapterRequest* request,
                                          v1::AdapterInfo* out) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    absl::Status s = state_->authorize(ctx);
    if (s.ok()) s = adapters_enabled();
    if (s.ok() && request->name().size() > kMaxAdapterNameBytes)
      s = absl::InvalidArgumentError("name is too long");
    if (!s.ok()) {
      reactor->Finish(to_grpc(s));
      return reactor;
    }
    AdapterOp op;
    op.kind = AdapterOp::Kind::kUnload;
    op.name = request->name();
    op.force = request->force();
    op.done = [reactor, out](absl::StatusOr<AdapterStatus> r) {
      if (r.ok()) to_proto(*r, out);
      reactor->Finish(to_grpc(r.status()));
    };
    state_->info.adapter_op(std::move(op));
    return reactor;
  }

  grpc::ServerUnaryReactor* ListAdapters(grpc::CallbackServerContext* ctx,
                                         const v1::ListAdaptersRequest* /*request*/,
                                         v1::ListAdaptersResponse* out) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    absl::Status s = state_->authorize(ctx);
    if (s.ok()) {
      std::vector<AdapterStatus> loaded;
      if (state_->info.adapters) loaded = state_->info.adapters();
      for (const AdapterStatus& a : loaded) to_proto(a, out->add_adapters());
      for (const std::string& name : list_adapter_dirs(state_->info.lora_dir)) {
        if (std::any_of(loaded.begin(), loaded.end(),
                        [&](const AdapterStatus& a) { return a.name == name; }))
          continue;
        AdapterStatus a;
        a.name = name;
        to_proto(a, out->add_adapters());
      }
    }
    reactor->Finish(to_grpc(s));
    return reactor;
  }

 private:
  absl::Status tokenize(const grpc::ByteBuffer& buffer, v1::TokenizeResponse& out) {
    v1::TokenizeRequest request;
    LTM_RETURN_IF_ERROR(parse_message(buffer, request, state_->tokenize_wire));
    const Tokenizer& tokenizer = *state_->tokenizer;
    const bool has_text = request.has_text();
    const bool has_ids = request.token_ids_size() > 0;
    if (has_text && has_ids)
      return absl::InvalidArgumentError("text and token_ids are both set; set exactly one");
    if (!has_text && !has_ids)
      return absl::InvalidArgumentError("text is missing: set text or token_ids");
    if (has_text) {
      if (!is_valid_utf8(request.text()))
        return absl::InvalidArgumentError("text is not valid UTF-8");
      const std::vector<int32_t> ids = tokenizer.encode(request.text());
      out.mutable_token_ids()->Add(ids.begin(), ids.end());
      out.set_text(request.text());
      return absl::OkStatus();
    }
    LTM_RETURN_IF_ERROR(
        check_token_ids(request.token_ids(), tokenizer, tokenizer.vocab_size(), "token_ids"));
    StreamingDecoder decoder(tokenizer);  // replaces bytes that are not UTF-8 by U+FFFD
    std::string text;
    for (int32_t id : request.token_ids()) text += decoder.push(id);
    text += decoder.flush();
    *out.mutable_token_ids() = request.token_ids();
    out.set_text(std::move(text));
    return absl::OkStatus();
  }

  absl::Status adapters_enabled() const {
    if (state_->info.adapter_op) return absl::OkStatus();
    if (state_->info.adapters)
      for (const AdapterStatus& a : state_->info.adapters())
        if (a.merged)
          return absl::FailedPreconditionError(absl::StrCat(
              "adapter \"", a.name, "\" is merged into this server's weights (--lora-merge); "
              "adapters cannot be loaded or unloaded here"));
    return absl::FailedPreconditionError("this server does not serve LoRA adapters");
  }

  std::shared_ptr<State> state_;
};

}  // namespace grpc_server_internal

using grpc_server_internal::Service;
using grpc_server_internal::State;

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::start(const GrpcServerOptions& options,
                                                              RequestSink& sink,
                                                              const Tokenizer& tokenizer,
                                                              EngineInfo info) {
  if (info.max_context() <= 0 || info.model.vocab_size <= 0)
    return absl::InvalidArgumentError(
        "engine info must give the model's vocab_size and context length (n_positions)");

  auto state = std::make_shared<State>();
  state->sink = &sink;
  state->tokenizer = &tokenizer;
  state->api_key = options.api_key;
  state->metrics = options.metrics;

  // Limits shared with the HTTP front door (runtime/serve/front_door.h).
  const FrontDoorLimits door = front_door_limits(info, tokenizer);
  state->limits = door.limits;
  const int64_t max_token_bytes = door.max_token_bytes;
  const int64_t max_prompt_tokens = door.max_prompt_tokens;
  const int64_t max_prompt_bytes = door.limits.max_prompt_bytes;
  state->generate_wire.fields = {
      {v1::GenerateRequest::kPromptFieldNumber, -1, max_prompt_bytes, "bytes"},
      {v1::GenerateRequest::kPromptTokenIdsFieldNumber, max_prompt_tokens, -1, "ids"},
      {v1::GenerateRequest::kStopFieldNumber, kMaxStopStrings, static_cast<int64_t>(kMaxStopBytes),
       "strings"},
      {v1::GenerateRequest::kRequestIdFieldNumber, -1, static_cast<int64_t>(kMaxRequestIdBytes),
       "bytes"},
      {v1::GenerateRequest::kAdapterFieldNumber, -1, static_cast<int64_t>(kMaxAdapterFieldBytes),
       "bytes"}};
  // Tokenize: any text the message limit lets through; ids up to one context (their text can be
  // up to max_token_bytes times larger, so they are bounded like a prompt).
  state->tokenize_wire.fields = {
      {v1::TokenizeRequest::kTokenIdsFieldNumber, info.max_context(), -1, "ids"}};

  int64_t max_receive = options.max_receive_message_bytes;
  if (max_receive == 0) max_receive = max_request_bytes(info.max_context(), max_token_bytes);
  if (max_receive < 1024 || max_receive > (int64_t{1} << 30))
    return absl::InvalidArgumentError(absl::StrCat(
        "the max receive message size must be in [1024, 1073741824] bytes, got ", max_receive));
  if (options.max_concurrent_streams < 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "max_concurrent_streams must be >= 1, got ", options.max_concurrent_streams));
  if (options.request_memory_bytes < (int64_t{16} << 20))
    return absl::InvalidArgumentError(absl::StrCat(
        "the request memory quota must be at least 16 MiB, got ", options.request_memory_bytes,
        " bytes"));

  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (options.tls_cert_file.empty() != options.tls_key_file.empty())
    return absl::InvalidArgumentError("TLS needs both a certificate and its key (--tls-cert and --tls-key)");
  if (!options.tls_client_ca_file.empty() && options.tls_cert_file.empty())
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  if (!options.tls_cert_file.empty()) {
    auto read = [](const std::string& path, std::string& out) -> absl::Status {
      std::ifstream in(path, std::ios::binary);
      if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot be read"));
      std::ostringstream ss;
      ss << in.rdbuf();
      out = ss.str();
      if (out.find("-----BEGIN") == std::string::npos)
        return absl::InvalidArgumentError(absl::StrCat(path, ": not a PEM file"));
      return absl::OkStatus();
    };
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    LTM_RETURN_IF_ERROR(read(options.tls_key_file, pair.private_key));
    LTM_RETURN_IF_ERROR(read(options.tls_cert_file, pair.cert_chain));
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    if (!options.tls_client_ca_file.empty()) {
      LTM_RETURN_IF_ERROR(read(options.tls_client_ca_file, ssl.pem_root_certs));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  state->info = std::move(info);
  std::random_device rd;
  state->id_prefix = absl::StrFormat("ltm-%08x", rd());

  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->state_ = state;
  server->service_ = std::make_unique<Service>(state);

  // Process-wide switches that apply to servers built from now on; reflection is then taken off
  // this builder unless asked for.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(options.address, credentials, &port);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_receive));
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  // Memory spent on calls in flight (buffers, parsed messages) and streams per connection.
  grpc::ResourceQuota quota("ltm-requests");
  quota.Resize(static_cast<size_t>(options.request_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  // Find clients that vanished without closing the connection, so their requests are freed.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.address,
                                               " (address in use or not valid?)"));
  server->port_ = port;
  const size_t colon = options.address.rfind(':');
  server->address_ = absl::StrCat(
      colon == std::string::npos ? options.address : options.address.substr(0, colon), ":", port);

  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  LTM_ASSERT(health != nullptr);
  health->SetServingStatus(true);
  health->SetServingStatus(v1::Generation::service_full_name(), true);
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->server = server->server_.get();
  }
  spdlog::info("serving ltm.v1.Generation on {} ({}{}; requests up to {} bytes)", server->address_,
               options.tls_cert_file.empty() ? "plaintext" : "TLS",
               options.tls_client_ca_file.empty() ? "" : ", client certificates required",
               max_receive);
  return server;
}

int64_t max_request_bytes(int64_t context_length, int64_t max_token_bytes) {
  const int64_t tokens = std::max<int64_t>(context_length - 1, 1);
  const int64_t prompt = std::max(tokens * std::max<int64_t>(max_token_bytes, 1), tokens * 5);
  const int64_t stops = kMaxStopStrings * static_cast<int64_t>(kMaxStopBytes + 3);
  const int64_t rest = static_cast<int64_t>(kMaxRequestIdBytes + kMaxAdapterFieldBytes) + 6 + 64;
  const int64_t total = prompt + 6 + stops + rest + 4096;
  return std::min<int64_t>((total + 1023) / 1024 * 1024, int64_t{1} << 30);
}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) {
    shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
}

void GrpcServer::begin_drain() {
  if (state_->draining.exchange(true)) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->server != nullptr) {
    state_->server->GetHealthCheckService()->SetServingStatus(false);
    spdlog::info("draining: new generation calls are refused; {} running",
                 state_->active.load());
  }
}

bool GrpcServer::draining() const { return state_->draining.load(); }

void GrpcServer::shutdown(std::chrono::system_clock::time_point deadline) {
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (state_->shutdown_started) {
      state_->shutdown_cv.wait(lock, [&] { return state_->shutdown_done; });
      return;
    }
    state_->shutdown_started = true;
  }
  begin_drain();
  server_->Shutdown(deadline);  // waits for running calls, cancels them at the deadline
  server_->Wait();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->server = nullptr;
    state_->shutdown_done = true;
  }
  state_->shutdown_cv.notify_all();
  spdlog::info("gRPC server on {} stopped", address_);
}

void GrpcServer::wait() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->shutdown_cv.wait(lock, [&] { return state_->shutdown_done; });
}

int64_t GrpcServer::active_calls() const { return state_->active.load(); }

}  // namespace ltm
