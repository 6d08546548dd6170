// A generation request as the engine sees it, and the events it sends back.
//
// The coordinator (gRPC, rank 0) validates a request, turns it into a GenerationRequest and hands
// it to a RequestSink (the scheduler). The sink calls `on_event` from its step thread, zero or more
// times with new tokens and exactly once with `finished = true` (whatever happens: done, stopped,
// cancelled, error, shutdown). `on_event` must not block for long: it only queues the event for the
// RPC's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/sampling/sampler.h"

namespace ltm {

enum class FinishReason { kNone, kLength, kStop, kEos, kCancelled, kError };
const char* finish_reason_name(FinishReason r);

// Shared between the RPC thread (sets) and the step thread (polls once per step).
struct CancelFlag {
  std::atomic<bool> cancelled{false};
};

struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt_ids;   // non-empty, every id < vocab_size
  int32_t max_new_tokens = 16;       // >= 1, prompt + max_new_tokens <= context length
  SamplingParams sampling;
  std::vector<std::string> stop;     // valid UTF-8, non-empty strings
  bool return_logprobs = false;
  // OpenAI `logprobs` (HTTP): every new token's logprob under the raw model distribution and its
  // best `logprob_alternatives` alternatives (0..kMaxTopLogprobs; -1: none), reduced on the last
  // stage. With score_prompt (OpenAI `echo`) the prompt tokens too, from the second one on.
  int32_t logprob_alternatives = -1;
  bool score_prompt = false;
  bool ignore_eos = false;
  // More ids that end generation as the model's eos_token_id does (finish kEos, their text never
  // emitted): generation_config.json's eos ids, a chat template's end-of-turn token. Few (a
  // linear scan per token); ignore_eos disregards them too.
  std::vector<int32_t> end_ids;
  // The LoRA adapter to run with (a name the scheduler has loaded); empty: the base model.
  std::string adapter;
  // For the one-shot command's --dump-logits / --dump-prompt-logits (never set by the server):
  // the full-vocab logits each new token was sampled from, and those of every prompt position.
  bool return_full_logits = false;
  bool return_prompt_logits = false;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::shared_ptr<CancelFlag> cancel = std::make_shared<CancelFlag>();
};

struct GenerationEvent {
  std::vector<int32_t> token_ids;  // tokens new since the previous event
  std::vector<float> logprobs;     // one per token when asked
  std::string text;                // text new since the previous event: always whole UTF-8 characters
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  // Why a request ended early, with its kind as the status code: kError carries Unavailable
  // (the engine or group is gone: retry elsewhere) or Internal (this request failed); kCancelled
  // carries Unavailable when a shutdown cut it, OK when its client or deadline did.
  absl::Status status;
  int32_t prompt_tokens = 0;       // usage, filled on the final event
  int32_t completion_tokens = 0;
  double time_to_first_token_s = 0;  // on the final event
  double total_time_s = 0;
  // Speculative decoding, on the final event: drafts the model verified for this request, and
  // how many of them it accepted (0 and 0 without speculation).
  int64_t spec_proposed_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<float> full_logits;    // [token_ids.size(), vocab] with return_full_logits
  std::vector<float> prompt_logits;  // [n, vocab] for the next n prompt positions
  // With logprob_alternatives >= 0: one per token_ids entry.
  std::vector<RowLogprobs> token_logprobs;
  // With score_prompt: the next prompt tokens' (from the second on, each exactly once, whatever
  // preemption recomputes).
  std::vector<RowLogprobs> prompt_logprobs;
};

using EventCallback = std::function<void(GenerationEvent)>;

class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // Queues a validated request. ResourceExhausted when the queue is full, Unavailable when the
  // engine is shutting down or failed; in those cases `on_event` is never called.
  virtual absl::Status submit(GenerationRequest request, EventCallback on_event) = 0;
};

}  // namespace ltm
