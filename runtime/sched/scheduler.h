// The scheduler: iteration-level (continuous) batching over the paged KV cache, on rank 0.
//
// Every step it: drops cancelled and expired sequences (their blocks are free at once); gives
// each running sequence its next tokens (one for a decode, a chunk of a long prompt) within a
// per-step token budget, preempting the newest sequence when KV blocks run out (it is recomputed
// later, never dropped); admits waiting requests in arrival order while blocks and budget allow;
// sends the plan to the engine (StepEngine: the real Engine, or a test's fake); turns sampled
// ids into events (text, stop strings, EOS, length).
// Threading: submit()/stats()/drain()/stop() from any thread; run_until_idle()/serve() on the
// one step thread, which also calls every EventCallback.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/engine/step_engine.h"
#include "runtime/model/kv_cache.h"
#include "runtime/sched/admission.h"
#include "runtime/sched/adapters.h"
#include "runtime/sched/block_allocator.h"
#include "runtime/sched/metrics.h"
#include "runtime/sched/request.h"
#include "runtime/spec/draft_cost.h"
#include "runtime/spec/proposer.h"
#include "runtime/text/stop_strings.h"
#include "runtime/text/tokenizer.h"

namespace ltm {

struct SchedulerOptions {
  int32_t max_batch_tokens = 512;  // new tokens per step (bounds prefill chunks)
  int32_t max_running = 64;        // sequences in the running batch
  int32_t max_queue = 256;         // waiting requests before RESOURCE_EXHAUSTED
  int32_t micro_batches = 1;       // plans in flight at once: the pipeline depth (pp) keeps every stage busy
  double keepalive_s = 0;          // serve(): a keep-alive plan after this long idle (<= 0: none)
  // Latencies, token counts and step times are observed here when set (runtime/sched/metrics.h);
  // it must outlive the scheduler.
  ServeMetrics* metrics = nullptr;
  int32_t lora_max_rank = 64;      // adapters of a higher rank are refused
  int32_t lora_max_adapters = 16;  // resident at once
  // Automatic prefix caching (--prefix-cache): full blocks stay cached after their sequence
  // ends, and a request reuses the longest run of them that starts its prompt
  // (runtime/sched/block_allocator.h). `cache_salt` stands for what else changes K/V in this
  // process (the KV dtype), mixed into every chain's root.
  bool prefix_cache = true;
  uint64_t cache_salt = 0;
  // Deadline-aware admission (runtime/sched/admission.h): a request whose projected finish is
  // not within `admission_fill` of the time to its deadline is refused at submit()
  // (ResourceExhausted with a Retry-After) or, once waiting, shed; preemption spares sequences
  // that would miss their deadline. Off: everything is admitted as before (a deadline still
  // ends its request).
  bool admission = true;
  double admission_fill = 0.9;
  double request_timeout_s = 0;  // the deadline of a request that comes without one (<= 0: none)
  // The clock of deadlines, latencies and step times (not of the drain deadline or keep-alives);
  // empty: steady_clock::now. Tests drive a fake one.
  std::function<std::chrono::steady_clock::time_point()> clock;
  // Speculative decoding (runtime/spec/proposer.h): a decoding sequence proposes drafts and the
  // step verifies them, while at most spec.max_batch sequences run. Off by default.
  SpecOptions spec;
};

struct SchedulerStats {
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;    // free to allocate, cached ones included
  int32_t kv_blocks_cached = 0;  // of those, cached blocks a later request may reuse
  int32_t block_size = 0;
  int32_t queue_depth = 0;
  int32_t running = 0;
  int64_t requests_served = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t prefix_cache_query_tokens = 0;  // context tokens of admissions that looked up the cache
  int64_t prefix_cache_hit_tokens = 0;    // of those, found cached (not computed)
  int64_t spec_proposed_tokens = 0;       // drafts verified (speculative decoding)
  int64_t spec_accepted_tokens = 0;       // of those, accepted
  int64_t spec_steps = 0;                 // sequence-steps that verified drafts
};

class Scheduler final : public RequestSink {
 public:
  // `tokenizer` may be null (ids only: events carry no text and stop strings are refused).
  Scheduler(StepEngine& engine, const Tokenizer* tokenizer, const ModelConfig& config,
            int32_t n_blocks, int32_t block_size, SchedulerOptions options);
  ~Scheduler() override;

  absl::Status submit(GenerationRequest request, EventCallback on_event) override;

  // Runs steps until nothing is queued or running.
  void run_until_idle();
  // Runs steps as work arrives until stop(); then finishes what is running (or cancels it once
  // the drain deadline passes) and returns.
  void serve();
  // New submits get Unavailable; serve() returns once running work is finished, or, after
  // `deadline`, cancelled.
  void stop(std::chrono::steady_clock::time_point deadline);
  // Fails every queued and running request with `error` (the engine is going down).
  void fail_all(const absl::Status& error);

  // LoRA adapters (unmerged: many resident, each request names one by GenerationRequest::adapter;
  // submit() answers NotFound for a name that is not loaded and FailedPrecondition for one being
  // unloaded). load_adapter: step thread, before serve()/run_until_idle() (start-up --lora).
  absl::Status load_adapter(const std::string& name, const std::string& dir);
  // Any thread: queues a load or unload for the step thread, which calls op.done when it is done:
  // a load at once; an unload once no queued or running request names the adapter (new ones are
  // refused meanwhile), or with op.force after failing those requests with ABORTED.
  void submit_adapter_op(AdapterOp op);
  // Any thread: the resident adapters, by name.
  std::vector<AdapterStatus> adapters() const;
  // An adapter folded into the weights at load, reported by adapters() as merged.
  void set_merged_adapter(AdapterStatus merged);

