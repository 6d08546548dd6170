#include "runtime/sched/scheduler.h"

#include "runtime/sched/scheduler_internal.h"

#include <algorithm>
#include <span>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/logging.h"

namespace ltm {

using Clock = std::chrono::steady_clock;

Scheduler::Scheduler(StepEngine& engine, const Tokenizer* tokenizer, const ModelConfig& config,
                     int32_t n_blocks, int32_t block_size, SchedulerOptions options)
    : engine_(engine),
      tokenizer_(tokenizer),
      config_(config),
      block_size_(block_size),
      options_(options),
      blocks_(n_blocks) {
  stats_.kv_blocks_total = n_blocks;
  stats_.kv_blocks_free = n_blocks;
  stats_.block_size = block_size;
  if (options_.spec.mode != SpecMode::kOff) {
    proposer_ = options_.spec.proposer;
    if (!proposer_ && options_.spec.mode == SpecMode::kNgram)
      proposer_ = std::make_shared<NgramProposer>();
    LTM_ASSERT(proposer_ != nullptr, "--speculative ", spec_mode_name(options_.spec.mode),
               " needs a proposer");
  }
}

Scheduler::~Scheduler() = default;

absl::Status Scheduler::submit(GenerationRequest request, EventCallback on_event) {
  if (request.deadline == Clock::time_point::max() && options_.request_timeout_s > 0)
    request.deadline = now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options_.request_timeout_s));
  const int64_t total = static_cast<int64_t>(request.prompt_ids.size()) + request.max_new_tokens;
  const int64_t cache_tokens = static_cast<int64_t>(blocks_.n_total()) * block_size_;
  if (total > cache_tokens)
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens: prompt (", request.prompt_ids.size(), ") + max_new_tokens (",
        request.max_new_tokens, ") = ", total, " tokens do not fit the KV cache (", cache_tokens,
        " tokens); ask for fewer"));
  if (!request.stop.empty() && tokenizer_ == nullptr)
    return absl::InvalidArgumentError("stop: this server has no tokenizer to match stop strings");
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt_ids;
  seq->n_prompt = static_cast<int32_t>(request.prompt_ids.size());
  if (tokenizer_) seq->decoder = std::make_unique<StreamingDecoder>(*tokenizer_);
  seq->stop = std::make_unique<StopMatcher>(request.stop);
  seq->req = std::move(request);
  seq->on_event = std::move(on_event);
  seq->t_submit = now();
  seq->draft_length = DraftLength(options_.spec.max_tokens);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("server is draining; not taking new requests");
    if (stats_.queue_depth >= options_.max_queue) {
      if (options_.metrics) options_.metrics->count_refused(RefuseReason::kQueueFull);
      return absl::ResourceExhaustedError(
          absl::StrCat("queue is full (", options_.max_queue, " requests waiting); retry later"));
    }
    if (options_.admission && seq->req.deadline != Clock::time_point::max()) {
      // When would it finish, queued behind everything waiting, and would the others still
      // meet their deadlines?
      auto in_s = [&](Clock::time_point d) {
        return d == Clock::time_point::max()
                   ? std::numeric_limits<double>::infinity()
                   : std::chrono::duration<double>(d - seq->t_submit).count();
      };
      std::vector<SeqLoad> waiting = published_waiting_;
      std::vector<double> running_in, waiting_in;
      for (const auto& d : published_running_deadline_) running_in.push_back(in_s(d));
      for (const auto& d : published_waiting_deadline_) waiting_in.push_back(in_s(d));
      for (const auto& s : incoming_) {
        waiting.push_back(s->load());
        waiting_in.push_back(in_s(s->req.deadline));
      }
      const Projection without =
          project(published_cost_, published_running_, waiting, projection_limits());
      waiting.push_back(seq->load());
      const Projection with =
          project(published_cost_, published_running_, waiting, projection_limits());
      const double finish_s = with.waiting_s.back();
      const double deadline_in_s = in_s(seq->req.deadline);
      AdmissionVerdict v = decide_admission(published_cost_.ready(), finish_s, deadline_in_s,
                                            options_.admission_fill);
      std::string why;
      if (!v.admit) {
        why = absl::StrFormat("this request would finish in about %.1f s (%d requests ahead of "
                              "it), after its deadline in %.1f s",
                              finish_s, static_cast<int>(waiting.size() - 1), deadline_in_s);
      } else if (published_cost_.ready()) {
        const double harm = harm_to_others(without, with, running_in, waiting_in);
        if (harm > 0) {
          v.admit = false;
          v.retry_after_s = std::max(1.0, std::ceil(harm));
          why = absl::StrFormat("admitted, this request would make admitted ones miss their "
                                "deadlines (by up to %.1f s)",
                                harm);
        }
      }
      if (!v.admit) {
        if (options_.metrics) options_.metrics->count_refused(RefuseReason::kDeadline);
        return with_retry_after(
            absl::ResourceExhaustedError(absl::StrFormat("deadline: %s; retry after %.0f s", why,
                                                         v.retry_after_s)),
            v.retry_after_s);
      }
    }
    const bool merged = std::any_of(merged_.begin(), merged_.end(),
                                    [&](const AdapterStatus& m) { return m.name == seq->req.adapter; });
    if (!seq->req.adapter.empty() && !merged) {  // the merged adapter is the weights themselves
      auto it = adapters_.find(seq->req.adapter);
      if (it == adapters_.end())
        return absl::NotFoundError(absl::StrCat(
            "adapter: \"", seq->req.adapter, "\" is not loaded (ListAdapters lists what is; "
            "LoadAdapter loads one from --lora-dir)"));
      if (it->second.status.unloading)
        return absl::FailedPreconditionError(
            absl::StrCat("adapter: \"", seq->req.adapter, "\" is being unloaded"));
      seq->adapter_id = it->second.id;
      it->second.status.active_requests++;
    }
    seq->id = next_seq_id_++;
    if (seq->adapter_id != 0) {
      const std::string& name = seq->req.adapter;
      seq->salt = hash_bytes(name.data(), name.size(), seq->adapter_id);
    }
    seq->salt ^= options_.cache_salt;
    seq->reuse = options_.prefix_cache && !seq->req.score_prompt && !seq->req.return_prompt_logits;
    incoming_.push_back(std::move(seq));
    stats_.queue_depth++;
  }
  cv_.notify_one();
  return absl::OkStatus();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Scheduler::take_incoming() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!incoming_.empty()) {
    waiting_.push_back(std::move(incoming_.front()));
    incoming_.pop_front();
  }
}

