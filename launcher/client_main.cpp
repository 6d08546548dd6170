// ltm-client: a command-line client of the ltm.v1.Generation API (proto/ltm/v1/ltm.proto).
//
//   ltm-client --server HOST:PORT --prompt "Hello" --max-new-tokens 32
//       streams the completion to stdout as it arrives, then a newline; a summary (finish reason,
//       token counts, timings) goes to stderr.
//   ltm-client --server HOST:PORT --prompt-ids 15496,11 --no-stream --logprobs
//   ltm-client --server HOST:PORT --info                 model shape and live load
//   ltm-client --server HOST:PORT --tokenize "Hello"     prints the token ids
//   ltm-client --server HOST:PORT --detokenize 15496,11  prints the text
//
// Exit codes: 0 success; 1 the server answered with an error (printed as CODE: message);
// 2 bad command line (the usage is printed).
#include <grpcpp/grpcpp.h>

#include <boost/program_options.hpp>
#include "common/signals.h"
#include "launcher/cli_parse.h"
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/version.h"
#include "launcher/client_connection.h"
#include "ltm/v1/ltm.grpc.pb.h"

namespace po = boost::program_options;

namespace {

const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN_CODE";
  }
}

int fail(const grpc::Status& status) {
  std::fflush(stdout);
  std::fprintf(stderr, "ltm-client: %s: %s\n", code_name(status.error_code()),
               status.error_message().c_str());
  return 1;
}

// "1,2, 3" -> {1, 2, 3}; nullopt on anything else.
std::optional<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int32_t id;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) return std::nullopt;
    ids.push_back(id);
  }
  return ids;
}

const char* finish_name(ltm::v1::FinishReason r) {
  switch (r) {
    case ltm::v1::FINISH_REASON_LENGTH: return "length";
    case ltm::v1::FINISH_REASON_STOP: return "stop";
    case ltm::v1::FINISH_REASON_EOS: return "eos";
    case ltm::v1::FINISH_REASON_CANCELLED: return "cancelled";
    case ltm::v1::FINISH_REASON_ERROR: return "error";
    default: return "unspecified";
  }
}

void print_summary(const ltm::v1::GenerateResponse& last, const std::vector<int32_t>& ids,
                   const std::vector<float>& logprobs, bool show_logprobs) {
  if (show_logprobs) {
    for (size_t i = 0; i < ids.size(); ++i)
      std::fprintf(stderr, "token %d logprob %.4f\n", ids[i],
                   i < logprobs.size() ? logprobs[i] : 0.0f);
  }
  std::fprintf(stderr,
               "[%s] finish_reason=%s prompt_tokens=%d completion_tokens=%d "
               "time_to_first_token_ms=%.1f total_ms=%.1f\n",
               last.request_id().c_str(), finish_name(last.finish_reason()),
               last.usage().prompt_tokens(), last.usage().completion_tokens(),
               last.timings().time_to_first_token_ms(), last.timings().total_ms());
}

void set_deadline(grpc::ClientContext& ctx, double timeout_s) {
  if (timeout_s > 0)
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
}

}  // namespace

