// FakeEngine: a StepEngine for the scheduler's tests, with a toy "model" whose output depends on
// what the KV cache holds, so that a plan that reads the wrong blocks gives the wrong tokens.
//
// The fake KV cache holds one 64-bit value per slot. The value at a sequence's position p is
//     kv(p) = mix(kv(p - 1), token_p, p, adapter)      kv(-1) = a constant
// where kv(p - 1) is read through the plan's block table (or is the chunk's previous row), as a
// real model's K/V at p depend on every token up to p and the adapter. A logit row at position p
// samples kv(p) mod vocab. expected_tokens() computes the same from a token list, with no cache.
// Every read of a slot never written, or written by another chain, is recorded in errors(); so is
// a plan that writes a slot another sequence of the same plan reads (a shared block written), or
// that names an adapter id not loaded. Plans are recorded whole (plans()); each is computed at
// submit() and its output queued until collect(), so the scheduler can hold several in flight.
// Threading: the scheduler's step thread, and the test's thread only while the step thread is
// not running.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/engine/step_engine.h"

namespace ltm {

class FakeEngine final : public StepEngine {
 public:
  static constexpr uint64_t kStart = 0x5eed5eed5eed5eedull;

  FakeEngine(int32_t vocab, int32_t n_blocks, int32_t block_size)
      : vocab_(vocab), block_size_(block_size),
        slots_(static_cast<size_t>(n_blocks) * block_size, kEmpty) {}

  static uint64_t mix(uint64_t prev, int32_t token, int32_t pos, int32_t adapter) {
    uint64_t x = prev ^ (0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(token) + 1));
    x ^= static_cast<uint64_t>(pos) << 32 ^ static_cast<uint64_t>(adapter) * 0xc2b2ae3d27d4eb4full;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (x ^ (x >> 31)) & ~kEmpty;  // never the empty mark
  }
  int32_t token_of(uint64_t kv) const { return static_cast<int32_t>(kv % vocab_); }

  // The greedy continuation of `prompt` by this fake model: n tokens (the adapter as its id).
  std::vector<int32_t> expected_tokens(std::vector<int32_t> prompt, int n, int32_t adapter = 0,
                                       int32_t eos = -1) const {
    std::vector<int32_t> out;
    uint64_t kv = kStart;
    size_t p = 0;
    while (static_cast<int>(out.size()) < n) {
      for (; p < prompt.size(); ++p) kv = mix(kv, prompt[p], static_cast<int32_t>(p), adapter);
      const int32_t t = token_of(kv);
      out.push_back(t);
      prompt.push_back(t);
      if (t == eos) break;
    }
    return out;
  }

  // ---- StepEngine ----
  void submit(const StepPlan& plan) override {
    plans_.push_back(plan);
    StepOutput out = compute(plan);
    if (on_step) on_step(plan, out);
    pending_.push_back(std::move(out));
    max_in_flight_ = std::max(max_in_flight_, in_flight());
  }
  StepOutput collect() override {
    if (pending_.empty()) {
      errors_.push_back("collect() with nothing in flight");
      return {};
    }
    if (before_collect) before_collect();
    StepOutput out = std::move(pending_.front());
    pending_.pop_front();
    return out;
  }
  int in_flight() const override { return static_cast<int>(pending_.size()); }
  absl::Status load_adapter(int32_t id, const std::string& dir, int max_rank,
                            LoraSummary* summary) override {
    if (dir.find("bad") != std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("fake: cannot load ", dir));
    if (loaded_.count(id) || id <= 0) errors_.push_back(absl::StrCat("adapter id reused: ", id));
    loaded_.insert(id);
    loads_.push_back(id);
    if (summary) {
      summary->rank = std::min(8, max_rank);
      summary->alpha = 16;
    }
    return absl::OkStatus();
  }
  void unload_adapter(int32_t id) override {
    if (!loaded_.erase(id)) errors_.push_back(absl::StrCat("unload of adapter ", id, " not loaded"));
    unloads_.push_back(id);
  }
  void keep_alive() override { ++keep_alives_; }
  double allreduce_seconds() const override { return 0; }

  // ---- For the tests ----
  // Called on each plan's output as it is computed (inject a failed row, say).
  std::function<void(const StepPlan&, StepOutput&)> on_step;
  // Called when the scheduler collects a plan (before it gets the output).
  std::function<void()> before_collect;

  const std::vector<StepPlan>& plans() const { return plans_; }
  const std::vector<std::string>& errors() const { return errors_; }
  int max_in_flight() const { return max_in_flight_; }
  int keep_alives() const { return keep_alives_; }
  const std::vector<int32_t>& loads() const { return loads_; }
  const std::vector<int32_t>& unloads() const { return unloads_; }
  // Prompt tokens computed: rows of every plan (decode rows included).
  int64_t tokens_computed() const {
    int64_t n = 0;
    for (const StepPlan& p : plans_) n += p.input.n_tokens();
    return n;
  }

