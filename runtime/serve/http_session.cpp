// One HTTP connection of the OpenAI front door (runtime/serve/http_session.h).
#include "runtime/serve/http_session.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "runtime/sched/admission.h"
#include "runtime/serve/auth.h"
#include "runtime/serve/front_door.h"
#include "runtime/serve/grpc_server.h"  // max_request_bytes
#include "runtime/serve/openai_api.h"
#include "spdlog/spdlog.h"

namespace ltm {

namespace beast = boost::beast;
namespace http = boost::beast::http;

namespace http_server_internal {

namespace {

constexpr size_t kHeaderLimit = 16 * 1024;
constexpr size_t kMaxPipelinedBytes = 64 * 1024;  // read ahead while a request generates

using StringResponse = http::response<http::string_body>;

// What the step thread hands to a connection: one event, its logits already reduced.
struct Piece {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  absl::Status status;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
};

// What the step thread's callback does with an event: the logprobs come reduced from the last
// stage (RowLogprobs, O(alternatives) per token), in order: the prompt's (from its second token
// on, each once) before the first new token's.
struct EventReducer {
  int n_top = -1;  // -1: no logprobs
  std::vector<int32_t> hidden;  // chat: the end tokens, whose logprobs a reply does not show
  Piece reduce(GenerationEvent& ev) {
    Piece p;
    p.text = std::move(ev.text);
    if (n_top >= 0) {
      for (const RowLogprobs& lp : ev.prompt_logprobs) p.logprobs.push_back(token_logprob(lp));
      for (size_t i = 0; i < ev.token_ids.size(); ++i) {
        if (std::find(hidden.begin(), hidden.end(), ev.token_ids[i]) != hidden.end()) continue;
        if (i < ev.token_logprobs.size())
          p.logprobs.push_back(token_logprob(ev.token_logprobs[i]));
        else
          p.logprobs.push_back(TokenLogprob{ev.token_ids[i], false, 0, {}});
      }
    }
    p.finished = ev.finished;
    p.reason = ev.finish_reason;
    p.status = std::move(ev.status);
    p.prompt_tokens = ev.prompt_tokens;
    p.completion_tokens = ev.completion_tokens;
    return p;
  }
};

}  // namespace


class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<State> state, tcp::socket socket)
      : state_(std::move(state)), stream_(std::move(socket)) {
    state_->connections.fetch_add(1);
  }
  ~Session() {
    release_active();
    if (evicted_.load()) state_->evicting.fetch_sub(1);
    state_->connections.fetch_sub(1);
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->sessions.erase(this);
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->sessions[this] = weak_from_this();
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  // The steady-clock time (ns) since which this connection waits for a request; 0 while one is
  // handled, or once it is evicted.
  int64_t waiting_since() const { return waiting_since_.load(std::memory_order_relaxed); }
  // Claims this connection for eviction (once, and only while it waits); then closes it.
  bool evict(int64_t seen_since) {
    if (!waiting_since_.compare_exchange_strong(seen_since, 0)) return false;
    evicted_.store(true);
    state_->evicting.fetch_add(1);
    close(false);
    return true;
  }

  // Shutdown: closes the connection unless it is generating (or always, with `force`).
  void close(bool force) {
    net::post(stream_.get_executor(), [self = shared_from_this(), force] {
      if (self->generating_ && !force) return;
      if (self->generating_) self->client_gone();
      beast::error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      self->stream_.close();
    });
  }

 private:
  // ---- reading requests ---------------------------------------------------------------------

  void do_read() {
    if (state_->shut_down.load()) {
      stream_.close();
      return;
    }
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(static_cast<uint64_t>(state_->max_body_bytes));
    stream_.expires_after(state_->idle());
    waiting_since_.store(std::chrono::steady_clock::now().time_since_epoch().count() | 1);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->on_read(ec);
                     });
  }

  void on_read(beast::error_code ec) {
    waiting_since_.store(0);
    if (evicted_.load()) return close_now();
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == net::error::eof) {
      close_now();
      return;
    }
    if (!ec) {
      unread_input_ = false;
      return handle(parser_->release());
    }
    keep_alive_ = false;
    version_ = 11;
    unread_input_ = true;  // the rest of the request is still coming: drain it before closing
    if (ec == http::error::body_limit) {
      ApiError e;
      e.http_status = 413;
      e.message = absl::StrCat("the request body is larger than ", state_->max_body_bytes,
                               " bytes");
      send_error(e);
      return;
    }
    if (ec == http::error::header_limit) {
      ApiError e;
      e.http_status = 431;
      e.message = absl::StrCat("the request headers are larger than ", kHeaderLimit, " bytes");
      send_error(e);
      return;
    }
    if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
      // A malformed request: say so, then close.
      ApiError e;
      e.message = absl::StrCat("malformed HTTP request: ", ec.message());
      return send_error(e);
    }
    close_now();
  }

  void handle(http::request<http::string_body> req) {
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    std::string_view target(req.target().data(), req.target().size());
    if (const size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    const http::verb method = req.method();

    if (target == "/health") {
      if (method != http::verb::get) return send_method_not_allowed("GET");
      const char* status = state_->draining.load()                              ? "draining"
                           : (state_->options.ready && !state_->options.ready()) ? "loading"
                                                                                  : "ok";
      nlohmann::json j = {{"status", status}};
      return send(std::string(status) == "ok" ? 200 : 503, j.dump(), "application/json");
    }
    const bool known = target == "/metrics" || target == "/v1/models" ||
                       target.starts_with("/v1/models/") || target == "/v1/completions" ||
                       target == "/v1/chat/completions";
    if (!known) {
      ApiError e;
      e.http_status = 404;
      e.message = absl::StrCat("no such endpoint: ", std::string(req.method_string()), " ",
                               std::string(target),
                               " (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                               "/health, /metrics)");
      e.code = "not_found";
      return send_error(e);
    }
    if (absl::Status s = authorize(req); !s.ok()) {
      if (target == "/v1/completions" || target == "/v1/chat/completions")
        state_->count(Outcome::kUnauthenticated);
      return send_error(api_error(s));
    }
    if (target == "/metrics") {
      if (method != http::verb::get) return send_method_not_allowed("GET");
      if (!state_->options.metrics) {
        ApiError e;
        e.http_status = 404;
        e.message = "this server keeps no metrics";
        return send_error(e);
      }
      return send(200, state_->options.metrics->render(),
                  "text/plain; version=0.0.4; charset=utf-8");
    }
    if (target == "/v1/models" || target.starts_with("/v1/models/")) {
      if (method != http::verb::get) return send_method_not_allowed("GET");
      const nlohmann::json model = model_json();
      const std::vector<std::string> adapters =
          state_->options.adapters ? state_->options.adapters() : std::vector<std::string>();
      if (target == "/v1/models") {
        nlohmann::json data = nlohmann::json::array({model});
        for (const std::string& a : adapters) data.push_back(adapter_json(a));
        return send(200,
                    nlohmann::json{{"object", "list"}, {"data", data}}
                        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
      }
      const std::string_view id = target.substr(std::string_view("/v1/models/").size());
      for (const std::string& a : adapters) {
        if (id == a)
          return send(200,
                      adapter_json(a).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      "application/json");
      }
      if (id != state_->info.model_name) {
        ApiError e;
        e.http_status = 404;
        e.message = absl::StrCat("model \"", std::string(id), "\" is not served here; this server "
                                 "serves \"", state_->info.model_name, "\"");
        e.param = "model";
        e.code = "model_not_found";
        return send_error(e);
      }
      return send(200, model.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
    }
    // /v1/completions, /v1/chat/completions
    if (method != http::verb::post) return send_method_not_allowed("POST");
    completion(req.body(), target == "/v1/chat/completions");
  }

  absl::Status authorize(const http::request<http::string_body>& req) const {
    const std::string& key = state_->options.api_key;
    if (key.empty()) return absl::OkStatus();
    auto it = req.find(http::field::authorization);
    if (it == req.end()) return check_bearer(nullptr, key);
    const std::string_view value(it->value().data(), it->value().size());
    return check_bearer(&value, key);
  }

  // A LoRA adapter as /v1/models lists it: a model whose parent is the base.
  nlohmann::json adapter_json(const std::string& name) const {
    return {{"id", name},
            {"object", "model"},
            {"created", state_->created},
            {"owned_by", "ltm"},
            {"parent", state_->info.model_name},
            {"max_model_len", state_->info.max_context()}};
  }

  nlohmann::json model_json() const {
    const EngineInfo& info = state_->info;
    return {{"id", info.model_name},
            {"object", "model"},
            {"created", state_->created},
            {"owned_by", "ltm"},
            {"max_model_len", info.max_context()},
            {"vocab_size", info.model.vocab_size},
            {"weight_dtype", info.dtype},
            {"kv_dtype", info.kv_dtype},
            {"tp", info.tp},
            {"pp", info.pp}};
  }

  // ---- completions --------------------------------------------------------------------------

  void completion(const std::string& body, bool chat) {
    if (state_->draining.load()) {
      state_->count(Outcome::kUnavailable);
      return send_error(api_error(absl::UnavailableError("server is draining")));
    }
    ParsedCompletion parsed;
    if (std::optional<ApiError> e = chat ? parse_chat_completion(body, state_->ctx, &parsed)
                                         : parse_completion(body, state_->ctx, &parsed)) {
      state_->count(e->http_status == 400 ? Outcome::kInvalid : Outcome::kError);
      return send_error(*e);
    }
    // OpenAI's ids: "cmpl-..." for completions, "chatcmpl-..." for chat completions.
    const std::string id = chat ? absl::StrCat("chat", state_->ids.next()) : state_->ids.next();
    parsed.request.request_id = id;
    cancel_ = parsed.request.cancel;
    stream_mode_ = parsed.params.stream;
    include_usage_ = parsed.params.include_usage;
    echo_text_ = parsed.params.echo ? parsed.params.prompt_text : std::string();
    request_id_ = id;
    text_.clear();
    logprobs_.clear();
    pending_.clear();
    final_seen_ = last_sent_ = client_gone_ = recorded_ = false;

    auto reducer = std::make_shared<EventReducer>();
    reducer->n_top = parsed.params.logprobs;
    if (chat && !parsed.request.ignore_eos) {
      reducer->hidden = parsed.request.end_ids;
      if (state_->info.model.eos_token_id >= 0)
        reducer->hidden.push_back(static_cast<int32_t>(state_->info.model.eos_token_id));
    }
    if (parsed.params.logprobs >= 0 && parsed.params.echo) {
      // The first prompt token has no logprob (nothing predicts it).
      logprobs_.push_back(TokenLogprob{parsed.request.prompt_ids[0], false, 0, {}});
    }
    builder_ = std::make_unique<CompletionBuilder>(*state_->tokenizer, parsed.params, id,
                                                   static_cast<int64_t>(std::time(nullptr)));
    if (!parsed.params.user.empty())
      spdlog::debug("http: {} from user {}", id, parsed.params.user);

    const std::string adapter = parsed.request.adapter;
    auto self = shared_from_this();
    absl::Status s = state_->sink->submit(
        std::move(parsed.request), [self, reducer](GenerationEvent ev) {
          // The step thread: reduce the logits here (they are large), then hand over.
          Piece piece = reducer->reduce(ev);
          net::post(self->stream_.get_executor(),
                    [self, piece = std::move(piece)]() mutable { self->on_piece(std::move(piece)); });
        });
    if (!s.ok()) {
      cancel_.reset();
      builder_.reset();
      state_->count(outcome_of(s.code()));
      ApiError e = api_error(s);
      if (s.code() == absl::StatusCode::kNotFound && !adapter.empty()) {
        // "model" named neither the base model nor a loaded adapter.
        e.http_status = 400;
        e.type = "invalid_request_error";
        e.param = "model";
        e.code = "model_not_found";
        e.message = absl::StrCat("model \"", adapter, "\" is not served here: this server serves \"",
                                 state_->info.model_name,
                                 "\" and the LoRA adapters GET /v1/models lists");
      }
      StringResponse res = error_response(e);
      if (e.http_status == 429)
        res.set(http::field::retry_after,
                std::to_string(retry_after_of(s).value_or(state_->options.retry_after_s)));
      return write(std::move(res));
    }
    state_->active.fetch_add(1);
    holds_active_ = true;
    generating_ = true;
    stream_.expires_never();
    if (stream_mode_) {
      sse_head_ = std::make_unique<http::response<http::empty_body>>(http::status::ok, version_);
      sse_head_->set(http::field::content_type, "text/event-stream");
      sse_head_->set(http::field::cache_control, "no-cache");
      sse_head_->set("X-Request-Id", id);
      sse_head_->keep_alive(keep_alive_ && !state_->draining.load());
      sse_head_->chunked(true);
      sse_serializer_ = std::make_unique<http::response_serializer<http::empty_body>>(*sse_head_);
      if (chat) append_event(builder_->role_chunk_json());  // written once the head is
      writing_ = true;
      stream_.expires_after(state_->idle());
      http::async_write_header(stream_, *sse_serializer_,
                               [self](beast::error_code ec, size_t) { self->on_chunk_written(ec); });
    }
    watch();
  }

  // While a request generates, a read stays posted: it sees a client that goes away (EOF or a
  // reset) at once, and keeps (bounded) what a pipelining client sends for later.
  void watch() {
    if (watching_ || client_gone_) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->on_watch(ec, n);
                            });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (resume_read_) {  // the request is answered: go on with the connection
      resume_read_ = false;
      if (!ec) buffer_.commit(n);
      if (ec && ec != net::error::operation_aborted) return close_now();
      return do_read();
    }
    if (ec) {
      if (generating_) client_gone();
      return;
    }
    buffer_.commit(n);
    if (buffer_.size() > kMaxPipelinedBytes) {  // not a well-behaved pipeline: stop reading
      if (generating_) client_gone();
      return;
    }
    if (generating_) watch();
  }

  // The client went away: cancel the request (the scheduler frees its blocks within a step) and
  // drop the connection; the final event still comes and ends the request's bookkeeping.
  void client_gone() {
    if (client_gone_) return;
    client_gone_ = true;
    if (cancel_) cancel_->cancelled.store(true);
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  void on_piece(Piece piece) {
    if (!generating_) return;
    for (TokenLogprob& t : piece.logprobs) logprobs_.push_back(std::move(t));
    if (!stream_mode_) {
      text_ += piece.text;
      if (piece.finished) finish_whole(piece);
      return;
    }
    if (client_gone_) {
      if (piece.finished) end_generation(Outcome::kCancelled, false);
      return;
    }
    std::string text = std::move(piece.text);
    if (!echo_text_.empty()) {
      text = echo_text_ + text;
      echo_text_.clear();
    }
    if (piece.finished) {
      final_outcome_ = outcome_for(piece);
      if (final_outcome_ == Outcome::kOk) {
        append_event(builder_->chunk_json(text, logprobs_, piece.reason));
        if (include_usage_)
          append_event(builder_->usage_chunk_json(piece.prompt_tokens, piece.completion_tokens));
      } else {
        if (!text.empty() || !logprobs_.empty())
          append_event(builder_->chunk_json(text, logprobs_, FinishReason::kNone));
        append_event(error_json(final_error(piece)));
      }
      pending_ += "data: [DONE]\n\n";
      final_seen_ = true;
    } else if (!text.empty() || !logprobs_.empty()) {
      append_event(builder_->chunk_json(text, logprobs_, FinishReason::kNone));
    }
    logprobs_.clear();
    kick();
  }

  void append_event(const std::string& json) { absl::StrAppend(&pending_, "data: ", json, "\n\n"); }

  static Outcome outcome_for(const Piece& p) {
    if (p.reason == FinishReason::kError)
      return p.status.code() == absl::StatusCode::kUnavailable ? Outcome::kUnavailable
                                                               : Outcome::kError;
    if (p.reason == FinishReason::kCancelled)
      return p.status.ok() ? Outcome::kCancelled : outcome_of(p.status.code());
    return Outcome::kOk;
  }

  static ApiError final_error(const Piece& p) {
    if (!p.status.ok()) return api_error(p.status);
    if (p.reason == FinishReason::kCancelled)
      return api_error(absl::CancelledError("the request was cancelled"));
    return api_error(absl::InternalError("the request failed"));
  }

  void kick() {
    if (writing_ || client_gone_) return;
    if (!pending_.empty()) {
      writing_ = true;
      out_ = std::move(pending_);
      pending_.clear();
      stream_.expires_after(state_->idle());  // a client that stops reading is dropped
      net::async_write(stream_, http::make_chunk(net::buffer(out_)),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->on_chunk_written(ec);
                       });
    } else if (final_seen_ && !last_sent_) {
      last_sent_ = true;
      writing_ = true;
      stream_.expires_after(state_->idle());
      net::async_write(stream_, http::make_chunk_last(),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->writing_ = false;
                         self->stream_.expires_never();
                         const bool ok = !ec;
                         if (!ok) self->client_gone();
                         self->end_generation(self->final_outcome_, ok && self->sse_head_->keep_alive());
                       });
    }
  }

  void on_chunk_written(beast::error_code ec) {
    writing_ = false;
    stream_.expires_never();
    if (ec) {
      client_gone();
      if (final_seen_) end_generation(Outcome::kCancelled, false);
      return;
    }
    kick();
  }

  void finish_whole(const Piece& piece) {
    if (client_gone_) return end_generation(Outcome::kCancelled, false);
    const Outcome outcome = outcome_for(piece);
    if (outcome != Outcome::kOk) {
      ApiError e = final_error(piece);
      end_generation(outcome, true, /*answered=*/false);
      StringResponse res = error_response(e);
      if (e.http_status == 429)  // shed while waiting (runtime/sched/admission.h)
        res.set(http::field::retry_after,
                std::to_string(retry_after_of(piece.status).value_or(state_->options.retry_after_s)));
      return write(std::move(res));
    }
    StringResponse res(http::status::ok, version_);
    res.set(http::field::content_type, "application/json");
    res.set("X-Request-Id", request_id_);
    res.body() = builder_->full_json(text_, logprobs_, piece.reason, piece.prompt_tokens,
                                     piece.completion_tokens);
    end_generation(outcome, true, /*answered=*/false);
    write(std::move(res));
  }

  // The request is over. `answered`: its response is fully written, so the connection goes on
  // (`keep`) or closes; else the caller writes the response next.
  void end_generation(Outcome outcome, bool keep, bool answered = true) {
    if (!generating_) return;
    generating_ = false;
    if (!recorded_) {
      recorded_ = true;
      state_->count(outcome);
    }
    cancel_.reset();
    text_.clear();
    logprobs_.clear();
    if (!answered) return;  // the request stays active until its response is written
    release_active();
    builder_.reset();
    if (!keep || client_gone_ || state_->draining.load()) return close_now();
    next_request();
  }

  // ---- writing responses --------------------------------------------------------------------

  StringResponse error_response(const ApiError& e) {
    StringResponse res(static_cast<http::status>(e.http_status), version_);
    res.set(http::field::content_type, "application/json");
    if (e.http_status == 401) res.set(http::field::www_authenticate, "Bearer");
    res.body() = error_json(e);
    return res;
  }

  void send_error(const ApiError& e) { write(error_response(e)); }

  void send_method_not_allowed(const char* allow) {
    ApiError e;
    e.http_status = 405;
    e.message = absl::StrCat("this endpoint answers ", allow, " only");
    StringResponse res = error_response(e);
    res.set(http::field::allow, allow);
    write(std::move(res));
  }

  void send(int status, std::string body, const char* content_type) {
    StringResponse res(static_cast<http::status>(status), version_);
    res.set(http::field::content_type, content_type);
    res.body() = std::move(body);
    write(std::move(res));
  }

  void write(StringResponse res) {
    if (client_gone_) {
      release_active();
      return close_now();
    }
    auto sp = std::make_shared<StringResponse>(std::move(res));
    sp->set(http::field::server, "ltm");
    sp->keep_alive(keep_alive_ && !state_->draining.load());
    sp->prepare_payload();
    stream_.expires_after(state_->idle());
    http::async_write(stream_, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
      self->stream_.expires_never();
      self->release_active();
      if (!ec && self->unread_input_) return self->close_after_reading();
      if (ec || !sp->keep_alive()) return self->close_now();
      self->next_request();
    });
  }

  // After an error answered before the request was read to its end (413, 431, malformed): stop
  // sending, then read and drop what the client still sends (at most 4 MiB, 2 s) before closing,
  // so that closing with unread input does not reset the connection under the answer.
  void close_after_reading() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(2));
    stream_.async_read_some(net::buffer(drain_buf_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > (size_t{4} << 20)) {
                                self->stream_.close();
                                return;
                              }
                              self->close_after_reading();
                            });
  }

  // A completion counts as active (shutdown waits for it) until its answer is written.
  void release_active() {
    if (!holds_active_) return;
    holds_active_ = false;
    state_->active.fetch_sub(1);
  }

  void next_request() {
    if (watching_) {  // wait for the watch read to end before the next read starts
      resume_read_ = true;
      stream_.socket().cancel();
      return;
    }
    do_read();
  }

  void close_now() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  std::shared_ptr<State> state_;  // first: outlives the stream
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = false;
  unsigned version_ = 11;
  bool unread_input_ = false;
  std::array<char, 4096> drain_buf_{};
  size_t drained_ = 0;

  // The request being generated.
  bool generating_ = false;
  bool holds_active_ = false;
  bool stream_mode_ = false;
  bool include_usage_ = false;
  bool client_gone_ = false;
  bool recorded_ = false;
  std::string request_id_;
  std::string echo_text_;
  std::shared_ptr<CancelFlag> cancel_;
  std::unique_ptr<CompletionBuilder> builder_;
  std::string text_;                     // whole response: text so far
  std::vector<TokenLogprob> logprobs_;   // not yet written (stream) / all (whole)
  Outcome final_outcome_ = Outcome::kOk;
  // Streaming.
  std::unique_ptr<http::response<http::empty_body>> sse_head_;
  std::unique_ptr<http::response_serializer<http::empty_body>> sse_serializer_;
  std::string pending_;  // events not yet written
  std::string out_;      // the chunk being written
  bool writing_ = false;
  bool final_seen_ = false;
  bool last_sent_ = false;
  // The watch read.
  bool watching_ = false;
  bool resume_read_ = false;
  // Eviction (evict_idle_session): read by the accept loop's thread.
  std::atomic<int64_t> waiting_since_{0};
  std::atomic<bool> evicted_{false};
};

void start_session(const std::shared_ptr<State>& state, tcp::socket socket) {
  std::make_shared<Session>(state, std::move(socket))->start();
}

void close_sessions(State& state, bool force) {
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    for (auto& [ptr, weak] : state.sessions)
      if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->close(force);
}

bool evict_idle_session(State& state) {
  if (state.evicting.load() >= kMaxEvicting) return false;
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    live.reserve(state.sessions.size());
    for (auto& [ptr, weak] : state.sessions)
      if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  // The longest waiting first; one that starts handling a request meanwhile is skipped.
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) {
    const int64_t x = a->waiting_since(), y = b->waiting_since();
    return (x != 0 && y == 0) || (x != 0 && y != 0 && x < y);
  });
  for (auto& s : live) {
    const int64_t since = s->waiting_since();
    if (since == 0) break;
    if (s->evict(since)) return true;
  }
  return false;
}

}  // namespace http_server_internal
}  // namespace ltm
