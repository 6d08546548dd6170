// GrpcServer against a fake engine (tests/serve/grpc_server_fixture.h): draining, shutdown,
// health and reflection, Tokenize and GetModelInfo, and the hardening options (API key,
// reflection only on request, the automatic message limit).
#include "tests/serve/grpc_server_fixture.h"

namespace ltm {
namespace {

using namespace grpc_test;  // NOLINT: the fixture, FakeSink, toy_tokenizer, kVocab ...

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
  EXPECT_EQ(info.kv_blocks_cached(), 9);
  EXPECT_EQ(info.kv_block_size(), 16);
  EXPECT_EQ(info.queue_depth(), 2);
  EXPECT_EQ(info.running(), 5);
  EXPECT_EQ(info.requests_served(), 42);
}

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
