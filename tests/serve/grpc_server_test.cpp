// GrpcServer against a fake engine (tests/serve/grpc_server_fixture.h) over loopback: results,
// errors and their codes, cancellation and deadlines reaching the engine. Drain, shutdown,
// health, reflection, Tokenize, GetModelInfo and the hardening options:
// grpc_server_lifecycle_test.cpp.
#include "tests/serve/grpc_server_fixture.h"

namespace ltm {
namespace {

using namespace grpc_test;  // NOLINT: the fixture, FakeSink, toy_tokenizer, kVocab ...

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