int main(int argc, char** argv) {
  ltm::ignore_sigpipe();  // a vanished peer fails a send, not the process (common/signals.h)
  po::options_description desc(
      "Usage: ltm-client --server HOST:PORT (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
      "       ltm-client --server HOST:PORT --info | --tokenize TEXT | --detokenize 1,2,3\n"
      "Options");
  std::string prompt, prompt_ids_text, tokenize_text, detokenize_text, request_id;
  std::vector<std::string> stop;
  int max_new_tokens = 0, top_k = 0;
  float temperature = 0, top_p = 0, repetition_penalty = 0;
  uint64_t seed = 0;
  double timeout_s = 0;
  bool stream = false, no_stream = false, logprobs = false, info = false, ignore_eos = false;
  std::string adapter;
  ltm::ConnectionOptions conn_opts;
  ltm::add_connection_options(desc, &conn_opts);
  desc.add_options()
      ("help,h", "print this help")
      ("version", "print the version and exit")
      ("prompt", po::value(&prompt), "prompt text")
      ("prompt-ids", po::value(&prompt_ids_text), "prompt as token ids, comma-separated")
      ("max-new-tokens", po::value(&max_new_tokens), "tokens to generate at most (server default 16)")
      ("temperature", po::value(&temperature), "sampling temperature; 0 = greedy (default 1)")
      ("top-k", po::value(&top_k), "keep the k most likely tokens; 0 = off (default)")
      ("top-p", po::value(&top_p), "nucleus sampling mass in (0, 1] (default 1)")
      ("repetition-penalty", po::value(&repetition_penalty), "> 0, 1 = off (default)")
      ("seed", po::value(&seed), "sampling seed (default: the server picks one)")
      ("stop", po::value(&stop)->composing(), "stop string (repeatable)")
      ("ignore-eos", po::bool_switch(&ignore_eos), "keep generating past end-of-text")
      ("adapter", po::value(&adapter), "generate with this loaded LoRA adapter")
      ("request-id", po::value(&request_id), "request id (default: the server makes one)")
      ("stream", po::bool_switch(&stream), "stream tokens as they come (the default)")
      ("no-stream", po::bool_switch(&no_stream), "one unary call, print the result at the end")
      ("logprobs", po::bool_switch(&logprobs), "print each token's id and logprob to stderr")
      ("timeout-s", po::value(&timeout_s), "deadline of each call in seconds (default: none)")
      ("info", po::bool_switch(&info), "print the model and server information")
      ("tokenize", po::value(&tokenize_text), "print the token ids of TEXT")
      ("detokenize", po::value(&detokenize_text), "print the text of comma-separated ids");

  po::variables_map vm;
  try {
    if (ltm::parse_cli(argc, argv, desc, "", "ltm-client", &vm) == ltm::CliStart::kDone)
      return 0;
    if (vm.count("prompt") && vm.count("prompt-ids"))
      throw po::error("give only one of --prompt and --prompt-ids");
    if (stream && no_stream) throw po::error("give only one of --stream and --no-stream");
    if (!vm.count("prompt") && !vm.count("prompt-ids") && !info && !vm.count("tokenize") &&
        !vm.count("detokenize"))
      throw po::error("nothing to do: give --prompt, --prompt-ids, --info, --tokenize or "
                      "--detokenize");
  } catch (const po::error& e) {
    std::cerr << "ltm-client: " << e.what() << "\n\n" << desc << "\n";
    return 2;
  }
  std::vector<int32_t> prompt_ids;
  if (vm.count("prompt-ids")) {
    std::optional<std::vector<int32_t>> ids = parse_ids(prompt_ids_text);
    if (!ids) {
      std::cerr << "ltm-client: --prompt-ids must be comma-separated integers\n\n" << desc << "\n";
      return 2;
    }
    prompt_ids = *ids;
  }
  std::vector<int32_t> detokenize_ids;
  if (vm.count("detokenize")) {
    std::optional<std::vector<int32_t>> ids = parse_ids(detokenize_text);
    if (!ids) {
      std::cerr << "ltm-client: --detokenize must be comma-separated integers\n\n" << desc << "\n";
      return 2;
    }
    detokenize_ids = *ids;
  }

  ltm::Connection conn;
  std::string conn_error;
  if (!ltm::connect(conn_opts, &conn, &conn_error)) {
    std::fprintf(stderr, "ltm-client: %s\n", conn_error.c_str());
    return 2;
  }
  std::unique_ptr<ltm::v1::Generation::Stub> stub = ltm::v1::Generation::NewStub(conn.channel);

  if (info) {
    grpc::ClientContext ctx;
    set_deadline(ctx, timeout_s);
    conn.prepare(ctx);
    ltm::v1::ModelInfo model_info;
    grpc::Status s = stub->GetModelInfo(&ctx, ltm::v1::GetModelInfoRequest(), &model_info);
    if (!s.ok()) return fail(s);
    std::cout << model_info.DebugString() << std::flush;
  }
  if (vm.count("tokenize")) {
    grpc::ClientContext ctx;
    set_deadline(ctx, timeout_s);
    conn.prepare(ctx);
    ltm::v1::TokenizeRequest req;
    req.set_text(tokenize_text);
    ltm::v1::TokenizeResponse resp;
    grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    if (!s.ok()) return fail(s);
    std::cout << absl::StrJoin(resp.token_ids(), ",") << "\n" << std::flush;
  }
  if (vm.count("detokenize")) {
    grpc::ClientContext ctx;
    set_deadline(ctx, timeout_s);
    conn.prepare(ctx);
    ltm::v1::TokenizeRequest req;
    req.mutable_token_ids()->Add(detokenize_ids.begin(), detokenize_ids.end());
    ltm::v1::TokenizeResponse resp;
    grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    if (!s.ok()) return fail(s);
    std::cout << resp.text() << "\n" << std::flush;
  }
  if (!vm.count("prompt") && !vm.count("prompt-ids")) return 0;

  ltm::v1::GenerateRequest req;
  if (vm.count("prompt")) req.set_prompt(prompt);
  req.mutable_prompt_token_ids()->Add(prompt_ids.begin(), prompt_ids.end());
  if (vm.count("max-new-tokens")) req.set_max_new_tokens(max_new_tokens);
  if (vm.count("temperature")) req.set_temperature(temperature);
  if (vm.count("top-k")) req.set_top_k(top_k);
  if (vm.count("top-p")) req.set_top_p(top_p);
  if (vm.count("repetition-penalty")) req.set_repetition_penalty(repetition_penalty);
  if (vm.count("seed")) req.set_seed(seed);
  for (const std::string& s : stop) req.add_stop(s);
  req.set_return_logprobs(logprobs);
  req.set_ignore_eos(ignore_eos);
  req.set_adapter(adapter);
  req.set_request_id(request_id);

  grpc::ClientContext ctx;
  set_deadline(ctx, timeout_s);
  conn.prepare(ctx);
  std::vector<int32_t> ids;
  std::vector<float> lps;
  if (no_stream) {
    ltm::v1::GenerateResponse resp;
    grpc::Status s = stub->Generate(&ctx, req, &resp);
    if (!s.ok()) return fail(s);
    std::fwrite(resp.text().data(), 1, resp.text().size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    ids.assign(resp.token_ids().begin(), resp.token_ids().end());
    lps.assign(resp.logprobs().begin(), resp.logprobs().end());
    print_summary(resp, ids, lps, logprobs);
    return 0;
  }
  std::unique_ptr<grpc::ClientReader<ltm::v1::GenerateResponse>> reader =
      stub->GenerateStream(&ctx, req);
  ltm::v1::GenerateResponse msg, last;
  bool printed = false;
  while (reader->Read(&msg)) {
    std::fwrite(msg.text().data(), 1, msg.text().size(), stdout);
    std::fflush(stdout);
    printed = true;
    ids.insert(ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    lps.insert(lps.end(), msg.logprobs().begin(), msg.logprobs().end());
    last = msg;
  }
  grpc::Status s = reader->Finish();
  if (printed || s.ok()) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (!s.ok()) return fail(s);
  print_summary(last, ids, lps, logprobs);
  return 0;
}
