#include "launcher/step_cost.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/json_parse.h"

#include "runtime/spec/proposer.h"
#include "runtime/spec/replay.h"

namespace ltm {

namespace {

// One step of `seqs` sequences of `rows` new tokens each, every sequence's context `context`
// tokens before it, every row sampled greedily (a verify step's rows are: speculation's greedy
// case). Sequence s holds blocks [s * per_seq, (s + 1) * per_seq).
StepPlan make_plan(int32_t seqs, int32_t rows, int32_t context, int32_t block_size,
                   int32_t per_seq, int32_t vocab) {
  StepPlan plan;
  StepInput& in = plan.input;
  in.max_blocks_per_seq = per_seq;
  in.token_offsets.push_back(0);
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t pos = context + i;
      in.token_ids.push_back((pos * 7919 + 13 + s * 104729) % vocab);
      in.positions.push_back(pos);
      in.slot_mapping.push_back((s * per_seq + pos / block_size) * block_size + pos % block_size);
      in.logit_rows.push_back(in.n_tokens() - 1);
      RowSampling rs;
      rs.params.temperature = 0;
      rs.token_index = i;
      rs.want_logprob = false;
      plan.sampling.push_back(rs);
    }
    in.token_offsets.push_back(in.n_tokens());
    in.context_lens.push_back(context + rows);
    in.adapter_ids.push_back(0);
    for (int32_t b = 0; b < per_seq; ++b) in.block_tables.push_back(s * per_seq + b);
  }
  return plan;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// A run to replay: its file, prompt and output.
struct ReplayRun {
  std::string path;
  std::vector<int32_t> prompt, output;
};

// The --step-cost-replay files, read before anything is measured. False (and a message naming
// the file) for one that is unreadable, not JSON, or without the two id lists.
bool read_runs(const std::vector<std::string>& paths, std::vector<ReplayRun>* runs) {
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    std::string why = in ? "" : "it cannot be read";
    if (why.empty()) {
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      absl::StatusOr<nlohmann::json> j = parse_json(text);
      try {
        if (!j.ok()) throw std::runtime_error(std::string(j.status().message()));
        runs->push_back({path, j->at("prompt_ids").get<std::vector<int32_t>>(),
                         j->at("generated_ids").get<std::vector<int32_t>>()});
      } catch (const std::exception& e) {  // not JSON, or without the two id lists
        why = e.what();
      }
    }
    if (!why.empty()) {
      std::fprintf(stderr, "ltm-bench: --step-cost-replay %s: not an ltm-worker --output json "
                   "file with prompt_ids and generated_ids (%s)\n", path.c_str(), why.c_str());
      return false;
    }
  }
  return true;
}

// Each run replayed at the step costs (ratio[r - 1]: r rows over one).
void replay_runs(const StepCostOptions& o, const std::vector<ReplayRun>& runs,
                 const std::vector<double>& ratio, double token_cost) {
  const int32_t k = std::min<int32_t>(SpecOptions{}.max_tokens, o.max_rows - 1);
  for (const ReplayRun& run : runs) {
    const ReplayResult oracle =
        replay_ngram(run.prompt, run.output, ratio, k, ReplayPolicy::kOracle, token_cost);
    const ReplayResult length =
        replay_ngram(run.prompt, run.output, ratio, k, ReplayPolicy::kDraftLength, token_cost);
    const ReplayResult drafted =
        replay_ngram(run.prompt, run.output, ratio, k, ReplayPolicy::kDraftedOnly, token_cost);
    if (o.json) {
      std::printf("%s\n", nlohmann::json{{"measurement", "spec_replay"}, {"file", run.path},
                                         {"max_drafts", k}, {"oracle_speedup", oracle.speedup},
                                         {"draft_length_speedup", length.speedup},
                                         {"draft_length_accepted", length.accepted},
                                         {"draft_length_proposed", length.proposed},
                                         {"drafted_only_speedup", drafted.speedup}}
                               .dump()
                               .c_str());
    } else {
      std::printf("replay %s (%zu tokens, at most %d drafts): oracle x%.3f, DraftLength x%.3f "
                  "(%lld of %lld drafts accepted; learning from its drafts alone x%.3f)\n",
                  run.path.c_str(), run.output.size(), k, oracle.speedup, length.speedup,
                  static_cast<long long>(length.accepted), static_cast<long long>(length.proposed),
                  drafted.speedup);
    }
  }
}

}  // namespace

