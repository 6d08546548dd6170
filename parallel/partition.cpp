#include "parallel/partition.h"

#include <algorithm>
#include <cmath>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ltm::parallel {
namespace {

// Even split of [0, n) into `parts` contiguous ranges, the first n % parts one longer.
Range split(int64_t n, int parts, int part) {
  const int64_t base = n / parts;
  const int64_t extra = n % parts;
  const int64_t begin = part * base + (part < extra ? part : extra);
  return Range{begin, begin + base + (part < extra ? 1 : 0)};
}

// "1, 2, 4, 8": the divisors of n up to `limit`, for messages that suggest a valid --tp.
std::string divisors(int64_t n, int64_t limit) {
  std::string out;
  for (int64_t d = 1; d <= n && d <= limit; ++d) {
    if (n % d == 0) absl::StrAppend(&out, out.empty() ? "" : ", ", d);
  }
  return out;
}

const char* plural(int64_t n, const char* one, const char* many) { return n == 1 ? one : many; }

}  // namespace

Range balanced_layer_range(int64_t n_layer, int pp, int pp_rank, double head_layers) {
  LTM_ASSERT(pp >= 1 && pp <= n_layer, "pp ", pp, " n_layer ", n_layer);
  LTM_ASSERT(pp_rank >= 0 && pp_rank < pp, "pp_rank ", pp_rank, " of ", pp);
  LTM_ASSERT(head_layers >= 0, "head_layers ", head_layers);
  if (pp == 1) return {0, n_layer};
  // The last stage's share is next to `ideal`; of the two neighbours take the one whose slowest
  // stage is faster (ties: fewer layers on the last stage, as layer_range does).
  const double ideal = (static_cast<double>(n_layer) + head_layers) / pp - head_layers;
  auto slowest = [&](int64_t last) {
    const int64_t others = (n_layer - last + pp - 2) / (pp - 1);  // largest of the other stages
    return std::max(static_cast<double>(last) + head_layers, static_cast<double>(others));
  };
  auto valid = [&](int64_t last) { return std::clamp<int64_t>(last, 1, n_layer - (pp - 1)); };
  const int64_t low = valid(static_cast<int64_t>(std::floor(std::max(ideal, 0.0))));
  const int64_t high = valid(low + 1);
  const int64_t last = slowest(high) < slowest(low) ? high : low;
  if (pp_rank == pp - 1) return {n_layer - last, n_layer};
  return split(n_layer - last, pp - 1, pp_rank);
}

Range layer_range(int64_t n_layer, int pp, int pp_rank) {
  LTM_ASSERT(pp >= 1 && pp <= n_layer, "pp ", pp, " n_layer ", n_layer);
  LTM_ASSERT(pp_rank >= 0 && pp_rank < pp, "pp_rank ", pp_rank, " of ", pp);
  return split(n_layer, pp, pp_rank);
}

Range head_range(int64_t n_head, int tp, int tp_rank) {
  LTM_ASSERT(tp >= 1 && n_head % tp == 0, "n_head ", n_head, " tp ", tp);
  LTM_ASSERT(tp_rank >= 0 && tp_rank < tp, "tp_rank ", tp_rank, " of ", tp);
  return split(n_head, tp, tp_rank);
}

int64_t padded_vocab(int64_t vocab, int tp) {
  LTM_ASSERT(tp >= 1 && vocab >= 0, "vocab ", vocab, " tp ", tp);
  return (vocab + tp - 1) / tp * tp;
}

Range vocab_range(int64_t vocab, int tp, int tp_rank) {
  LTM_ASSERT(tp_rank >= 0 && tp_rank < tp, "tp_rank ", tp_rank, " of ", tp);
  const int64_t rows = padded_vocab(vocab, tp) / tp;
  return Range{tp_rank * rows, (tp_rank + 1) * rows};
}

int64_t valid_rows(Range rows, int64_t vocab) {
  if (rows.begin >= vocab) return 0;
  return (rows.end < vocab ? rows.end : vocab) - rows.begin;
}

Range ffn_range(int64_t d_ff, int tp, int tp_rank) {
  LTM_ASSERT(tp >= 1 && d_ff % tp == 0, "d_ff ", d_ff, " tp ", tp);
  LTM_ASSERT(tp_rank >= 0 && tp_rank < tp, "tp_rank ", tp_rank, " of ", tp);
  return split(d_ff, tp, tp_rank);
}