void Scheduler::emit(Sequence* seq, GenerationEvent event) {
  if (seq->on_event) seq->on_event(std::move(event));
}

void Scheduler::finish(Sequence* seq, FinishReason reason, absl::Status status) {
  if (seq->finished) return;
  seq->finished = true;
  GenerationEvent ev;
  if (reason != FinishReason::kStop && reason != FinishReason::kCancelled &&
      reason != FinishReason::kError) {
    // Whatever the decoder and stop matcher still hold is part of the output.
    std::string rest = seq->decoder ? seq->decoder->flush() : std::string();
    StopMatcher::Result r = seq->stop->push(rest);
    ev.text = r.emit + (r.stopped ? std::string() : seq->stop->flush());
    if (r.stopped) reason = FinishReason::kStop;
  }
  ev.finished = true;
  ev.finish_reason = reason;
  ev.status = std::move(status);
  ev.prompt_tokens = seq->n_prompt;
  ev.completion_tokens = seq->generated();
  ev.spec_proposed_tokens = seq->spec_proposed;
  ev.spec_accepted_tokens = seq->spec_accepted;
  const auto now = this->now();
  ev.total_time_s = std::chrono::duration<double>(now - seq->t_submit).count();
  if (seq->generated() > 0)
    ev.time_to_first_token_s =
        std::chrono::duration<double>(seq->t_first_token - seq->t_submit).count();
  if (options_.metrics) {
    options_.metrics->observe_request_latency(ev.total_time_s);
    options_.metrics->add_prompt_tokens(seq->n_prompt);
    options_.metrics->observe_request_spec(seq->spec_proposed, seq->spec_accepted);
  }
  blocks_.release(seq->blocks);
  seq->blocks.clear();
  if (proposer_) proposer_->release(seq->id);  // a draft model's K/V for it
  {
    // One line per request (debug level: ltm-worker -v): its id is in the line's context.
    LogRequestScope scope(seq->req.request_id);
    const std::string why = ev.status.ok() ? std::string() : absl::StrCat(": ", ev.status.ToString());
    spdlog::log(reason == FinishReason::kError ? spdlog::level::warn : spdlog::level::debug,
                "finished: {} ({} prompt + {} new tokens, {:.3f} s){}", finish_reason_name(reason),
                ev.prompt_tokens, ev.completion_tokens, ev.total_time_s, why);
  }
  emit(seq, std::move(ev));
  std::lock_guard<std::mutex> lock(mu_);
  stats_.requests_served++;
  if (seq->adapter_id != 0) {
    auto it = adapters_.find(seq->req.adapter);
    if (it != adapters_.end() && it->second.id == seq->adapter_id) it->second.status.active_requests--;
  }
}

