#include "runtime/serve/grpc_server.h"

#include "runtime/serve/grpc_calls.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "ltm/v1/ltm.grpc.pb.h"
#include "runtime/serve/auth.h"
#include "runtime/serve/front_door.h"
#include "spdlog/spdlog.h"

namespace ltm {

namespace {

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

}  // namespace

namespace grpc_server_internal {

class Service final
    : public v1::Generation::WithRawCallbackMethod_Generate<
          v1::Generation::WithRawCallbackMethod_GenerateStream<
          v1::Generation::WithRawCallbackMethod_Chat<
          v1::Generation::WithRawCallbackMethod_ChatStream<
              v1::Generation::WithRawCallbackMethod_Tokenize<
                  v1::Generation::WithCallbackMethod_GetModelInfo<
                      v1::Generation::WithCallbackMethod_LoadAdapter<
                          v1::Generation::WithCallbackMethod_UnloadAdapter<
                              v1::Generation::WithCallbackMethod_ListAdapters<
                                  v1::Generation::Service>>>>>>>>> {
 public:
  explicit Service(std::shared_ptr<State> state) : state_(std::move(state)) {}

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    return start_unary_generation(state_, ctx, *request, response);
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override {
    return start_stream_generation(state_, ctx, *request);
  }

  grpc::ServerUnaryReactor* Chat(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    return start_unary_generation(state_, ctx, *request, response, /*chat=*/true);
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* ChatStream(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override {
    return start_stream_generation(state_, ctx, *request, /*chat=*/true);
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
  // Chat: a message costs at least a token of the prompt; the rest as GenerateRequest's.
  state->chat_wire.fields = {
      {v1::ChatRequest::kMessagesFieldNumber, info.max_context(), -1, "messages"},
      {v1::ChatRequest::kStopFieldNumber, kMaxStopStrings, static_cast<int64_t>(kMaxStopBytes),
       "strings"},
      {v1::ChatRequest::kRequestIdFieldNumber, -1, static_cast<int64_t>(kMaxRequestIdBytes),
       "bytes"},
      {v1::ChatRequest::kAdapterFieldNumber, -1, static_cast<int64_t>(kMaxAdapterFieldBytes),
       "bytes"}};
  state->chat = options.chat;

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