int run_step_cost(RankSetup& rs, int32_t block_size, const StepCostOptions& o) {
  const ModelConfig& c = rs.model->config();
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  const int32_t per_seq = (o.context + o.max_rows + block_size - 1) / block_size;
  const int32_t seqs_max = o.batch ? o.max_rows : 1;
  if (o.context < 1 || o.max_rows < 1 || o.context + o.max_rows > c.n_positions ||
      per_seq * seqs_max > rs.n_blocks) {
    std::fprintf(stderr, "ltm-bench: --step-cost: a context of %d plus %d rows (x %d sequences) "
                 "does not fit the model's %lld positions or the %d KV blocks\n",
                 o.context, o.max_rows, seqs_max, static_cast<long long>(c.n_positions),
                 rs.n_blocks);
    return 2;
  }
  std::vector<ReplayRun> runs;
  if (!read_runs(o.replay, &runs)) return 2;
  // The cache's contents do not matter to the time: fill the context once with a prefill.
  for (int32_t s = 0; s < seqs_max; ++s) {
    StepPlan fill = make_plan(1, o.context, 0, block_size, per_seq, vocab);
    for (int32_t& slot : fill.input.slot_mapping) slot += s * per_seq * block_size;
    for (int32_t& b : fill.input.block_tables) b += s * per_seq;
    fill.input.logit_rows = {o.context - 1};
    fill.sampling.resize(1);
    rs.engine->step(fill);
  }
  // kinds: rows r of one sequence (a verify step of r - 1 drafts), and with --batch r sequences
  // of one row (a decode batch).
  struct Kind {
    int32_t seqs, rows;
    StepPlan plan;
    std::vector<double> s;
  };
  std::vector<Kind> kinds;
  for (int32_t r = 1; r <= o.max_rows; ++r)
    kinds.push_back({1, r, make_plan(1, r, o.context, block_size, per_seq, vocab), {}});
  if (o.batch)
    for (int32_t r = 2; r <= o.max_rows; ++r)
      kinds.push_back({r, 1, make_plan(r, 1, o.context, block_size, per_seq, vocab), {}});
  for (int32_t round = -3; round < o.rounds; ++round) {  // 3 warm-up rounds
    for (size_t i = 0; i < kinds.size(); ++i) {
      Kind& k = kinds[(i + static_cast<size_t>(std::max(round, 0))) % kinds.size()];
      const auto t0 = std::chrono::steady_clock::now();
      rs.engine->step(k.plan);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (round >= 0) k.s.push_back(s);
    }
  }
  const double t1 = median(kinds[0].s);
  std::vector<double> costs, ratio;  // ratio[r - 1]: one sequence's r rows over one row
  for (const Kind& k : kinds) {
    const double t = median(k.s);
    if (k.seqs == 1) ratio.push_back(t / t1);
    const int32_t total = k.seqs * k.rows;
    const double cost = total > 1 ? (t / t1 - 1) / (total - 1) : 0;
    if (k.seqs == 1 && total > 1) costs.push_back(cost);
    if (o.json) {
      std::printf("%s\n", nlohmann::json{{"measurement", "step_cost"}, {"sequences", k.seqs},
                                         {"rows_per_sequence", k.rows}, {"context", o.context},
                                         {"median_us", 1e6 * t}, {"ratio_to_one_row", t / t1},
                                         {"cost_per_extra_row", cost}}.dump().c_str());
    } else {
      std::printf("%2d sequence(s) x %d row(s): median %8.1f us  x%.2f of one row  (+%.3f a row)\n",
                  k.seqs, k.rows, 1e6 * t, t / t1, cost);
    }
  }
  const double token_cost = median(costs);
  if (o.json)
    std::printf("%s\n", nlohmann::json{{"measurement", "token_cost"}, {"value", token_cost}}.dump().c_str());
  else
    std::printf("token_cost (median over rows of one sequence): %.3f\n", token_cost);
  replay_runs(o, runs, ratio, token_cost);
  return 0;
}

}  // namespace ltm