void Scheduler::reap_cancelled() {
  const auto now = this->now();
  // A sequence in flight is reaped once its plan is back (its samples must be matched first).
  auto dead = [&](const Sequence& s) {
    return !s.busy && (s.req.cancel->cancelled.load(std::memory_order_relaxed) ||
                       now >= s.req.deadline || !s.abort.ok());
  };
  auto reason = [](const Sequence& s) {
    return s.abort.ok() ? FinishReason::kCancelled : FinishReason::kError;
  };
  for (auto it = running_.begin(); it != running_.end();) {
    if (dead(**it)) {
      finish(it->get(), reason(**it), (*it)->abort);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (dead(**it)) {
      finish(it->get(), reason(**it), (*it)->abort);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Scheduler::admit_blocks(Sequence* seq) {
  const int32_t n = static_cast<int32_t>(seq->tokens.size());
  seq->chain = BlockAllocator::root(seq->salt);
  std::vector<int32_t> hit;
  if (seq->reuse)  // at least the last token is computed: its row is sampled
    hit = blocks_.lookup(seq->tokens, block_size_, (n - 1) / block_size_, &seq->chain);
  const int32_t n_hit = static_cast<int32_t>(hit.size());
  // The whole current context must fit, so that admission does not cause preemption; reused
  // blocks nobody held stop counting as free.
  if (blocks_for(n + 1, block_size_) - n_hit + blocks_.n_unheld(hit) > blocks_.n_free())
    return false;
  blocks_.acquire(hit);
  seq->blocks = std::move(hit);
  seq->n_computed = n_hit * block_size_;  // the first computed position starts a fresh block
  seq->n_registered = n_hit;
  if (seq->reuse) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prefix_cache_query_tokens += n;
    stats_.prefix_cache_hit_tokens += seq->n_computed;
  }
  return true;
}

void Scheduler::register_full_blocks(Sequence* seq) {
  for (const int32_t full = seq->n_computed / block_size_; seq->n_registered < full;
       ++seq->n_registered) {
    const int32_t i = seq->n_registered;
    blocks_.register_block(
        seq->blocks[i],
        std::span<const int32_t>(seq->tokens).subspan(static_cast<size_t>(i) * block_size_,
                                                      block_size_),
        &seq->chain);
  }
}

void Scheduler::preempt(Sequence* seq) {
  blocks_.release(seq->blocks);
  seq->blocks.clear();
  // Recomputed from its tokens (prompt + generated) when readmitted, but for the blocks still
  // cached then.
  seq->n_computed = 0;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.preemptions++;
}

bool Scheduler::step() {
  const Clock::time_point t0 = Clock::now();
  const double allreduce0 = engine_.allreduce_seconds();
  take_incoming();
  run_adapter_ops();
  reap_cancelled();
  if (options_.admission) shed_unreachable();
  const bool submitted = submit_plan();
  const int in_flight = engine_.in_flight();
  const bool collected = in_flight > 0 && (!submitted || in_flight >= options_.micro_batches ||
                                           in_flight_.back()->want_logits);
  if (collected) {
    StepOutput out = engine_.collect();
    std::unique_ptr<InFlightPlan> plan = std::move(in_flight_.front());
    in_flight_.pop_front();
    // The plan's service time: since it went out, or since the previous one came back when it
    // waited behind that one (micro-batches).
    const Clock::time_point now = this->now();
    const double seconds =
        std::chrono::duration<double>(now - std::max(plan->t_submit, last_collect_)).count();
    cost_.observe(plan->tokens, seconds);
    if (plan->decode_only) decode_cost_.observe(plan->tokens, seconds);
    last_collect_ = now;
    process_results(*plan, out);
  }
  if (options_.admission) publish_loads();
  if (options_.metrics && (submitted || collected))
    options_.metrics->observe_step(std::chrono::duration<double>(Clock::now() - t0).count(),
                                   engine_.allreduce_seconds() - allreduce0);
  if (!unloads_.empty()) run_adapter_ops();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.kv_blocks_free = blocks_.n_free();
  stats_.kv_blocks_cached = blocks_.n_cached();
  stats_.running = static_cast<int32_t>(running_.size());
  stats_.queue_depth = static_cast<int32_t>(waiting_.size() + incoming_.size());
  return submitted || engine_.in_flight() > 0 || !running_.empty() || !waiting_.empty() ||
         !unloads_.empty() || !adapter_ops_.empty();
}

bool Scheduler::submit_plan() {
  // With several micro-batches (pipeline stages), each plan takes its share of the sequences
  // so that every stage has one to work on.
  const int64_t active = static_cast<int64_t>(running_.size() + waiting_.size());
  const int64_t max_seqs = std::max<int64_t>(
      1, (active + options_.micro_batches - 1) / std::max(1, options_.micro_batches));
  int32_t budget = options_.max_batch_tokens;
  auto plan = std::make_unique<InFlightPlan>();
  plan->t_submit = now();
  std::vector<Sequence*>& batch = plan->batch;
  const bool speculate = speculating();
  if (speculate) {
    propose_drafts(max_seqs);  // every decoding sequence's drafts, at once
    plan->t_submit = now();    // the step's time is the target's (a draft model times its own)
  }
  // 1. Running sequences that are not in flight, oldest first; when blocks run out, preempt the
  // newest one that is not in flight (possibly this very sequence), or with deadline-aware
  // admission one that keeps its deadline when the newest would not (pick_victim).
  for (auto it = running_.begin();
       it != running_.end() && budget > 0 && static_cast<int64_t>(batch.size()) < max_seqs;) {
    Sequence* seq = it->get();
    if (seq->busy) {
      ++it;
      continue;
    }
    const int32_t pending = static_cast<int32_t>(seq->tokens.size()) - seq->n_computed;
    if (speculate && pending == 1)
      plan_drafts(seq, budget - 1);  // decoding: the drafts proposed, to verify
    else
      seq->drafts.clear();
    if (pending != 1) plan->decode_only = false;
    const int32_t chunk = std::min(pending + static_cast<int32_t>(seq->drafts.size()), budget);
    const int32_t need = blocks_for(seq->n_computed + chunk, block_size_) -
                         static_cast<int32_t>(seq->blocks.size());
    bool self_preempted = false;
    while (need > blocks_.n_free()) {
      auto victim = pick_victim(it);
      if (victim->get() == seq) {
        self_preempted = true;
      } else if (auto in = std::find(batch.begin(), batch.end(), victim->get()); in != batch.end()) {
        budget += (*in)->chunk;  // an older sequence of this plan yields (deadline-aware only)
        batch.erase(in);
      }
      preempt(victim->get());
      waiting_.push_front(std::move(*victim));
      if (self_preempted) {
        it = running_.erase(victim);
        break;
      }
      running_.erase(victim);
    }
    if (self_preempted) {
      seq->drafts.clear();
      continue;
    }
    if (need > 0) LTM_ASSERT(blocks_.allocate(need, &seq->blocks));
    seq->chunk = chunk;
    budget -= chunk;
    batch.push_back(seq);
    ++it;
  }
  // 2. Admit waiting requests in order while blocks and budget allow. A request is admitted
  // only when its whole current context fits, so that admission does not cause preemption.
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(batch.size()) < max_seqs &&
         static_cast<int32_t>(running_.size()) < options_.max_running) {
    Sequence* seq = waiting_.front().get();
    if (!admit_blocks(seq)) break;
    seq->drafts.clear();
    plan->decode_only = false;
    const int32_t chunk =
        std::min(static_cast<int32_t>(seq->tokens.size()) - seq->n_computed, budget);
    LTM_ASSERT(blocks_.allocate(blocks_for(seq->n_computed + chunk, block_size_) -
                                    static_cast<int32_t>(seq->blocks.size()),
                                &seq->blocks));
    seq->chunk = chunk;
    budget -= chunk;
    batch.push_back(seq);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (batch.empty()) return false;
  // Sequences of one adapter side by side: each adapter's rows are then one block, whose LoRA
  // update the model computes with two GEMMs (Model::apply_lora).
  std::stable_sort(batch.begin(), batch.end(),
                   [](const Sequence* a, const Sequence* b) { return a->adapter_id < b->adapter_id; });

  // 3. The plan every rank runs.
  StepPlan step;
  StepInput& in = step.input;
  int32_t max_blocks = 0;
  for (Sequence* seq : batch) max_blocks = std::max(max_blocks, static_cast<int32_t>(seq->blocks.size()));
  in.max_blocks_per_seq = max_blocks;
  in.token_offsets.push_back(0);
  for (Sequence* seq : batch) {
    seq->busy = true;
    const int32_t row0 = in.n_tokens();
    for (int32_t i = 0; i < seq->chunk; ++i) {
      const int32_t pos = seq->n_computed + i;
      const int32_t n_tokens = static_cast<int32_t>(seq->tokens.size());
      in.token_ids.push_back(pos < n_tokens ? seq->tokens[pos] : seq->drafts[pos - n_tokens]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(seq->blocks[pos / block_size_] * block_size_ + pos % block_size_);
    }
    in.token_offsets.push_back(in.n_tokens());
    in.context_lens.push_back(seq->n_computed + seq->chunk);
    in.adapter_ids.push_back(seq->adapter_id);
    for (int32_t b = 0; b < max_blocks; ++b)
      in.block_tables.push_back(b < static_cast<int32_t>(seq->blocks.size()) ? seq->blocks[b] : 0);
    if (!seq->drafts.empty()) {  // speculative: a row per token of the chunk
      add_draft_rows(seq, row0, &step, plan.get());
      continue;
    }
    const bool completes = seq->n_computed + seq->chunk == static_cast<int32_t>(seq->tokens.size());
    RowSampling rs;
    rs.params = seq->req.sampling;
    rs.token_index = seq->generated();
    rs.want_logprob = seq->req.return_logprobs;
    if (seq->req.return_prompt_logits || seq->req.score_prompt) {
      // Prompt positions p < n_prompt - 1 of this chunk not reported yet (p's row is about
      // prompt token p + 1; the last position's is the first new token's row, below).
      const int32_t end = std::min(seq->n_computed + seq->chunk, seq->n_prompt - 1);
      for (int32_t pos = std::max(seq->n_computed, seq->prompt_rows_done); pos < end; ++pos) {
        RowSampling score = rs;
        score.target = seq->tokens[pos + 1];
        score.top_n = seq->req.score_prompt ? std::max(seq->req.logprob_alternatives, 0) : -1;
        in.logit_rows.push_back(row0 + pos - seq->n_computed);
        step.sampling.push_back(std::move(score));
        plan->rows.push_back({seq, false});
        if (seq->req.return_prompt_logits) step.want_logits = true;
      }
    }
    if (completes) {
      if (rs.params.repetition_penalty != 1.0f) rs.history = seq->tokens;
      rs.top_n = seq->req.logprob_alternatives;
      in.logit_rows.push_back(in.n_tokens() - 1);
      step.sampling.push_back(std::move(rs));
      plan->rows.push_back({seq, true});
      if (seq->req.return_full_logits || (seq->req.return_prompt_logits && seq->generated() == 0))
        step.want_logits = true;
    }
  }
  plan->want_logits = step.want_logits;
  plan->tokens = in.n_tokens();

  // 4. Run it on every rank (rank 0's stage now, the later stages while we plan the next one).
  engine_.submit(step);
  in_flight_.push_back(std::move(plan));
  std::lock_guard<std::mutex> lock(mu_);
  stats_.steps++;
  return true;
}

void Scheduler::process_results(InFlightPlan& plan, StepOutput& out) {
  for (Sequence* seq : plan.batch) {
    seq->busy = false;
    if (!seq->drafts.empty()) continue;  // end_draft_step, once its rows are read
    seq->n_computed += seq->chunk;
    if (options_.prefix_cache && !seq->finished) register_full_blocks(seq);
  }
  const int64_t V = config_.vocab_size;
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    Sequence* seq = plan.rows[r].seq;
    if (seq->finished) continue;  // an earlier row of this plan failed or ended it
    const int32_t spec_row = plan.rows[r].spec_row;
    if (spec_row >= 0 && !draft_row_counts(seq, spec_row)) continue;  // after a rejected draft
    if (!out.samples[r].ok()) {
      fail_row(seq, out.samples[r].error());
      continue;
    }
    std::vector<float> row;
    if (plan.want_logits && !out.logits.empty())
      row.assign(out.logits.begin() + r * V, out.logits.begin() + (r + 1) * V);
    const RowLogprobs* logprobs = out.logprobs.empty() ? nullptr : &out.logprobs[r];
    if (!plan.rows[r].sample) {
      seq->prompt_rows_done++;
      GenerationEvent ev;
      if (seq->req.return_prompt_logits) ev.prompt_logits = std::move(row);
      if (seq->req.score_prompt && logprobs) ev.prompt_logprobs.push_back(*logprobs);
      emit(seq, std::move(ev));
      continue;
    }
    if (seq->req.return_prompt_logits && seq->generated() == 0) {
      GenerationEvent ev;  // the last prompt position's logits are this row's
      ev.prompt_logits = row;
      emit(seq, std::move(ev));
    }
    if (spec_row >= 0)
      note_draft_row(seq, spec_row, row, &out.samples[r],
                     out.logprobs.empty() ? nullptr : &out.logprobs[r]);
    on_token(seq, out.samples[r], seq->req.return_full_logits ? &row : nullptr, logprobs);
  }
  for (Sequence* seq : plan.batch)
    if (!seq->drafts.empty()) end_draft_step(seq);
  // Drop finished sequences.
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->finished)
      it = running_.erase(it);
    else
      ++it;
  }
}

void Scheduler::fail_row(Sequence* seq, RowError why) {
  finish(seq, FinishReason::kError,
         absl::InternalError(absl::StrCat(
             "the model's output for this request could not be sampled (", row_error_name(why),
             ", at position ", seq->n_computed, "); this request is ended, the server goes on")));
}

void Scheduler::on_token(Sequence* seq, const SampleResult& sample, std::vector<float>* logits,
                         const RowLogprobs* logprobs) {
  const Clock::time_point now = this->now();
  if (seq->generated() == 0) seq->t_first_token = now;
  if (options_.metrics) {
    if (seq->generated() == 0)
      options_.metrics->observe_time_to_first_token(
          std::chrono::duration<double>(now - seq->t_submit).count());
    else
      options_.metrics->observe_inter_token_latency(
          std::chrono::duration<double>(now - seq->t_last_token).count());
    options_.metrics->add_generation_tokens(1);
  }
  seq->t_last_token = now;
  seq->tokens.push_back(sample.token);
  GenerationEvent ev;
  ev.token_ids.push_back(sample.token);
  if (seq->req.return_logprobs) ev.logprobs.push_back(sample.logprob);
  if (seq->req.logprob_alternatives >= 0 && logprobs) ev.token_logprobs.push_back(*logprobs);
  if (logits) ev.full_logits = std::move(*logits);
  const std::vector<int32_t>& ends = seq->req.end_ids;
  const bool eos = !seq->req.ignore_eos &&
                   ((config_.eos_token_id >= 0 && sample.token == config_.eos_token_id) ||
                    std::find(ends.begin(), ends.end(), sample.token) != ends.end());
  bool stopped = false;
  if (!eos && seq->decoder) {
    StopMatcher::Result r = seq->stop->push(seq->decoder->push(sample.token));
    ev.text = std::move(r.emit);
    stopped = r.stopped;
  }
  emit(seq, std::move(ev));
  if (eos)
    finish(seq, FinishReason::kEos);
  else if (stopped)
    finish(seq, FinishReason::kStop);
  else if (seq->generated() >= seq->req.max_new_tokens ||
           static_cast<int64_t>(seq->tokens.size()) >= config_.n_positions)
    finish(seq, FinishReason::kLength);
}

void Scheduler::run_until_idle() {
  while (step()) {
  }
}

void Scheduler::serve() {
  const bool keepalive = options_.keepalive_s > 0;
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(keepalive ? options_.keepalive_s : 1.0));
  if (keepalive) engine_.keep_alive();  // arms the other ranks' idle timeout
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto has_work = [&] {
        return stopping_ || !incoming_.empty() || !running_.empty() || !waiting_.empty() ||
               !adapter_ops_.empty() || !unloads_.empty();
      };
      if (keepalive) {
        if (!cv_.wait_for(lock, period, has_work)) {
          lock.unlock();
          engine_.keep_alive();
          continue;
        }
      } else {
        cv_.wait(lock, has_work);
      }
      if (stopping_ && incoming_.empty() && running_.empty() && waiting_.empty()) {
        lock.unlock();
        fail_adapter_ops(absl::UnavailableError("server is shutting down"));
        return;
      }
      if (stopping_ && Clock::now() >= drain_deadline_) {
        lock.unlock();
        collect_all();
        take_incoming();
        const absl::Status why =
            absl::UnavailableError("server shut down: the drain timeout passed; retry elsewhere");
        for (auto& s : running_) finish(s.get(), FinishReason::kCancelled, why);
        for (auto& s : waiting_) finish(s.get(), FinishReason::kCancelled, why);
        running_.clear();
        waiting_.clear();
        fail_adapter_ops(why);
        return;
      }
    }
    step();
  }
}