absl::Status validate_world(int world_size, int tp, int pp) {
  if (tp < 1)
    return absl::InvalidArgumentError(absl::StrCat("--tp must be at least 1 (got ", tp, ")"));
  if (pp < 1)
    return absl::InvalidArgumentError(absl::StrCat("--pp must be at least 1 (got ", pp, ")"));
  if (static_cast<int64_t>(tp) * pp != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("mpirun started ", world_size, plural(world_size, " rank", " ranks"),
                     " but --tp ", tp, " x --pp ", pp, " needs ", static_cast<int64_t>(tp) * pp));
  }
  return absl::OkStatus();
}

absl::Status validate_layout(int world_size, int tp, int pp, int64_t n_head, int64_t n_layer,
                             int64_t d_ff) {
  LTM_RETURN_IF_ERROR(validate_world(world_size, tp, pp));
  if (n_head < 1 || n_layer < 1 || d_ff < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the model config has n_head ", n_head,
                                                   ", n_layer ", n_layer, ", d_ff ", d_ff,
                                                   "; each must be at least 1"));
  }
  if (n_head % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", tp, " does not divide the model's ", n_head, " attention heads (n_head ", n_head,
        " % tp ", tp, " = ", n_head % tp, "); --tp values that fit: ", divisors(n_head, 4096)));
  }
  if (d_ff % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tp ", tp,
                                                   " does not divide the model's FFN width d_ff ",
                                                   d_ff, " (d_ff % tp = ", d_ff % tp, ")"));
  }
  if (pp > n_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pp ", pp, " is more than the model's ", n_layer, plural(n_layer, " layer", " layers"),
        "; every pipeline stage needs at least one layer, so use --pp ", n_layer, " or less"));
  }
  return absl::OkStatus();
}

absl::Status validate_layout(int world_size, int tp, int pp, int64_t n_head, int64_t n_kv_head,
                             int64_t n_layer, int64_t d_ff) {
  LTM_RETURN_IF_ERROR(validate_layout(world_size, tp, pp, n_head, n_layer, d_ff));
  if (n_kv_head < 1 || n_head % n_kv_head != 0)
    return absl::InvalidArgumentError(absl::StrCat("the model has ", n_kv_head,
                                                   " KV heads, which does not divide its ",
                                                   n_head, " attention heads"));
  if (n_kv_head % tp != 0 && tp % n_kv_head != 0) {
    std::string fit;
    for (int64_t t = 1; t <= n_head && t <= 4096; ++t)
      if (n_head % t == 0 && (n_kv_head % t == 0 || t % n_kv_head == 0))
        absl::StrAppend(&fit, fit.empty() ? "" : ", ", t);
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", tp, " neither divides the model's ", n_kv_head, " KV heads nor is a multiple of "
        "them (grouped-query attention splits or replicates whole KV heads); --tp values that "
        "fit: ", fit));
  }
  return absl::OkStatus();
}

Range kv_head_range(int64_t n_kv_head, int tp, int tp_rank) {
  LTM_ASSERT(tp >= 1 && n_kv_head >= 1 && (n_kv_head % tp == 0 || tp % n_kv_head == 0),
             "n_kv_head ", n_kv_head, " tp ", tp);
  LTM_ASSERT(tp_rank >= 0 && tp_rank < tp, "tp_rank ", tp_rank, " of ", tp);
  if (n_kv_head % tp == 0) return split(n_kv_head, tp, tp_rank);
  const int64_t head = tp_rank / (tp / n_kv_head);
  return Range{head, head + 1};
}

double lm_head_layers(int64_t vocab_size, int64_t n_embd) {
  return static_cast<double>(vocab_size) / (12.0 * static_cast<double>(n_embd)) /
         kLayerOverHeadCost;
}

Range stage_layers(int64_t n_layer, int64_t vocab_size, int64_t n_embd, int pp, int pp_rank) {
  return balanced_layer_range(n_layer, pp, pp_rank, lm_head_layers(vocab_size, n_embd));
}

int64_t max_stage_layers(int64_t n_layer, int64_t vocab_size, int64_t n_embd, int pp) {
  int64_t most = 0;
  for (int stage = 0; stage < pp; ++stage)
    most = std::max(most, stage_layers(n_layer, vocab_size, n_embd, pp, stage).size());
  return most;
}

}  // namespace ltm::parallel
