// The fake engine and the fixture of the GrpcServer tests (grpc_server_test.cpp,
// grpc_server_lifecycle_test.cpp): a RequestSink that "generates" deterministic tokens on
// its own thread, one per step, and a server on loopback with a stub to call it.
#pragma once

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

namespace ltm::grpc_test {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
// ---- A toy tokenizer: 256 byte tokens + 2 merges (no files) ----------------------------------

using testing_vocab::byte_spelling;

inline Tokenizer toy_tokenizer() {
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
      s.kv_blocks_cached = 9;
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

inline std::string concat_text(const std::vector<v1::GenerateResponse>& ms) {
  std::string s;
  for (const auto& m : ms) s += m.text();
  return s;
}

}  // namespace ltm::grpc_test
