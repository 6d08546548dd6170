// The step plan: what rank 0 sends to every rank before each forward step, and its wire
// encoding (a flat little-endian byte string; every rank runs the same binary).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/step_input.h"
#include "runtime/sampling/sampler.h"

namespace ltm {

// How to sample one logit row. The random stream of a request's n-th token is a pure function
// of (seed, n), so any rank can sample it and a preempted, recomputed sequence draws the same.
struct RowSampling {
  SamplingParams params;
  int32_t token_index = 0;        // tokens generated before this one
  std::vector<int32_t> history;   // prompt + generated ids; sent only when repetition_penalty != 1
  bool want_logprob = true;       // false: a greedy row skips the softmax normalizer (sample())
  // >= 0: a scoring row (a prompt position whose logprobs are asked for): nothing is sampled,
  // the row's result is this token, the next prompt token, with its logprob.
  int32_t target = -1;
  // >= 0: also this row's RowLogprobs (raw model distribution, runtime/sampling/sampler.h) with
  // the top_n best alternatives, at most kMaxTopLogprobs; reduced on the last stage, so rank 0
  // receives O(top_n) per row whatever the vocabulary.
  int32_t top_n = -1;
};

// kKeepAlive: nothing to run; rank 0 sends one every --keepalive-s while idle so that the other
// ranks can tell an idle coordinator from a stuck one (Engine::set_idle_timeout).
// kLoadAdapter / kUnloadAdapter: every rank loads (reads its slices of the PEFT folder at
// adapter_dir) or frees the LoRA adapter adapter_id; rank 0 sends them between steps, so every
// later step that names the id finds it loaded (plans reach a rank in the order they were sent).
enum class PlanKind : int32_t {
  kStep = 1,
  kShutdown = 2,
  kKeepAlive = 3,
  kLoadAdapter = 4,
  kUnloadAdapter = 5
};

struct StepPlan {
  PlanKind kind = PlanKind::kStep;
  StepInput input;
  std::vector<RowSampling> sampling;  // one per input.logit_rows entry
  bool want_logits = false;           // send the full logits of every logit row back to rank 0
  // kLoadAdapter / kUnloadAdapter
  int32_t adapter_id = 0;
  std::string adapter_dir;            // kLoadAdapter: the folder, the same path on every rank
  int32_t adapter_max_rank = 0;       // kLoadAdapter: --lora-max-rank
};

std::string encode_plan(const StepPlan& plan);
// Decodes what encode_plan wrote; DataLoss on a malformed buffer (a bug or a version mismatch).
absl::StatusOr<StepPlan> decode_plan(const std::string& bytes);

}  // namespace ltm
