// Request validation from raw protobuf bytes, as the server runs it (runtime/serve/grpc_server.cpp):
// the wire precheck, the typed parse, then make_generation_request with the real GPT-2 tokenizer.
// Whatever the bytes, the answer is a status or a request within the limits.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_tokenizer.h"
#include "ltm/v1/ltm.pb.h"
#include "runtime/serve/request_validation.h"
#include "runtime/serve/wire_precheck.h"
#include "runtime/text/tokenizer.h"

namespace {
constexpr int64_t kContext = 256;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ltm::Tokenizer& tok = ltm::fuzz::gpt2_tokenizer();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ltm::RequestLimits limits;
  limits.context_length = kContext;
  limits.vocab_size = tok.vocab_size();
  limits.max_prompt_bytes = (kContext - 1) * 128;
  ltm::PrecheckLimits wire;
  wire.fields = {{1, -1, limits.max_prompt_bytes, "bytes"}, {2, kContext - 1, -1, "ids"},
                 {9, ltm::kMaxStopStrings, static_cast<int64_t>(ltm::kMaxStopBytes), "strings"},
                 {11, -1, static_cast<int64_t>(ltm::kMaxRequestIdBytes), "bytes"}};
  if (!ltm::precheck_message(bytes, *ltm::v1::GenerateRequest::descriptor(), wire).ok()) return 0;
  ltm::v1::GenerateRequest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (proto.stop_size() > ltm::kMaxStopStrings || proto.prompt_token_ids_size() >= kContext)
    std::abort();  // the precheck let through what it must refuse
  absl::StatusOr<ltm::GenerationRequest> r = ltm::make_generation_request(proto, tok, limits);
  if (!r.ok()) return 0;
  const int64_t n = static_cast<int64_t>(r->prompt_ids.size());
  if (n < 1 || n + r->max_new_tokens > kContext) std::abort();
  for (int32_t id : r->prompt_ids)
    if (!tok.valid_id(id)) std::abort();
  return 0;
}
