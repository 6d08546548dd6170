// ltm-worker --perplexity FILE: the model's perplexity on a text file (one-shot mode, rank 0).
//
// Method (non-overlapping windows): FILE is tokenized whole with the model's tokenizer; the
// tokens are cut into consecutive windows of W tokens (W = --perplexity-window, default the
// model's context n_positions; the last window may be shorter and is kept when it has 2 tokens or
// more). Each window is run as one prompt from an empty cache, and in it token j (j >= 1) is
// scored by the logits at position j-1: NLL = logsumexp(logits) - logits[token j], in double.
// So every token but the first of each window is scored, with the context of the earlier tokens
// of its window only; perplexity = exp(sum NLL / tokens scored). Windows go through the scheduler
// (batched as the KV cache allows), so every layout (--tp, --pp) and dtype is measured as served.
//
// Prints "perplexity P over N tokens (W windows of up to T tokens, non-overlapping)" or, with
// --output json, one JSON line {"perplexity", "mean_nll", "tokens_scored", "tokens", "windows",
// "window", "file"}.
#pragma once

#include "launcher/model_setup.h"
#include "launcher/worker_options.h"
#include "runtime/text/tokenizer.h"

namespace ltm {

// Returns the exit code (0, 1 runtime failure, 2 bad input such as an unreadable or too short
// file, or no tokenizer).
int perplexity_mode(const WorkerOptions& o, RankSetup& rs, const Tokenizer* tokenizer);

}  // namespace ltm
