#include "runtime/spec/proposer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ltm {

const char* spec_mode_name(SpecMode m) {
  switch (m) {
    case SpecMode::kOff: return "off";
    case SpecMode::kNgram: return "ngram";
    case SpecMode::kDraft: return "draft";
  }
  return "off";
}

absl::StatusOr<SpecMode> parse_spec_mode(const std::string& s) {
  if (s == "off") return SpecMode::kOff;
  if (s == "ngram") return SpecMode::kNgram;
  if (s == "draft") return SpecMode::kDraft;
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative must be off, ngram or draft, not '", s, "'"));
}

void Proposer::propose_all(std::span<const DraftRequest> requests) {
  for (const DraftRequest& r : requests) propose(r.tokens, r.n_prompt, r.max_tokens, r.out);
}

void NgramProposer::propose(std::span<const int32_t> tokens, int32_t /*n_prompt*/,
                            int32_t max_tokens, std::vector<int32_t>* out) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return;
  for (int64_t n = std::min<int64_t>(max_ngram_, size - 1); n >= min_ngram_; --n) {
    const std::span<const int32_t> key = tokens.subspan(static_cast<size_t>(size - n));
    // The latest earlier occurrence: start j < size - n (not the suffix itself), scanned from
    // the end; its continuation starts at j + n < size.
    for (int64_t j = size - n - 1; j >= 0; --j) {
      if (tokens[static_cast<size_t>(j + n - 1)] != key[static_cast<size_t>(n - 1)]) continue;
      if (!std::equal(key.begin(), key.end(), tokens.begin() + j)) continue;
      // What followed it; past the end of `tokens` the guess goes on copying itself, so a loop
      // (the suffix repeating with period size - j - n) is continued for all max_tokens.
      const int64_t from = j + n;
      const size_t base = out->size();
      for (int64_t i = 0; i < max_tokens; ++i) {
        const int64_t at = from + i;
        out->push_back(at < size ? tokens[static_cast<size_t>(at)]
                                 : (*out)[base + static_cast<size_t>(at - size)]);
      }
      return;
    }
  }
}

int32_t best_draft_length(double a, double token_cost, int32_t max_tokens, double min_gain) {
  int32_t best = 0;
  double best_rate = 1.0 + min_gain;  // k = 0: one token per step of cost 1
  double yield = 1.0, term = 1.0;
  for (int32_t k = 1; k <= max_tokens; ++k) {
    term *= a;
    yield += term;
    const double rate = yield / (1.0 + token_cost * k);
    if (rate > best_rate * (1.0 + 1e-9)) {
      best = k;
      best_rate = rate;
    }
  }
  return best;
}

int32_t DraftLength::next(double token_cost, bool probe) {
  if (max_tokens_ <= 0) return 0;
  const int32_t k = best_draft_length(acceptance(), token_cost, max_tokens_, kMinGain);
  if (k > 0) {
    idle_ = 0;
    return k;
  }
  // Where the rows are so dear that even drafts that are mostly right would not pay (a large
  // batch), a probe is a row of pure cost for every sequence (every kProbeEvery steps, ~10% of a
  // 16-sequence step of GPT-2-124M on two cores): probe kRareProbe times less often there, which
  // still lets the measured cost see steps with drafts and follow a change.
  const bool dear = best_draft_length(kProbeAcceptance, token_cost, max_tokens_) == 0;
  if (!probe && !dear) return 0;  // the observed guesses tell what a probe would
  if (++idle_ >= (dear ? kRareProbe * kProbeEvery : kProbeEvery)) {
    idle_ = 0;
    return 1;
  }
  return 0;
}

void DraftLength::observe(int32_t proposed, int32_t accepted, double decay) {
  if (proposed <= 0) return;
  accepted_ = accepted_ * decay + accepted;
  examined_ = examined_ * decay + std::min(accepted + 1, proposed);
}

void DraftLength::observe_guess(std::span<const int32_t> guess, std::span<const int32_t> actual) {
  const size_t compared = std::min(guess.size(), actual.size());
  observe(static_cast<int32_t>(compared), accepted_prefix(guess.first(compared), actual),
          kGuessDecay);
}

int32_t accepted_prefix(std::span<const int32_t> drafts, std::span<const int32_t> sampled) {
  int32_t n = 0;
  while (static_cast<size_t>(n) < drafts.size() && sampled[static_cast<size_t>(n)] == drafts[n]) ++n;
  return n;
}

}  // namespace ltm