void Scheduler::stop(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    drain_deadline_ = deadline;
  }
  cv_.notify_all();
}

void Scheduler::collect_all() {
  while (!in_flight_.empty()) {
    StepOutput out = engine_.collect();
    std::unique_ptr<InFlightPlan> plan = std::move(in_flight_.front());
    in_flight_.pop_front();
    process_results(*plan, out);
  }
}

void Scheduler::fail_all(const absl::Status& error) {
  take_incoming();
  for (auto& s : running_) finish(s.get(), FinishReason::kError, error);
  for (auto& s : waiting_) finish(s.get(), FinishReason::kError, error);
  running_.clear();
  waiting_.clear();
  fail_adapter_ops(error);
}

absl::Status Scheduler::load_adapter(const std::string& name, const std::string& dir) {
  return do_load(name, dir).status();
}

void Scheduler::submit_adapter_op(AdapterOp op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      adapter_ops_.push_back(std::move(op));
      op.done = nullptr;
    }
  }
  if (op.done) {
    op.done(absl::UnavailableError("server is draining; not loading or unloading adapters"));
    return;
  }
  cv_.notify_one();
}

std::vector<AdapterStatus> Scheduler::adapters() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AdapterStatus> out = merged_;
  for (const auto& [name, a] : adapters_) out.push_back(a.status);
  return out;
}

