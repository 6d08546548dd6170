// GrpcServer against a fake engine: a RequestSink that "generates" deterministic tokens on its own
// thread, one per step. Checks the public API end to end over loopback: results, errors and their
// codes, cancellation and deadlines reaching the engine, draining, health and reflection.
#include "runtime/serve/grpc_server.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"
#include "ltm/v1/ltm.grpc.pb.h"
#include "runtime/serve/request_validation.h"
#include "tests/serve/toy_vocab.h"

namespace ltm {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// ---- A toy tokenizer: 256 byte tokens + 2 merges (no files) ----------------------------------

using testing_vocab::byte_spelling;

Tokenizer toy_tokenizer() {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(byte_spelling(b), b);
  vocab.emplace_back("he", 256);
  vocab.emplace_back("<|endoftext|>", 257);
  absl::StatusOr<Tokenizer> t = Tokenizer::from_tables(vocab, {{"h", "e"}}, "toy");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

constexpr int64_t kVocab = 258;
constexpr int64_t kContext = 4096;

// ---- The fake engine -------------------------------------------------------------------------

// Token j of a request is 'a' + (sum of prompt ids + j) % 26, its text that letter, its logprob
// -j/8. One token per request per step; the final event carries the last token.
class FakeSink : public RequestSink {
 public:
  struct Seen {
    std::string request_id;
    std::vector<int32_t> prompt_ids;
    int32_t max_new_tokens = 0;
    std::chrono::steady_clock::time_point deadline;
    std::shared_ptr<CancelFlag> cancel;
  };

  FakeSink() : thread_([this] { loop(); }) {}
  ~FakeSink() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  absl::Status submit(GenerationRequest request, EventCallback on_event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reject_.ok()) return reject_;
    seen_.push_back({request.request_id, request.prompt_ids, request.max_new_tokens,
                     request.deadline, request.cancel});
    active_.push_back({std::move(request), std::move(on_event), 0});
    cv_.notify_all();
    return absl::OkStatus();
  }

  void set_reject(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    reject_ = std::move(s);
  }
  void set_error(absl::Status e) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(e);
  }
  // Off: the fake ignores GenerationRequest::deadline, so only the server can stop a request.
  void set_honor_deadline(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    honor_deadline_ = on;
  }
  void set_step(std::chrono::milliseconds step) {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = step;
  }
  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  Seen last_seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.back();
  }
  // Waits until the request has had its final event; returns its finish reason (kNone: timeout).
  FinishReason wait_finished(const std::string& request_id, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return finished_.count(request_id) > 0; });
    auto it = finished_.find(request_id);
    return it == finished_.end() ? FinishReason::kNone : it->second;
  }
  size_t n_active() {
    std::lock_guard<std::mutex> lock(mu_);
    return active_.size();
  }

  static int32_t token(const std::vector<int32_t>& prompt, int j) {
    int64_t sum = 0;
    for (int32_t id : prompt) sum += id;
    return 'a' + static_cast<int32_t>((sum + j) % 26);
  }

 private:
  struct Active {
    GenerationRequest request;
    EventCallback on_event;
    int32_t generated;
  };

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait_for(lock, step_, [&] { return stop_; });
      if (stop_) break;
      std::deque<Active> work;
      work.swap(active_);
      const absl::Status error = error_;
      const bool honor_deadline = honor_deadline_;
      lock.unlock();
      std::deque<Active> still;
      std::vector<std::pair<std::string, FinishReason>> done;
      for (Active& a : work) {
        GenerationEvent e;
        const GenerationRequest& r = a.request;
        if (r.cancel->cancelled.load() ||
            (honor_deadline && std::chrono::steady_clock::now() >= r.deadline)) {
          e.finished = true;
          e.finish_reason = FinishReason::kCancelled;
        } else {
          const int32_t t = token(r.prompt_ids, a.generated);
          e.token_ids.push_back(t);
          if (r.return_logprobs) e.logprobs.push_back(-a.generated / 8.0f);
          e.text = std::string(1, static_cast<char>(t));
          ++a.generated;
          if (!error.ok()) {
            e.finished = true;
            e.finish_reason = FinishReason::kError;
            e.status = error;
          } else if (a.generated == r.max_new_tokens) {
            e.finished = true;
            e.finish_reason = FinishReason::kLength;
          }
        }
        if (e.finished) {
          e.prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
          e.completion_tokens = a.generated;
          done.emplace_back(r.request_id, e.finish_reason);
        }
        const bool finished = e.finished;
        a.on_event(std::move(e));
        if (!finished) still.push_back(std::move(a));
      }
      lock.lock();
      for (Active& a : still) active_.push_back(std::move(a));
      for (auto& [id, reason] : done) finished_[id] = reason;
      cv_.notify_all();
    }
    // Exactly one final event per request, whatever happens.
    for (Active& a : active_) {
      GenerationEvent e;
      e.finished = true;
      e.finish_reason = FinishReason::kCancelled;
      a.on_event(std::move(e));
    }
    active_.clear();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  absl::Status reject_;
  absl::Status error_;
  bool honor_deadline_ = true;
  std::chrono::milliseconds step_{1};
  std::deque<Active> active_;
  std::vector<Seen> seen_;
  std::map<std::string, FinishReason> finished_;
  std::thread thread_;  // last: starts after the members above exist
};

