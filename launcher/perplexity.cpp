#include "launcher/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "launcher/worker_run.h"
#include "runtime/sched/scheduler.h"

namespace ltm {
namespace {

// Accumulates one window's NLL from its prompt-logit rows as they arrive (in position order).
struct WindowScore {
  const int32_t* tokens = nullptr;  // the window's tokens
  int32_t length = 0;
  int32_t next_pos = 0;             // position of the next logit row
  double nll = 0;
  int64_t scored = 0;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string error;
};

void score_rows(WindowScore& w, const std::vector<float>& rows, int64_t V) {
  const int64_t n = static_cast<int64_t>(rows.size()) / V;
  for (int64_t r = 0; r < n; ++r, ++w.next_pos) {
    if (w.next_pos + 1 >= w.length) continue;  // the last position predicts past the window
    const float* row = rows.data() + r * V;
    double mx = row[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    w.nll += mx + std::log(sum) - static_cast<double>(row[w.tokens[w.next_pos + 1]]);
    ++w.scored;
  }
}

}  // namespace

int perplexity_mode(const WorkerOptions& o, RankSetup& rs, const Tokenizer* tokenizer) {
  const ModelConfig& config = rs.model->config();
  if (!tokenizer) {
    std::fprintf(stderr, "ltm-worker: --perplexity needs a tokenizer: %s has no tokenizer.json "
                         "or vocab.json/merges.txt (give --tokenizer DIR)\n", o.model.c_str());
    return 2;
  }
  std::ifstream in(o.perplexity, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "ltm-worker: --perplexity %s: cannot open the file\n", o.perplexity.c_str());
    return 2;
  }
  std::ostringstream text;
  text << in.rdbuf();
  const std::vector<int32_t> ids = tokenizer->encode(text.str());
  for (int32_t id : ids) {
    if (id >= config.vocab_size) {
      std::fprintf(stderr, "ltm-worker: --perplexity: the tokenizer gives id %d, outside the "
                           "model's vocabulary of %lld\n", id, static_cast<long long>(config.vocab_size));
      return 2;
    }
  }
  const int64_t window = o.perplexity_window > 0 ? o.perplexity_window : config.n_positions;
  if (window > config.n_positions || window < 2) {
    std::fprintf(stderr, "ltm-worker: --perplexity-window %lld must be in [2, n_positions = %lld]\n",
                 static_cast<long long>(window), static_cast<long long>(config.n_positions));
    return 2;
  }
  std::vector<WindowScore> windows;
  for (int64_t b = 0; b + 1 < static_cast<int64_t>(ids.size()); b += window) {
    WindowScore w;
    w.tokens = ids.data() + b;
    w.length = static_cast<int32_t>(std::min<int64_t>(window, ids.size() - b));
    if (w.length >= 2) windows.push_back(w);
  }
  if (windows.empty()) {
    std::fprintf(stderr, "ltm-worker: --perplexity %s: %zu tokens; need at least 2\n",
                 o.perplexity.c_str(), ids.size());
    return 2;
  }

  Scheduler scheduler(*rs.engine, tokenizer, config, rs.n_blocks, o.block_size,
                      scheduler_options(o));
  // As many windows at once as the KV cache holds (each needs its tokens + the sampled one).
  const int64_t blocks_per_window = (window + 1 + o.block_size - 1) / o.block_size;
  const size_t at_once = static_cast<size_t>(std::clamp<int64_t>(
      rs.n_blocks / std::max<int64_t>(1, blocks_per_window), 1,
      std::min(o.max_running, o.max_queue)));
  const int64_t V = config.vocab_size;
  for (size_t first = 0; first < windows.size(); first += at_once) {
    const size_t last = std::min(windows.size(), first + at_once);
    for (size_t i = first; i < last; ++i) {
      WindowScore& w = windows[i];
      GenerationRequest req;
      req.request_id = absl::StrCat("perplexity-", i);
      req.prompt_ids.assign(w.tokens, w.tokens + w.length);
      req.max_new_tokens = 1;
      req.ignore_eos = true;
      req.return_prompt_logits = true;
      absl::Status st = scheduler.submit(std::move(req), [&w, V](GenerationEvent ev) {
        if (!ev.prompt_logits.empty()) score_rows(w, ev.prompt_logits, V);
        if (ev.finished) {
          w.finished = true;
          w.reason = ev.finish_reason;
          if (!ev.status.ok()) w.error = ev.status.ToString();
        }
      });
      if (!st.ok()) {
        std::fprintf(stderr, "ltm-worker: --perplexity: window %zu: %s\n", i,
                     std::string(st.message()).c_str());
        return 1;
      }
    }
    scheduler.run_until_idle();
    for (size_t i = first; i < last; ++i) {
      const WindowScore& w = windows[i];
      if (!w.finished || w.reason == FinishReason::kError || w.reason == FinishReason::kCancelled ||
          w.scored != w.length - 1) {
        std::fprintf(stderr, "ltm-worker: --perplexity: window %zu failed (%s; %lld of %d "
                             "positions scored)\n", i,
                     w.error.empty() ? finish_reason_name(w.reason) : w.error.c_str(),
                     static_cast<long long>(w.scored), w.length - 1);
        return 1;
      }
    }
  }
  double nll = 0;
  int64_t scored = 0;
  for (const WindowScore& w : windows) {
    nll += w.nll;
    scored += w.scored;
  }
  const double mean = nll / static_cast<double>(scored);
  const double ppl = std::exp(mean);
  if (o.output == "json") {
    nlohmann::json j;
    j["perplexity"] = ppl;
    j["mean_nll"] = mean;
    j["tokens_scored"] = scored;
    j["tokens"] = ids.size();
    j["windows"] = windows.size();
    j["window"] = window;
    j["method"] = "non-overlapping";
    j["file"] = o.perplexity;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %lld tokens (%zu windows of up to %lld tokens, "
                "non-overlapping; mean NLL %.6f nats)\n",
                ppl, static_cast<long long>(scored), windows.size(),
                static_cast<long long>(window), mean);
  }
  return 0;
}

}  // namespace ltm