 private:
  static constexpr uint64_t kEmpty = 1ull << 63;

  StepOutput compute(const StepPlan& plan) {
    const StepInput& in = plan.input;
    StepOutput out;
    if (plan.kind != PlanKind::kStep) return out;
    std::vector<uint64_t> row_kv(in.n_tokens(), kEmpty);
    // Slots each sequence reads (its context before this step) and writes.
    std::map<int32_t, int32_t> reader;  // slot -> sequence
    for (int32_t s = 0; s < in.n_seqs(); ++s) {
      const int32_t n_new = in.token_offsets[s + 1] - in.token_offsets[s];
      for (int32_t p = 0; p < in.context_lens[s] - n_new; ++p) reader[slot(in, s, p)] = s;
    }
    for (int32_t s = 0; s < in.n_seqs(); ++s) {
      const int32_t adapter = in.adapter_ids.empty() ? 0 : in.adapter_ids[s];
      if (adapter != 0 && !loaded_.count(adapter))
        errors_.push_back(absl::StrCat("plan names adapter ", adapter, ", not loaded"));
      for (int32_t r = in.token_offsets[s]; r < in.token_offsets[s + 1]; ++r) {
        const int32_t pos = in.positions[r];
        if (in.slot_mapping[r] != slot(in, s, pos))
          errors_.push_back(absl::StrCat("row ", r, ": slot_mapping disagrees with block table"));
        uint64_t prev = kStart;
        if (pos > 0) {
          prev = r > in.token_offsets[s] ? row_kv[r - 1] : slots_[slot(in, s, pos - 1)];
          if (prev == kEmpty)
            errors_.push_back(absl::StrCat("position ", pos - 1, " read before it was written"));
        }
        auto rd = reader.find(in.slot_mapping[r]);
        if (rd != reader.end() && rd->second != s)
          errors_.push_back(absl::StrCat("slot ", in.slot_mapping[r], " written by sequence ", s,
                                         " while sequence ", rd->second, " reads it"));
        row_kv[r] = mix(prev, in.token_ids[r], pos, adapter);
        slots_[in.slot_mapping[r]] = row_kv[r];
      }
      if (in.positions[in.token_offsets[s + 1] - 1] + 1 != in.context_lens[s])
        errors_.push_back(absl::StrCat("sequence ", s, ": context_len ", in.context_lens[s],
                                       " after its last position"));
    }
    const bool logprobs = plan_wants_logprobs(plan);
    for (size_t i = 0; i < in.logit_rows.size(); ++i) {
      const uint64_t kv = row_kv[in.logit_rows[i]];
      const RowSampling& rs = plan.sampling[i];
      SampleResult sr;
      sr.token = rs.target >= 0 ? rs.target : token_of(kv);
      sr.logprob = -static_cast<float>(kv % 1000) / 100.0f;
      out.samples.push_back(sr);
      if (logprobs) {
        RowLogprobs lp;
        lp.token = sr.token;
        lp.logprob = sr.logprob;
        lp.n_top = std::min(std::max(rs.top_n, 0), kMaxTopLogprobs);
        for (int k = 0; k < lp.n_top; ++k)
          lp.top[k] = {static_cast<int32_t>((kv >> k) % vocab_), -static_cast<float>(k)};
        out.logprobs.push_back(lp);
      }
      if (plan.want_logits)
        for (int32_t v = 0; v < vocab_; ++v)
          out.logits.push_back(v == token_of(kv) ? 1.0f : static_cast<float>((kv >> (v % 60)) & 7) / 16);
    }
    return out;
  }
  int32_t slot(const StepInput& in, int32_t s, int32_t pos) {
    const int32_t b = pos / block_size_;
    if (b >= in.max_blocks_per_seq) {
      errors_.push_back(absl::StrCat("position ", pos, " beyond sequence ", s, "'s block table"));
      return 0;
    }
    return in.block_tables[static_cast<size_t>(s) * in.max_blocks_per_seq + b] * block_size_ +
           pos % block_size_;
  }

  int32_t vocab_;
  int32_t block_size_;
  std::vector<uint64_t> slots_;
  std::vector<StepPlan> plans_;
  std::deque<StepOutput> pending_;
  std::vector<std::string> errors_;
  std::set<int32_t> loaded_;
  std::vector<int32_t> loads_, unloads_;
  int max_in_flight_ = 0;
  int keep_alives_ = 0;
};

}  // namespace ltm