// ---- Fixture -----------------------------------------------------------------------------------

struct StreamResult {
  grpc::Status status;
  std::vector<v1::GenerateResponse> messages;
};

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override { start(); }

  void start(int max_receive = 1 << 20) {
    EngineInfo info;
    info.model_name = "toy";
    info.model.vocab_size = kVocab;
    info.model.n_positions = kContext;
    info.model.n_embd = 64;
    info.model.n_layer = 2;
    info.model.n_head = 4;
    info.model.eos_token_id = 257;
    info.tp = 2;
    info.pp = 3;
    info.dtype = "fp32";
    info.stats = [] {
      EngineStats s;
      s.kv_blocks_total = 100;
      s.kv_blocks_free = 60;
      s.kv_block_size = 16;
      s.queue_depth = 2;
      s.running = 5;
      s.requests_served = 42;
      return s;
    };
    GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    options.max_receive_message_bytes = max_receive;
    options.reflection = reflection_;
    options.api_key = api_key_;
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::start(options, sink_, tokenizer_, info);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Generation::NewStub(channel_);
  }

  static v1::GenerateRequest request(const std::string& prompt, int max_new_tokens) {
    v1::GenerateRequest r;
    r.set_prompt(prompt);
    r.set_max_new_tokens(max_new_tokens);
    return r;
  }

  static void set_timeout(grpc::ClientContext& ctx, std::chrono::milliseconds t) {
    ctx.set_deadline(std::chrono::system_clock::now() + t);
  }

  grpc::Status generate(const v1::GenerateRequest& r, v1::GenerateResponse* out) {
    grpc::ClientContext ctx;
    set_timeout(ctx, 20s);
    return stub_->Generate(&ctx, r, out);
  }

  StreamResult stream(const v1::GenerateRequest& r) {
    grpc::ClientContext ctx;
    set_timeout(ctx, 20s);
    StreamResult result;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->GenerateStream(&ctx, r);
    v1::GenerateResponse m;
    while (reader->Read(&m)) result.messages.push_back(m);
    result.status = reader->Finish();
    return result;
  }

  // One unary call of a grpc.* service by name, with a hand-encoded request (these services'
  // .proto files are not installed, only their server side).
  grpc::Status generic_unary(const std::string& method, const std::string& request_bytes,
                             std::string* response_bytes) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    set_timeout(ctx, 10s);
    grpc::CompletionQueue cq;
    grpc::Slice slice(request_bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    auto call = generic.PrepareUnaryCall(&ctx, method, request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    if (status.ok()) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(response.Dump(&slices).ok());
      for (auto& s : slices) response_bytes->append(reinterpret_cast<const char*>(s.begin()),
                                                    s.size());
    }
    return status;
  }

  // grpc.health.v1.Health/Check: 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN; -1 on error.
  int health(const std::string& service) {
    google::protobuf::UnknownFieldSet req;
    if (!service.empty()) req.AddLengthDelimited(1, service);
    std::string bytes, reply;
    req.SerializeToString(&bytes);
    grpc::Status s = generic_unary("/grpc.health.v1.Health/Check", bytes, &reply);
    if (!s.ok()) return -1;
    google::protobuf::UnknownFieldSet resp;
    EXPECT_TRUE(resp.ParseFromString(reply));
    for (int i = 0; i < resp.field_count(); ++i)
      if (resp.field(i).number() == 1) return static_cast<int>(resp.field(i).varint());
    return 0;  // UNKNOWN (the default is not sent)
  }

  // Calls end on the server (OnDone) just after the client has its status.
  int64_t wait_idle() {
    for (int i = 0; i < 1000 && server_->active_calls() > 0; ++i)
      std::this_thread::sleep_for(1ms);
    return server_->active_calls();
  }

  void restart() {
    stub_.reset();
    channel_.reset();
    server_.reset();
    start();
  }

  bool reflection_ = true;
  std::string api_key_;
  FakeSink sink_;  // outlives the server (declared first, destroyed last)
  Tokenizer tokenizer_ = toy_tokenizer();
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