void Scheduler::set_merged_adapter(AdapterStatus merged) {
  std::lock_guard<std::mutex> lock(mu_);
  merged.merged = true;
  merged.loaded = true;
  merged_.push_back(std::move(merged));
}

absl::StatusOr<AdapterStatus> Scheduler::do_load(const std::string& name, const std::string& dir) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (adapters_.count(name))
      return absl::AlreadyExistsError(absl::StrCat("adapter \"", name, "\" is already loaded"));
    for (const AdapterStatus& m : merged_)
      if (m.name == name)
        return absl::AlreadyExistsError(
            absl::StrCat("adapter \"", name, "\" is merged into the weights (--lora-merge)"));
    if (static_cast<int32_t>(adapters_.size()) >= options_.lora_max_adapters)
      return absl::ResourceExhaustedError(absl::StrCat(
          options_.lora_max_adapters, " adapters are loaded, the most this server holds "
          "(--lora-max-adapters); unload one first"));
  }
  const int32_t id = next_adapter_id_++;
  LoraSummary summary;
  LTM_RETURN_IF_ERROR(engine_.load_adapter(id, dir, options_.lora_max_rank, &summary));
  Adapter a;
  a.id = id;
  a.status.name = name;
  a.status.dir = dir;
  a.status.loaded = true;
  a.status.rank = summary.rank;
  a.status.alpha = summary.alpha;
  a.status.target_modules = summary.modules;
  std::lock_guard<std::mutex> lock(mu_);
  adapters_.emplace(name, a);
  return a.status;
}