  SchedulerStats stats() const;

 private:
  struct Sequence;
  struct InFlightPlan;
  bool step();         // false when there was nothing to do
  bool submit_plan();  // false when no sequence could be scheduled
  void process_results(InFlightPlan& plan, StepOutput& out);
  void collect_all();  // waits for every plan in flight and processes its samples
  void take_incoming();
  void reap_cancelled();
  void preempt(Sequence* seq);
  // Admission with the prefix cache: holds the longest run of cached blocks that starts the
  // sequence's context (at most all but its last token); false (nothing held) when the rest of
  // its context does not fit the blocks free.
  bool admit_blocks(Sequence* seq);
  void register_full_blocks(Sequence* seq);  // its newly computed full blocks, into the cache
  // Deadline-aware admission (step thread): sheds waiting requests that cannot meet their
  // deadline; picks the preemption victim among the running sequences not in flight (`from`, the
  // one being scheduled, included): the newest, as ever, unless that one would then miss its
  // deadline and another would not; publishes the loads submit() projects over.
  void shed_unreachable();
  std::list<std::unique_ptr<Sequence>>::iterator pick_victim(
      std::list<std::unique_ptr<Sequence>>::iterator from);
  void publish_loads();
  // Speculative decoding (scheduler_spec.cpp). Whether this plan's decoding sequences speculate.
  bool speculating() const;
  // The drafts of the (at most max_seqs) sequences this plan takes first that decode, from one
  // propose_all call, into seq->drafts.
  void propose_drafts(int64_t max_seqs);
  // A decoding sequence's drafts for this step: those proposed, at most max_drafts, or none.
  void plan_drafts(Sequence* seq, int32_t max_drafts);
  // Its 1 + drafts logit rows, for batch rows row0 .. row0 + drafts.
  void add_draft_rows(Sequence* seq, int32_t row0, StepPlan* step, InFlightPlan* plan);
  // Reading results: whether row `spec_row` of `seq` still counts (no earlier row rejected its
  // draft); before its token is emitted, notes whether it accepted its draft.
  bool draft_row_counts(const Sequence* seq, int32_t spec_row) const;
  // Row spec_row of a sequence's speculative step, read back: whether its draft was accepted.
  // For sampled drafts, the row's token is decided here by the rule for a sampled q from the
  // row's logits (`row`, the whole vocab): *sample, and *logprobs when asked, are rewritten.
  void note_draft_row(Sequence* seq, int32_t spec_row, const std::vector<float>& row,
                      SampleResult* sample, RowLogprobs* logprobs);
  // Once its rows are read: the computed tokens are its last one and the accepted drafts (the
  // rejected drafts' K/V slots are left to be overwritten, their unused blocks freed).
  void end_draft_step(Sequence* seq);
  ProjectionLimits projection_limits() const;
  std::chrono::steady_clock::time_point now() const {
    return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
  }
  void finish(Sequence* seq, FinishReason reason, absl::Status status = absl::OkStatus());
  void emit(Sequence* seq, GenerationEvent event);
  void on_token(Sequence* seq, const SampleResult& sample, std::vector<float>* logits_row,
                const RowLogprobs* logprobs);
  // Ends a request whose logits row could not be used (the model gave NaN, +inf or no finite
  // logit): Internal for it, nothing for the rest of the batch.
  void fail_row(Sequence* seq, RowError why);
  void run_adapter_ops();  // step thread: loads, force-unloads, and unloads whose requests are done
  absl::StatusOr<AdapterStatus> do_load(const std::string& name, const std::string& dir);
  void fail_adapter_ops(const absl::Status& why);

  struct Adapter {
    AdapterStatus status;
    int32_t id = 0;
  };

  StepEngine& engine_;
  const Tokenizer* tokenizer_;
  ModelConfig config_;
  int32_t block_size_;
  SchedulerOptions options_;
  BlockAllocator blocks_;

  mutable std::mutex mu_;  // guards incoming_, stopping_, stats snapshot
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point drain_deadline_;
  SchedulerStats stats_;
  std::map<std::string, Adapter> adapters_;  // resident, by name (guarded by mu_)
  std::vector<AdapterStatus> merged_;        // --lora-merge
  std::deque<AdapterOp> adapter_ops_;        // queued by submit_adapter_op (guarded by mu_)
  int32_t next_adapter_id_ = 1;              // never reused, so a stale id cannot alias

  // Step thread only.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::list<std::unique_ptr<Sequence>> running_;  // in admission order
  std::deque<std::unique_ptr<InFlightPlan>> in_flight_;  // submitted, samples not yet back
  uint64_t next_seq_id_ = 1;
  StepCostModel cost_;                  // step times as measured
  // Speculative decoding's price of a draft row (scheduler_spec.cpp): the steps that only
  // decode, their times against their rows (runtime/spec/draft_cost.h).
  DraftCostModel decode_cost_;
  std::chrono::steady_clock::time_point last_collect_{};     // when the previous plan's samples came back
  // What submit() projects over (guarded by mu_): the step thread's copy after each step.
  StepCostModel published_cost_;
  std::vector<SeqLoad> published_running_, published_waiting_;
  std::vector<std::chrono::steady_clock::time_point> published_running_deadline_,
      published_waiting_deadline_;
  std::vector<AdapterOp> unloads_;  // step thread: unloads waiting for their requests
  std::shared_ptr<Proposer> proposer_;  // speculative decoding's (options_.spec), or null
};

}  // namespace ltm
