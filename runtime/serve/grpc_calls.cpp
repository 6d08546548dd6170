// The generation calls of the gRPC server (runtime/serve/grpc_calls.h): Generate (unary) and
// GenerateStream, one reactor each around a shared core.
#include "runtime/serve/grpc_calls.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/logging.h"
#include "ltm/v1/ltm.grpc.pb.h"
#include "runtime/serve/front_door.h"
#include "spdlog/spdlog.h"

namespace ltm::grpc_server_internal {

using Clock = std::chrono::steady_clock;

namespace {

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


Clock::time_point steady_deadline(std::chrono::system_clock::time_point deadline) {
  const auto remaining = deadline - std::chrono::system_clock::now();
  if (remaining > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(remaining);
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A ChatRequest as the GenerateRequest it stands for: the messages rendered by the chat template
// and tokenized into prompt_token_ids, the other fields copied.
absl::StatusOr<v1::GenerateRequest> chat_prompt(const v1::ChatRequest& c, const State& state) {
  if (!state.chat || !state.chat->has_template())
    return absl::FailedPreconditionError(absl::StrCat(
        "the model \"", state.info.model_name, "\" has no chat template (no \"chat_template\" in "
        "its tokenizer_config.json, no --chat-template FILE): it cannot chat; use Generate"));
  if (c.messages().empty()) return absl::InvalidArgumentError("messages is empty");
  nlohmann::json messages = nlohmann::json::array();
  for (int i = 0; i < c.messages_size(); ++i) {
    const v1::ChatMessage& m = c.messages(i);
    if (m.role().empty())
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role is missing"));
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant")
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role is \"", m.role().substr(0, 64),
                       "\": it must be \"system\", \"user\" or \"assistant\""));
    messages.push_back({{"role", m.role()}, {"content", m.content()}});
  }
  LTM_ASSIGN_OR_RETURN(std::string text, state.chat->render(messages));
  v1::GenerateRequest p;
  for (int32_t id : state.chat->encode(text)) p.add_prompt_token_ids(id);
  if (p.prompt_token_ids().empty())
    return absl::InvalidArgumentError("messages: the chat template made an empty prompt of them");
  if (c.has_max_new_tokens()) {
    p.set_max_new_tokens(c.max_new_tokens());
  } else {  // what the context leaves
    p.set_max_new_tokens(static_cast<int32_t>(std::clamp<int64_t>(
        state.limits.context_length - p.prompt_token_ids_size(), 1,
        std::numeric_limits<int32_t>::max())));
  }
  if (c.has_temperature()) p.set_temperature(c.temperature());
  if (c.has_top_k()) p.set_top_k(c.top_k());
  if (c.has_top_p()) p.set_top_p(c.top_p());
  if (c.has_repetition_penalty()) p.set_repetition_penalty(c.repetition_penalty());
  if (c.has_seed()) p.set_seed(c.seed());
  *p.mutable_stop() = c.stop();
  p.set_return_logprobs(c.return_logprobs());
  p.set_request_id(c.request_id());
  p.set_ignore_eos(c.ignore_eos());
  p.set_adapter(c.adapter());
  return p;
}

}  // namespace

// absl and gRPC status codes share their numbering (google.rpc.Code).
grpc::Status to_grpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
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

grpc::ByteBuffer serialize(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

namespace {

// What both generation calls (unary and stream) share: turning the request into the engine's,
// folding events into responses, and the final status.
class GenerationCallCore {
 public:
  GenerationCallCore(std::shared_ptr<State> state, grpc::CallbackServerContext* ctx)
      : state_(std::move(state)), ctx_(ctx), arrival_(Clock::now()) {
    state_->active.fetch_add(1);
  }

  // Parses and validates; on success `request` is ready for the sink.
  absl::Status prepare(const grpc::ByteBuffer& buffer, bool chat, GenerationRequest& request) {
    LTM_RETURN_IF_ERROR(state_->authorize(ctx_));
    if (state_->draining.load()) return absl::UnavailableError("server is draining");
    v1::GenerateRequest proto;
    if (chat) {
      v1::ChatRequest c;
      LTM_RETURN_IF_ERROR(parse_message(buffer, c, state_->chat_wire));
      LTM_ASSIGN_OR_RETURN(proto, chat_prompt(c, *state_));
    } else {
      LTM_RETURN_IF_ERROR(parse_message(buffer, proto, state_->generate_wire));
    }
    absl::StatusOr<GenerationRequest> r =
        make_generation_request(proto, *state_->tokenizer, state_->limits);
    if (!r.ok() && chat && absl::StartsWith(r.status().message(), "prompt"))
      return absl::Status(r.status().code(),
                          absl::StrCat("messages (the prompt the chat template makes of them): ",
                                       r.status().message()));
    if (!r.ok()) return r.status();
    request = std::move(*r);
    if (chat) {
      for (int32_t id : state_->chat->chat_end_ids())
        if (std::find(request.end_ids.begin(), request.end_ids.end(), id) == request.end_ids.end())
          request.end_ids.push_back(id);
    } else if (state_->chat) {
      request.end_ids = state_->chat->generation_eos_ids();
    }
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
             const grpc::ByteBuffer& request, bool chat)
      : core_(std::move(state), ctx) {
    GenerationRequest engine_request;
    if (absl::Status s = core_.prepare(request, chat, engine_request); !s.ok()) {
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
    publish();
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
    { std::lock_guard<std::mutex> lock(mu_); }  // see publish()
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
    { std::lock_guard<std::mutex> lock(mu_); }  // see publish()
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

  // The constructor runs on one gRPC thread and the reactions (OnCancel, OnDone) on others, ordered
  // by libgrpc, whose synchronization ThreadSanitizer cannot see (Debian's build is not
  // instrumented). Releasing mu_ here, after the last write of the constructor, and taking it first
  // thing in each reaction puts that order where TSan sees it: one uncontended lock per reaction.
  void publish() { std::lock_guard<std::mutex> lock(mu_); }

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
            const grpc::ByteBuffer& request, grpc::ByteBuffer* response, bool chat)
      : core_(std::move(state), ctx), response_(response) {
    GenerationRequest engine_request;
    if (absl::Status s = core_.prepare(request, chat, engine_request); !s.ok()) {
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
    publish();
  }

  void OnCancel() override {
    { std::lock_guard<std::mutex> lock(mu_); }  // see publish()
    core_.set_cancelled();
    finish_once(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  }

  void OnDone() override {
    { std::lock_guard<std::mutex> lock(mu_); }  // see publish()
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

  void publish() { std::lock_guard<std::mutex> lock(mu_); }  // as StreamCall's

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

}  // namespace

grpc::ServerUnaryReactor* start_unary_generation(std::shared_ptr<State> state,
                                                 grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer& request,
                                                 grpc::ByteBuffer* response, bool chat) {
  return new UnaryCall(std::move(state), ctx, request, response, chat);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* start_stream_generation(
    std::shared_ptr<State> state, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& request,
    bool chat) {
  return new StreamCall(std::move(state), ctx, request, chat);
}

}  // namespace ltm::grpc_server_internal