void Scheduler::run_adapter_ops() {
  std::deque<AdapterOp> ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ops.swap(adapter_ops_);
  }
  for (AdapterOp& op : ops) {
    if (op.kind == AdapterOp::Kind::kLoad) {
      op.done(do_load(op.name, op.dir));
      continue;
    }
    int32_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = adapters_.find(op.name);
      if (it != adapters_.end()) {
        it->second.status.unloading = true;
        id = it->second.id;
      }
    }
    if (id == 0) {
      op.done(absl::NotFoundError(absl::StrCat("adapter \"", op.name, "\" is not loaded")));
      continue;
    }
    if (op.force) {  // end its requests now (in-flight ones once their step is back)
      const absl::Status why = absl::AbortedError(
          absl::StrCat("adapter \"", op.name, "\" was unloaded while this request ran"));
      for (auto& seq : running_)
        if (seq->adapter_id == id) seq->abort = why;
      for (auto& seq : waiting_)
        if (seq->adapter_id == id) seq->abort = why;
    }
    unloads_.push_back(std::move(op));
  }
  // Unloads whose adapter no queued, running or in-flight request names any more.
  for (auto it = unloads_.begin(); it != unloads_.end();) {
    int32_t id = 0;
    AdapterStatus status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto a = adapters_.find(it->name);
      if (a != adapters_.end() && a->second.status.active_requests == 0) {
        id = a->second.id;
        status = a->second.status;
        adapters_.erase(a);
      }
    }
    if (id == 0) {
      ++it;
      continue;
    }
    engine_.unload_adapter(id);
    status.loaded = false;
    status.unloading = false;
    it->done(status);
    it = unloads_.erase(it);
  }
}

void Scheduler::fail_adapter_ops(const absl::Status& why) {
  std::deque<AdapterOp> ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ops.swap(adapter_ops_);
  }
  for (AdapterOp& op : ops) op.done(why);
  for (AdapterOp& op : unloads_) op.done(why);
  unloads_.clear();
}

}  // namespace ltm