std::string concat_text(const std::vector<v1::GenerateResponse>& ms) {
  std::string s;
  for (const auto& m : ms) s += m.text();
  return s;
}

// ---- Results ---------------------------------------------------------------------------------

TEST_F(GrpcServerTest, UnaryAndStreamAgree) {
  v1::GenerateRequest r = request("hello", 12);
  r.set_return_logprobs(true);
  r.set_request_id("req-1");
  v1::GenerateResponse unary;
  grpc::Status s = generate(r, &unary);
  ASSERT_TRUE(s.ok()) << s.error_message();

  const std::vector<int32_t> prompt = tokenizer_.encode("hello");
  std::string expected_text;
  ASSERT_EQ(unary.token_ids_size(), 12);
  for (int j = 0; j < 12; ++j) {
    EXPECT_EQ(unary.token_ids(j), FakeSink::token(prompt, j));
    EXPECT_FLOAT_EQ(unary.logprobs(j), -j / 8.0f);
    expected_text += static_cast<char>(FakeSink::token(prompt, j));
  }
  EXPECT_EQ(unary.text(), expected_text);
  EXPECT_EQ(unary.request_id(), "req-1");
  EXPECT_EQ(unary.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(unary.usage().prompt_tokens(), static_cast<int>(prompt.size()));
  EXPECT_EQ(unary.usage().completion_tokens(), 12);
  EXPECT_GT(unary.timings().total_ms(), 0.0);
  EXPECT_GT(unary.timings().time_to_first_token_ms(), 0.0);
  EXPECT_LE(unary.timings().time_to_first_token_ms(), unary.timings().total_ms());

  StreamResult st = stream(r);
  ASSERT_TRUE(st.status.ok()) << st.status.error_message();
  ASSERT_FALSE(st.messages.empty());
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  for (size_t i = 0; i < st.messages.size(); ++i) {
    const auto& m = st.messages[i];
    EXPECT_EQ(m.request_id(), "req-1");
    ids.insert(ids.end(), m.token_ids().begin(), m.token_ids().end());
    logprobs.insert(logprobs.end(), m.logprobs().begin(), m.logprobs().end());
    if (i + 1 < st.messages.size()) {
      EXPECT_EQ(m.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
      EXPECT_FALSE(m.has_usage());
    }
  }
  EXPECT_EQ(ids, std::vector<int32_t>(unary.token_ids().begin(), unary.token_ids().end()));
  EXPECT_EQ(logprobs, std::vector<float>(unary.logprobs().begin(), unary.logprobs().end()));
  EXPECT_EQ(concat_text(st.messages), unary.text());
  const v1::GenerateResponse& last = st.messages.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().prompt_tokens(), unary.usage().prompt_tokens());
  EXPECT_EQ(last.usage().completion_tokens(), 12);
  EXPECT_GT(st.messages.size(), 1u) << "tokens should stream, not arrive all at the end";
}

TEST_F(GrpcServerTest, TokenIdPromptAndGeneratedRequestId) {
  v1::GenerateRequest r;
  r.add_prompt_token_ids(1);
  r.add_prompt_token_ids(2);
  r.set_max_new_tokens(3);
  v1::GenerateResponse out;
  ASSERT_TRUE(generate(r, &out).ok());
  EXPECT_EQ(out.token_ids_size(), 3);
  EXPECT_THAT(out.request_id(), ::testing::StartsWith("ltm-"));
  EXPECT_EQ(sink_.last_seen().prompt_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(sink_.last_seen().request_id, out.request_id());
}

TEST_F(GrpcServerTest, ManyConcurrentStreams) {
  constexpr int kCalls = 80;
  sink_.set_step(2ms);
  std::vector<std::thread> threads;
  std::vector<StreamResult> results(kCalls);
  for (int i = 0; i < kCalls; ++i)
    threads.emplace_back([&, i] { results[i] = stream(request(absl::StrCat("p", i), 20)); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(concat_text(results[i].messages).size(), 20u) << i;
    EXPECT_EQ(results[i].messages.back().finish_reason(), v1::FINISH_REASON_LENGTH);
  }
  EXPECT_EQ(wait_idle(), 0);
}

// ---- Bad requests ------------------------------------------------------------------------------

TEST_F(GrpcServerTest, EveryBadInputIsInvalidArgumentNamingTheField) {
  struct Case {
    std::string field;
    std::function<void(v1::GenerateRequest&)> spoil;
  };
  const std::vector<Case> cases = {
      {"prompt is missing", [](auto& r) { r.clear_prompt(); }},
      {"prompt is empty", [](auto& r) { r.set_prompt(""); }},
      {"prompt and prompt_token_ids", [](auto& r) { r.add_prompt_token_ids(1); }},
      {"prompt is 4096 tokens", [](auto& r) { r.set_prompt(std::string(kContext, 'x')); }},
      {"prompt is not valid UTF-8", [](auto& r) { r.set_prompt("ok\xC3("); }},
      {"max_new_tokens must be >= 1", [](auto& r) { r.set_max_new_tokens(0); }},
      {"max_new_tokens = 4096", [](auto& r) { r.set_max_new_tokens(kContext); }},
      {"temperature", [](auto& r) { r.set_temperature(-1); }},
      {"top_p", [](auto& r) { r.set_top_p(0); }},
      {"top_p", [](auto& r) { r.set_top_p(1.5f); }},
      {"top_k", [](auto& r) { r.set_top_k(-2); }},
      {"repetition_penalty", [](auto& r) { r.set_repetition_penalty(0); }},
      {"prompt_token_ids[1] = 258",
       [](auto& r) {
         r.clear_prompt();
         r.add_prompt_token_ids(5);
         r.add_prompt_token_ids(258);
       }},
      {"prompt_token_ids[0] = -1",
       [](auto& r) {
         r.clear_prompt();
         r.add_prompt_token_ids(-1);
       }},
      {"stop[0] is empty", [](auto& r) { r.add_stop(""); }},
      {"stop[1] is not valid UTF-8",
       [](auto& r) {
         r.mutable_stop()->Add(std::string("x"));
         r.mutable_stop()->Add(std::string("\xFF"));
       }},
      {"stop has 17 strings",
       [](auto& r) {
         for (int i = 0; i < 17; ++i) r.add_stop(absl::StrCat("s", i));
       }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = request("hello", 4);
    c.spoil(r);
    v1::GenerateResponse out;
    grpc::Status s = generate(r, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(s.error_message(), HasSubstr(c.field));
    StreamResult st = stream(r);
    EXPECT_EQ(st.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(st.status.error_message(), HasSubstr(c.field));
    EXPECT_TRUE(st.messages.empty());
    // The server is undisturbed: a good request right after succeeds.
    v1::GenerateResponse good;
    grpc::Status gs = generate(request("hello", 2), &good);
    EXPECT_TRUE(gs.ok()) << "after " << c.field << ": " << gs.error_message();
    EXPECT_EQ(good.token_ids_size(), 2);
  }
  EXPECT_EQ(sink_.seen().size(), cases.size()) << "no bad request may reach the engine";
}

TEST_F(GrpcServerTest, OversizedRequestIsRefusedByGrpc) {
  v1::GenerateResponse out;
  grpc::Status s = generate(request(std::string((1 << 20) + 10, 'x'), 4), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(generate(request("hello", 2), &out).ok());
}

// ---- Engine statuses ---------------------------------------------------------------------------

TEST_F(GrpcServerTest, SinkStatusesMapToGrpcCodes) {
  v1::GenerateResponse out;
  sink_.set_reject(absl::ResourceExhaustedError("queue is full (64 requests)"));
  grpc::Status s = generate(request("hello", 4), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("queue is full"));
  StreamResult st = stream(request("hello", 4));
  EXPECT_EQ(st.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  sink_.set_reject(absl::UnavailableError("engine is shutting down"));
  EXPECT_EQ(generate(request("hello", 4), &out).error_code(), grpc::StatusCode::UNAVAILABLE);

  sink_.set_reject(absl::OkStatus());
  EXPECT_TRUE(generate(request("hello", 4), &out).ok());
  EXPECT_EQ(wait_idle(), 0);
}

TEST_F(GrpcServerTest, EngineErrorsEndTheCallWithAnErrorStatus) {
  v1::GenerateResponse out;
  sink_.set_error(absl::InternalError("non-finite logits in step 7"));
  grpc::Status s = generate(request("hello", 4), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(s.error_message(), HasSubstr("non-finite logits"));
  StreamResult st = stream(request("hello", 4));
  EXPECT_EQ(st.status.error_code(), grpc::StatusCode::INTERNAL);

  // The kind decides the code, not the words: an Unavailable error is UNAVAILABLE whatever its
  // text says, and an Internal one that mentions a rank and a timeout is still INTERNAL.
  sink_.set_error(absl::UnavailableError("the group went down"));
  s = generate(request("hello", 4), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  st = stream(request("hello", 4));
  EXPECT_EQ(st.status.error_code(), grpc::StatusCode::UNAVAILABLE);

  sink_.set_error(absl::InternalError("rank 3 timed out computing a NaN"));
  s = generate(request("hello", 4), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
}


// ---- Cancellation and deadlines ----------------------------------------------------------------

TEST_F(GrpcServerTest, ClientCancellationSetsTheCancelFlag) {
  sink_.set_step(5ms);
  grpc::ClientContext ctx;
  v1::GenerateRequest r = request("hello", 2000);
  r.set_request_id("to-cancel");
  auto reader = stub_->GenerateStream(&ctx, r);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  ASSERT_TRUE(reader->Read(&m));
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(sink_.wait_finished("to-cancel", 5s), FinishReason::kCancelled);
  EXPECT_TRUE(sink_.last_seen().cancel->cancelled.load());
}

TEST_F(GrpcServerTest, UnaryCancellationSetsTheCancelFlag) {
  sink_.set_step(5ms);
  grpc::ClientContext ctx;
  v1::GenerateRequest r = request("hello", 2000);
  r.set_request_id("unary-cancel");
  v1::GenerateResponse out;
  std::thread canceller([&] {
    while (sink_.seen().empty()) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(20ms);
    ctx.TryCancel();
  });
  grpc::Status s = stub_->Generate(&ctx, r, &out);
  canceller.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(sink_.wait_finished("unary-cancel", 5s), FinishReason::kCancelled);
  EXPECT_TRUE(sink_.last_seen().cancel->cancelled.load());
}

TEST_F(GrpcServerTest, DeadlineIsCopiedAndExpirySetsTheCancelFlag) {
  sink_.set_step(5ms);
  sink_.set_honor_deadline(false);  // so that only the server's reaction to the expiry stops it
  grpc::ClientContext ctx;
  const auto before = std::chrono::steady_clock::now();
  set_timeout(ctx, 300ms);
  v1::GenerateRequest r = request("hello", 2000);
  r.set_request_id("deadline");
  auto reader = stub_->GenerateStream(&ctx, r);
  v1::GenerateResponse m;
  int n = 0;
  while (reader->Read(&m)) ++n;
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GT(n, 0);
  const FakeSink::Seen seen = sink_.last_seen();
  EXPECT_GT(seen.deadline, before + 100ms);
  EXPECT_LT(seen.deadline, before + 1000ms);
  EXPECT_EQ(sink_.wait_finished("deadline", 5s), FinishReason::kCancelled);
  EXPECT_TRUE(seen.cancel->cancelled.load());
}

TEST_F(GrpcServerTest, EngineSeeingTheDeadlineFirstEndsWithDeadlineExceeded) {
  sink_.set_step(5ms);
  grpc::ClientContext ctx;
  set_timeout(ctx, 300ms);
  v1::GenerateRequest r = request("hello", 2000);
  r.set_request_id("engine-deadline");
  v1::GenerateResponse out;
  EXPECT_EQ(stub_->Generate(&ctx, r, &out).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(sink_.wait_finished("engine-deadline", 5s), FinishReason::kCancelled);
}

// ---- Drain, shutdown, health, reflection ------------------------------------------------------

TEST_F(GrpcServerTest, DrainRefusesNewCallsWhileRunningOnesFinish) {
  EXPECT_EQ(health(""), 1);
  EXPECT_EQ(health("ltm.v1.Generation"), 1);
  sink_.set_step(10ms);

  grpc::ClientContext ctx;
  set_timeout(ctx, 20s);
  auto reader = stub_->GenerateStream(&ctx, request("hello", 30));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::string text = m.text();

  server_->begin_drain();
  EXPECT_TRUE(server_->draining());
  v1::GenerateResponse out;
  grpc::Status s = generate(request("hello", 2), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("server is draining"));
  EXPECT_EQ(stream(request("hello", 2)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(health(""), 2);
  EXPECT_EQ(health("ltm.v1.Generation"), 2);
  // Cheap calls still answer.
  grpc::ClientContext info_ctx;
  v1::ModelInfo info;
  EXPECT_TRUE(stub_->GetModelInfo(&info_ctx, v1::GetModelInfoRequest(), &info).ok());

  while (reader->Read(&m)) text += m.text();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(text.size(), 30u);
  EXPECT_EQ(m.finish_reason(), v1::FINISH_REASON_LENGTH);

  const auto t0 = std::chrono::steady_clock::now();
  server_->shutdown(std::chrono::system_clock::now() + 10s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "nothing was running";
}

TEST_F(GrpcServerTest, ShutdownDeadlineCancelsRunningCalls) {
  sink_.set_step(5ms);
  grpc::ClientContext ctx;
  set_timeout(ctx, 20s);
  v1::GenerateRequest r = request("hello", 3000);
  r.set_request_id("cut");
  auto reader = stub_->GenerateStream(&ctx, r);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  const auto t0 = std::chrono::steady_clock::now();
  server_->shutdown(std::chrono::system_clock::now() + 200ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 5s);
  while (reader->Read(&m)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  EXPECT_EQ(sink_.wait_finished("cut", 5s), FinishReason::kCancelled);
  server_->wait();  // returns at once
  server_->shutdown(std::chrono::system_clock::now());  // idempotent
}

TEST_F(GrpcServerTest, ReflectionListsTheService) {
  grpc::GenericStub generic(channel_);
  grpc::ClientContext ctx;
  set_timeout(ctx, 10s);
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto step = [&](int want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(want));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  google::protobuf::UnknownFieldSet req;
  req.AddLengthDelimited(7, "");  // list_services
  std::string bytes;
  req.SerializeToString(&bytes);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  ASSERT_TRUE(status.ok()) << status.error_message();

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string reply;
  for (auto& s : slices) reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // ServerReflectionResponse.list_services_response (6) -> service (1) -> name (1).
  std::vector<std::string> names;
  google::protobuf::UnknownFieldSet top;
  ASSERT_TRUE(top.ParseFromString(reply));
  for (int i = 0; i < top.field_count(); ++i) {
    if (top.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    ASSERT_TRUE(list.ParseFromString(top.field(i).length_delimited()));
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      ASSERT_TRUE(service.ParseFromString(list.field(j).length_delimited()));
      for (int k = 0; k < service.field_count(); ++k)
        if (service.field(k).number() == 1) names.push_back(service.field(k).length_delimited());
    }
  }
  EXPECT_THAT(names, ::testing::Contains("ltm.v1.Generation"));
  EXPECT_THAT(names, ::testing::Contains("grpc.health.v1.Health"));
}

// ---- Tokenize and GetModelInfo -----------------------------------------------------------------

TEST_F(GrpcServerTest, TokenizeBothWays) {
  grpc::ClientContext c1;
  v1::TokenizeRequest req;
  req.set_text("hello é");
  v1::TokenizeResponse resp;
  ASSERT_TRUE(stub_->Tokenize(&c1, req, &resp).ok());
  EXPECT_EQ(std::vector<int32_t>(resp.token_ids().begin(), resp.token_ids().end()),
            tokenizer_.encode("hello é"));

  grpc::ClientContext c2;
  v1::TokenizeRequest back;
  *back.mutable_token_ids() = resp.token_ids();
  ASSERT_TRUE(stub_->Tokenize(&c2, back, &resp).ok());
  EXPECT_EQ(resp.text(), "hello é");

  // Half of "é" (0xC3): replaced, so the reply is valid UTF-8.
  grpc::ClientContext c3;
  v1::TokenizeRequest half;
  half.add_token_ids('a');
  half.add_token_ids(0xC3);
  ASSERT_TRUE(stub_->Tokenize(&c3, half, &resp).ok());
  EXPECT_EQ(resp.text(), "a\xEF\xBF\xBD");

  grpc::ClientContext c4;
  v1::TokenizeRequest bad;
  bad.add_token_ids(9999);
  grpc::Status s = stub_->Tokenize(&c4, bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("token_ids[0] = 9999"));

  grpc::ClientContext c5;
  s = stub_->Tokenize(&c5, v1::TokenizeRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("text"));
}

TEST_F(GrpcServerTest, ModelInfo) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_name(), "toy");
  EXPECT_EQ(info.vocab_size(), kVocab);
  EXPECT_EQ(info.n_layer(), 2);
  EXPECT_EQ(info.n_embd(), 64);
  EXPECT_EQ(info.n_head(), 4);
  EXPECT_EQ(info.context_length(), kContext);
  EXPECT_EQ(info.eos_token_id(), 257);
  EXPECT_EQ(info.tp(), 2);
  EXPECT_EQ(info.pp(), 3);
  EXPECT_EQ(info.dtype(), "fp32");
  EXPECT_EQ(info.kv_blocks_total(), 100);
  EXPECT_EQ(info.kv_blocks_free(), 60);
  EXPECT_EQ(info.kv_block_size(), 16);
  EXPECT_EQ(info.queue_depth(), 2);
  EXPECT_EQ(info.running(), 5);
  EXPECT_EQ(info.requests_served(), 42);
}

TEST(GrpcServerStart, BadAddressIsAnError) {
  FakeSink sink;
  Tokenizer tokenizer = toy_tokenizer();
  EngineInfo info;
  info.model.vocab_size = kVocab;
  info.model.n_positions = kContext;
  GrpcServerOptions options;
  options.address = "256.1.1.1:1";
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::start(options, sink, tokenizer, info);
  EXPECT_FALSE(server.ok());
}

}  // namespace
}  // namespace ltm

namespace ltm {
namespace {

// ---- Hardening: API key, reflection only on request, the automatic message limit --------------

TEST_F(GrpcServerTest, ApiKeyIsRequiredOnEveryCallButHealth) {
  api_key_ = "k3y-for-tests";
  restart();
  auto with_key = [](grpc::ClientContext& ctx, const std::string& key) {
    if (!key.empty()) ctx.AddMetadata("authorization", key);
  };
  for (const std::string& key : {std::string(), std::string("Bearer wrong"),
                                std::string("k3y-for-tests"), std::string("Bearer k3y-for-test")}) {
    grpc::ClientContext c1, c2, c3, c4;
    with_key(c1, key);
    with_key(c2, key);
    with_key(c3, key);
    with_key(c4, key);
    v1::GenerateResponse g;
    EXPECT_EQ(stub_->Generate(&c1, request("hello", 2), &g).error_code(),
              grpc::StatusCode::UNAUTHENTICATED) << key;
    auto reader = stub_->GenerateStream(&c2, request("hello", 2));
    while (reader->Read(&g)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED) << key;
    v1::TokenizeRequest t;
    t.set_text("hi");
    v1::TokenizeResponse tr;
    EXPECT_EQ(stub_->Tokenize(&c3, t, &tr).error_code(), grpc::StatusCode::UNAUTHENTICATED) << key;
    v1::ModelInfo info;
    EXPECT_EQ(stub_->GetModelInfo(&c4, v1::GetModelInfoRequest(), &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED) << key;
  }
  EXPECT_EQ(health(""), 1);  // health needs no key
  grpc::ClientContext ok;
  ok.AddMetadata("authorization", "Bearer k3y-for-tests");
  v1::ModelInfo info;
  EXPECT_TRUE(stub_->GetModelInfo(&ok, v1::GetModelInfoRequest(), &info).ok());
  grpc::ClientContext gen;
  gen.AddMetadata("authorization", "Bearer k3y-for-tests");
  v1::GenerateResponse g;
  EXPECT_TRUE(stub_->Generate(&gen, request("hello", 2), &g).ok());
  EXPECT_EQ(sink_.seen().size(), 1u) << "only the authorised request reached the sink";
}

TEST_F(GrpcServerTest, ReflectionIsOffUnlessAskedFor) {
  reflection_ = false;
  restart();
  std::string reply;
  const grpc::Status s = generic_unary(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
}

TEST_F(GrpcServerTest, AutomaticMessageLimitFitsTheLargestValidRequest) {
  start(0);  // 0: sized from the context and the longest token
  v1::GenerateRequest big;  // a full-context id prompt and every stop string at its limit
  for (int i = 0; i < kContext - 1; ++i) big.add_prompt_token_ids(i % 200);
  big.set_max_new_tokens(1);
  for (int i = 0; i < kMaxStopStrings; ++i) big.add_stop(std::string(kMaxStopBytes, 'z'));
  big.set_request_id(std::string(kMaxRequestIdBytes, 'r'));
  grpc::ClientContext c1;
  set_timeout(c1, 20s);
  v1::GenerateResponse g;
  EXPECT_TRUE(stub_->Generate(&c1, big, &g).ok());
  // 4 MiB of one-byte stop strings: refused by size before anything is parsed.
  v1::GenerateRequest amp;
  amp.set_prompt("hi");
  const std::string one(1, 'x');
  for (int i = 0; i < 1400000; ++i) amp.add_stop()->assign(one);
  grpc::ClientContext c2;
  set_timeout(c2, 20s);
  EXPECT_EQ(stub_->Generate(&c2, amp, &g).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_GT(max_request_bytes(1024, 128), 1023 * 128);
  EXPECT_LT(max_request_bytes(1024, 128), 200 << 10);
}

}  // namespace
}  // namespace ltm
