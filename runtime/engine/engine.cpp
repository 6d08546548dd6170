#include "runtime/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "parallel/group_abort.h"
#include "runtime/engine/candidate_exchange.h"

namespace ltm {

namespace {

// f(i, scratch) for i in [0, m) on up to `threads` OpenMP threads (rows are independent: each has
// its own RNG stream, runtime/sampling/sampler.h), each thread with its own scratch vector. The
// sampler's checks throw; an exception leaves no OpenMP region, so the first is carried out and
// rethrown here.
template <typename F>
void for_each_row(int64_t m, int threads, F&& f) {
  if (threads <= 1 || m <= 1) {
    std::vector<float> scratch;
    for (int64_t i = 0; i < m; ++i) f(i, scratch);
    return;
  }
  std::exception_ptr error;
  std::mutex mu;
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(threads, m)))
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < m; ++i) {
      try {
        f(i, scratch);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

namespace {

constexpr int kTagHidden = 101;
constexpr int kTagSamples = 102;
constexpr int kTagLogits = 103;
constexpr int kTagCandidates = 104;
constexpr int kTagPlanSize = 105;
constexpr int kTagPlan = 106;
constexpr int kTagLogprobs = 107;

class CommTimer {
 public:
  explicit CommTimer(double* total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~CommTimer() {
    *total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double* total_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

bool plan_wants_logprobs(const StepPlan& plan) {
  return std::any_of(plan.sampling.begin(), plan.sampling.end(),
                     [](const RowSampling& rs) { return rs.target >= 0 || rs.top_n >= 0; });
}

Rng token_rng(uint64_t seed, int32_t token_index) { return Rng::for_step(seed, token_index); }

Engine::Engine(Model& model, Backend& backend, KvCache& cache, Comms comms)
    : model_(model), backend_(backend), cache_(cache), comms_(comms) {
  const ShardSpec& s = model_.shard();
  last_stage_root_ = (s.pp - 1) * s.tp;
}

// Rank 0 posts the plan to every other rank and goes on at once: a rank still busy with the
// previous micro-batch picks it up when it gets there (a broadcast would hold rank 0 until then,
// and the pipeline would run one stage at a time).
void Engine::post_plan(const StepPlan& plan) {
  if (comms_.world.size() == 1) return;
  std::string bytes = encode_plan(plan);
  const int64_t n = static_cast<int64_t>(bytes.size());
  for (int r = 1; r < comms_.world.size(); ++r) {
    comms_.world.post(&n, sizeof(n), r, kTagPlanSize);
    comms_.world.post(bytes.data(), bytes.size(), r, kTagPlan);
  }
}

StepOutput Engine::step(const StepPlan& plan) {
  submit(plan);
  return collect();
}

void Engine::submit(const StepPlan& plan) {
  LTM_ASSERT(comms_.world.rank() == 0, "submit() is rank 0's");
  post_plan(plan);
  StepOutput out = execute(plan);
  if (last_stage_root_ == 0) {
    ready_.push_back(std::move(out));  // rank 0 is on the last stage: the samples are here
  } else {
    in_flight_.push_back({static_cast<int>(plan.input.logit_rows.size()), plan.want_logits,
                          plan_wants_logprobs(plan)});
  }
}

StepOutput Engine::collect() {
  LTM_ASSERT(comms_.world.rank() == 0, "collect() is rank 0's");
  if (!ready_.empty()) {
    StepOutput out = std::move(ready_.front());
    ready_.pop_front();
    return out;
  }
  LTM_ASSERT(!in_flight_.empty(), "collect() with no plan in flight");
  const InFlight f = in_flight_.front();
  in_flight_.pop_front();
  StepOutput out;
  CommTimer t(&comm_seconds_);
  out.samples.resize(f.rows);
  comms_.world.recv(out.samples.data(), f.rows * sizeof(SampleResult), last_stage_root_,
                    kTagSamples);
  if (f.want_logits) {
    out.logits.resize(static_cast<size_t>(f.rows) * model_.config().vocab_size);
    comms_.world.recv(out.logits.data(), out.logits.size() * sizeof(float), last_stage_root_,
                      kTagLogits);
  }
  if (f.want_logprobs) {
    out.logprobs.resize(f.rows);
    comms_.world.recv(out.logprobs.data(), f.rows * sizeof(RowLogprobs), last_stage_root_,
                      kTagLogprobs);
  }
  return out;
}

void Engine::shutdown() {
  if (comms_.world.size() == 1) return;
  StepPlan plan;
  plan.kind = PlanKind::kShutdown;
  post_plan(plan);
  comms_.world.flush();
  comms_.pp.flush();
  comms_.pp_device.flush();
}

absl::Status Engine::load_adapter(int32_t id, const std::string& dir, int max_rank,
                                  LoraSummary* summary) {
  LTM_ASSERT(comms_.world.rank() == 0, "load_adapter() is rank 0's");
  LTM_ASSIGN_OR_RETURN(LoraAdapter adapter, LoraAdapter::open(dir, model_.config(), max_rank));
  LTM_RETURN_IF_ERROR(model_.add_adapter(id, adapter));
  if (summary != nullptr) *summary = {adapter.rank(), adapter.alpha(), adapter.modules()};
  StepPlan plan;
  plan.kind = PlanKind::kLoadAdapter;
  plan.adapter_id = id;
  plan.adapter_dir = dir;
  plan.adapter_max_rank = max_rank;
  post_plan(plan);
  return absl::OkStatus();
}

void Engine::unload_adapter(int32_t id) {
  LTM_ASSERT(comms_.world.rank() == 0, "unload_adapter() is rank 0's");
  model_.remove_adapter(id);
  StepPlan plan;
  plan.kind = PlanKind::kUnloadAdapter;
  plan.adapter_id = id;
  post_plan(plan);
}

void Engine::keep_alive() {
  StepPlan plan;
  plan.kind = PlanKind::kKeepAlive;
  post_plan(plan);
}

void Engine::follow() {
  LTM_ASSERT(comms_.world.rank() != 0, "follow() is for ranks other than 0");
  // Waiting for the next plan: no deadline for the first one, then idle_timeout_s_ (a serving
  // rank 0 sends keep-alives while idle); dead peers are detected either way (parallel/watchdog.h,
  // "Waiting for work").
  bool first = true;
  for (;;) {
    int64_t n = 0;
    comms_.world.recv_wait(&n, sizeof(n), 0, kTagPlanSize, first ? 0.0 : idle_timeout_s_);
    first = false;
    std::string bytes(static_cast<size_t>(n), '\0');
    comms_.world.recv(bytes.data(), bytes.size(), 0, kTagPlan);
    absl::StatusOr<StepPlan> plan = decode_plan(bytes);
    LTM_ASSERT(plan.ok(), plan.status().ToString());
    if (plan->kind == PlanKind::kKeepAlive) continue;
    if (plan->kind == PlanKind::kLoadAdapter) {
      // Rank 0 has checked this folder; failing here means this rank sees other files there.
      absl::StatusOr<LoraAdapter> adapter =
          LoraAdapter::open(plan->adapter_dir, model_.config(), plan->adapter_max_rank);
      absl::Status st = adapter.ok() ? model_.add_adapter(plan->adapter_id, *adapter) : adapter.status();
      if (!st.ok())
        parallel::abort_group(1, absl::StrCat(parallel::rank_prefix(), "cannot load the LoRA adapter "
                                              "that rank 0 loaded (the folder must be the same on "
                                              "every rank): ", st.ToString()));
      continue;
    }
    if (plan->kind == PlanKind::kUnloadAdapter) {
      model_.remove_adapter(plan->adapter_id);
      continue;
    }
    if (plan->kind == PlanKind::kShutdown) {
      comms_.world.flush();
      comms_.pp.flush();
      comms_.pp_device.flush();
      return;
    }
    execute(*plan);
  }
}

void Engine::enable_decode_graphs(int max_batch) {
  LTM_ASSERT(backend_.supports_graphs(), "decode graphs on ", backend_.describe());
  graphs_ = std::make_unique<DecodeGraphs>(model_, backend_, cache_, max_batch,
                                           static_cast<int>(model_.config().n_positions));
}

StepOutput Engine::execute(const StepPlan& plan) {
  const ShardSpec& s = model_.shard();
  const StepInput& in = plan.input;
  const int64_t d = model_.config().n_embd;
  const int64_t n = in.n_tokens();
  graph_step_ = graphs_ != nullptr && graphs_->bucket_for(in) > 0;
  float* hidden = nullptr;
  if (graph_step_) {
    hidden = graphs_->hidden();  // the graphs' fixed buffer
  } else {
    const size_t hidden_bytes = static_cast<size_t>(std::max<int64_t>(n, 1) * d) * sizeof(float);
    if (hidden_.bytes() < hidden_bytes) hidden_ = backend_.alloc(hidden_bytes);
    hidden = hidden_.f32();
  }

  // Activations stay on the device: the device communicator orders the transfers on the
  // backend's stream (no host wait here).
  if (!s.is_first_stage()) {
    CommTimer t(&comm_seconds_);
    comms_.pp_device.recv(hidden, n * d * sizeof(float), s.pp_rank - 1, kTagHidden);
  }
  // A few rows (a one-sequence decode, a verify step, a few sequences' decode): on the
  // backend's small-step path (the CPU backend's step team), and on the last stage the logits and
  // the sampler in the same step where the rows' logits are few (kSmallSampleFloats): one team
  // (one OpenMP region) for the whole step instead of one for the stage and one or two more for
  // the logits and the sampler (kjv-small, Zen 5 VM: one-row and 6-row steps ~2% cheaper). Their
  // rows are then sampled one after another on the step's thread (a region inside the team runs
  // on it alone), which is where the sampler's checks may throw; with more rows or a larger
  // vocab the sampler keeps its own region over the threads.
  const bool small = n >= 1 && n <= Backend::kSmallStepRows && !graph_step_;
  const bool one_row = small && n == 1;
  const bool sample_in_step = s.is_last_stage() && small &&
                              (one_row || n * model_.config().vocab_size <= kSmallSampleFloats);
  StepOutput out;
  std::vector<float> full;
  const auto sample = [&] {
    out.samples = sample_last_stage(plan, plan.want_logits ? &full : nullptr, &out.logprobs);
  };
  if (graph_step_) {
    graphs_->run(in);  // the stage (and, last, the logits) as its bucket's graph
  } else if (small) {
    backend_.run_small_step([&] {
      model_.run_stage(in, hidden, cache_);
      if (sample_in_step) sample();
    });
  } else {
    model_.run_stage(in, hidden, cache_);
  }
  if (!s.is_last_stage()) {
    CommTimer t(&comm_seconds_);
    comms_.pp_device.post(hidden, n * d * sizeof(float), s.pp_rank + 1, kTagHidden);
  }

  const int world_rank = comms_.world.rank();
  const int m = static_cast<int>(in.logit_rows.size());
  if (s.is_last_stage()) {
    if (!sample_in_step) sample();
    if (s.tp_rank == 0 && world_rank != 0) {
      CommTimer t(&comm_seconds_);
      comms_.world.post(out.samples.data(), m * sizeof(SampleResult), 0, kTagSamples);
      if (plan.want_logits)
        comms_.world.post(full.data(), full.size() * sizeof(float), 0, kTagLogits);
      if (!out.logprobs.empty())
        comms_.world.post(out.logprobs.data(), m * sizeof(RowLogprobs), 0, kTagLogprobs);
    }
    out.logits = std::move(full);
  }
  return out;
}

std::vector<SampleResult> Engine::sample_last_stage(const StepPlan& plan,
                                                    std::vector<float>* full_logits,
                                                    std::vector<RowLogprobs>* logprobs) {
  const ShardSpec& s = model_.shard();
  const StepInput& in = plan.input;
  const int64_t m = static_cast<int64_t>(in.logit_rows.size());
  const int64_t vl = model_.vocab_local();
  const int64_t V = model_.config().vocab_size;
  std::vector<SampleResult> samples(m);
  if (m == 0) return samples;
  const size_t bytes = static_cast<size_t>(m * vl) * sizeof(float);
  const float* device_logits = nullptr;
  if (graph_step_) {
    device_logits = graphs_->logits();  // computed by the graph: rows 0 .. m-1
  } else {
    if (logits_.bytes() < bytes) logits_ = backend_.alloc(bytes);
    model_.compute_logits(in, hidden_.f32(), logits_.f32());
    device_logits = logits_.f32();
  }
  // The step's host wait: the device communicators' collectives and receives were enqueued with
  // no host wait; settle() waits for them under the watchdog (a hung one is named and the group
  // aborted) before the copies below wait for the stream.
  comms_.tp_device.settle();
  comms_.pp_device.settle();
  const bool want_logprobs = plan_wants_logprobs(plan);
  // The whole vocab here and only tokens (and each token's logprob) asked for: the backend
  // samples where the logits lie, and only ids come back (sample_on_backend).
  if (s.tp == 1 && full_logits == nullptr && !want_logprobs) {
    sample_on_backend(plan, device_logits, &samples);
    return samples;
  }
  // With tp > 1 each rank's candidates come back, not its slice of the rows.
  if (s.tp > 1 && full_logits == nullptr && !want_logprobs) {
    samples_from_candidates(plan, device_logits, &samples);
    return samples;
  }
  // On the CPU backend the logits buffer itself (no copy of m x vocab floats per step).
  host_rows_ = static_cast<const float*>(backend_.read_on_host(device_logits, bytes, host_logits_));

  // The full vocabulary of every row: this rank's slice when tp = 1, else gathered (only when the
  // caller wants the logits themselves, e.g. --dump-logits, or logprobs with alternatives: their
  // top-n is taken here, so what travels on to rank 0 is O(n) per row).
  std::vector<float> gathered;
  const float* rows = host_rows_;
  int64_t stride = vl;
  if (s.tp > 1) {
    std::vector<float> all(static_cast<size_t>(s.tp * m * vl));
    {
      CommTimer t(&comm_seconds_);
      comms_.tp.all_gather(host_rows_, all.data(), bytes);
    }
    gathered.resize(static_cast<size_t>(m * s.tp * vl));
    for (int r = 0; r < s.tp; ++r)
      for (int64_t i = 0; i < m; ++i)
        std::memcpy(gathered.data() + i * s.tp * vl + r * vl, all.data() + (r * m + i) * vl,
                    vl * sizeof(float));
    rows = gathered.data();
    stride = s.tp * vl;
  }
  if (want_logprobs) logprobs->assign(static_cast<size_t>(m), RowLogprobs{});
  for_each_row(m, backend_.host_threads(), [&](int64_t i, std::vector<float>& scratch) {
    const RowSampling& rs = plan.sampling[i];
    const std::span<const float> row(rows + i * stride, V);
    thread_local std::vector<int32_t> top_scratch;  // row_logprobs' best-k list
    if (rs.target >= 0) {  // a scoring row: the target's logprob, nothing drawn
      const RowLogprobs lp = row_logprobs(row, rs.target, std::max(rs.top_n, 0), &top_scratch);
      samples[i] = lp.ok() ? SampleResult{lp.token, lp.logprob} : SampleResult::failed(
                                                                     static_cast<RowError>(lp.token));
      (*logprobs)[i] = lp;
      return;
    }
    Rng rng = token_rng(rs.params.seed, rs.token_index);
    samples[i] = sample(row, rs.params, rs.history, rng, &scratch, rs.want_logprob);
    if (rs.top_n >= 0 && samples[i].ok()) {
      (*logprobs)[i] = row_logprobs(row, samples[i].token, rs.top_n, &top_scratch);
    } else if (rs.top_n >= 0) {
      (*logprobs)[i].token = samples[i].token;  // the row's error
    }
  });
  if (full_logits) {
    full_logits->resize(static_cast<size_t>(m * V));
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(full_logits->data() + i * V, rows + i * stride, V * sizeof(float));
  }
  return samples;
}

// The step's rows sampled by the backend's op (Backend::sample_rows) on the logits where they
// lie: the rows' parameters and histories go to the device in one staged copy, and the tokens
// (and their logprobs, only when a row asks) come back in one copy.
const SampleRowParams* Engine::stage_sample_params(const StepPlan& plan, const int32_t** history_out,
                                                   bool* any_logprob) {
  const int64_t m = static_cast<int64_t>(plan.input.logit_rows.size());
  // Host bytes: [m] SampleRowParams, then every row's history ids.
  const size_t params_bytes = static_cast<size_t>(m) * sizeof(SampleRowParams);
  size_t history_ids = 0;
  for (const RowSampling& rs : plan.sampling)
    if (rs.params.repetition_penalty != 1.0f) history_ids += rs.history.size();
  sample_in_host_.resize(params_bytes + history_ids * sizeof(int32_t));
  auto* params = reinterpret_cast<SampleRowParams*>(sample_in_host_.data());
  auto* history = reinterpret_cast<int32_t*>(sample_in_host_.data() + params_bytes);
  *any_logprob = false;
  int32_t offset = 0;
  for (int64_t i = 0; i < m; ++i) {
    const RowSampling& rs = plan.sampling[i];
    SampleRowParams p;
    p.temperature = rs.params.temperature;
    p.top_k = rs.params.top_k;
    p.top_p = rs.params.top_p;
    p.repetition_penalty = rs.params.repetition_penalty;
    p.seed = rs.params.seed;
    p.token_index = rs.token_index;
    p.want_logprob = rs.want_logprob ? 1 : 0;
    if (rs.params.repetition_penalty != 1.0f) {
      p.history_offset = offset;
      p.history_count = static_cast<int32_t>(rs.history.size());
      std::memcpy(history + offset, rs.history.data(), rs.history.size() * sizeof(int32_t));
      offset += p.history_count;
    }
    std::memcpy(params + i, &p, sizeof(p));
    *any_logprob = *any_logprob || rs.want_logprob;
  }
  const auto* staged = static_cast<const unsigned char*>(
      backend_.stage_bytes(sample_in_host_.data(), sample_in_host_.size(), sample_in_));
  *history_out =
      history_ids > 0 ? reinterpret_cast<const int32_t*>(staged + params_bytes) : nullptr;
  return reinterpret_cast<const SampleRowParams*>(staged);
}

void Engine::sample_on_backend(const StepPlan& plan, const float* device_logits,
                               std::vector<SampleResult>* samples) {
  const int64_t m = static_cast<int64_t>(plan.input.logit_rows.size());
  const int64_t V = model_.config().vocab_size;
  bool any_logprob = false;
  const int32_t* history = nullptr;
  const SampleRowParams* params = stage_sample_params(plan, &history, &any_logprob);
  // Out: [m] tokens, then [m] logprobs; only the part asked for comes back.
  const size_t out_bytes = static_cast<size_t>(m) * (sizeof(int32_t) + sizeof(float));
  if (sample_out_.bytes() < out_bytes) sample_out_ = backend_.alloc(out_bytes);
  SampleRowsArgs args;
  args.rows = static_cast<int32_t>(m);
  args.vocab = V;
  args.stride = model_.vocab_local();
  args.logits = device_logits;
  args.params = params;
  args.history = history;
  args.tokens = sample_out_.i32();
  args.logprobs = any_logprob ? reinterpret_cast<float*>(sample_out_.i32() + m) : nullptr;
  backend_.sample_rows(args);
  const size_t back = static_cast<size_t>(m) * (any_logprob ? 8 : 4);
  const auto* got = static_cast<const unsigned char*>(
      backend_.read_on_host(sample_out_.data(), back, host_samples_));
  for (int64_t i = 0; i < m; ++i) {
    SampleResult& r = (*samples)[i];
    std::memcpy(&r.token, got + i * sizeof(int32_t), sizeof(int32_t));
    // A token outside the vocab that is no RowError is a backend bug (or a host read before
    // the stream got there: devsim's poison): never hand it on as a token.
    LTM_ASSERT(r.token < V && r.token >= static_cast<int32_t>(RowError::kAllNegInf),
               "the backend's sample op returned token ", r.token, " for row ", i,
               " (vocab ", V, ")");
    if (any_logprob) {
      std::memcpy(&r.logprob, got + (m + i) * sizeof(float), sizeof(float));
    } else {
      r.logprob = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

// Vocab-parallel sampling: each TP rank of the last stage reduces its slice of every row to the
// candidates sampling needs (1 for greedy, top_k with top-k, all of its valid ids only for top-p
// without top-k) plus a partial softmax normalizer, and sends them to tp_rank 0, which samples.
// The result equals sample() on the whole row (runtime/sampling/sampler.h).
void Engine::samples_from_candidates(const StepPlan& plan, const float* device_logits,
                                     std::vector<SampleResult>* samples) {
  const ShardSpec& s = model_.shard();
  const int64_t m = static_cast<int64_t>(plan.input.logit_rows.size());
  const int64_t vl = model_.vocab_local();
  const parallel::Range vocab = model_.vocab_rows();
  const int32_t valid = static_cast<int32_t>(parallel::valid_rows(vocab, model_.config().vocab_size));
  // The backend selects each row's candidates where the logits lie (Backend::select_candidates);
  // only they come back, in one copy.
  bool any_logprob = false;
  CandidateRowsArgs args;
  args.rows = static_cast<int32_t>(m);
  args.valid = valid;
  args.stride = vl;
  args.id_begin = static_cast<int32_t>(vocab.begin);
  args.logits = device_logits;
  args.params = stage_sample_params(plan, &args.history, &any_logprob);
  const SampleRowParams* host_params = reinterpret_cast<const SampleRowParams*>(sample_in_host_.data());
  const size_t out_bytes = static_cast<size_t>(candidate_rows_bytes(host_params, args.rows, valid));
  if (candidates_out_.bytes() < std::max<size_t>(out_bytes, 1))
    candidates_out_ = backend_.alloc(std::max<size_t>(out_bytes, 1));
  args.out = candidates_out_.data();
  backend_.select_candidates(args);
  const void* got = backend_.read_on_host(candidates_out_.data(), out_bytes, host_samples_);
  // One blob per rank for the whole batch (runtime/engine/candidate_exchange.h).
  std::vector<CandidateSet> sets(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i)
    read_candidate_row(got, host_params, args.rows, valid, args.id_begin, static_cast<int32_t>(i),
                       &sets[i]);
  std::string blob;
  for (const CandidateSet& set : sets) append_candidates(set, &blob);
  CommTimer t(&comm_seconds_);
  if (s.tp_rank != 0) {
    int64_t size = static_cast<int64_t>(blob.size());
    comms_.tp.send(&size, sizeof(size), 0, kTagCandidates);
    comms_.tp.send(blob.data(), blob.size(), 0, kTagCandidates);
    return;
  }
  std::vector<std::string> blobs(s.tp);
  blobs[0] = std::move(blob);
  for (int r = 1; r < s.tp; ++r) {
    int64_t size = 0;
    comms_.tp.recv(&size, sizeof(size), r, kTagCandidates);
    blobs[r].resize(static_cast<size_t>(size));
    comms_.tp.recv(blobs[r].data(), blobs[r].size(), r, kTagCandidates);
  }
  std::vector<size_t> pos(s.tp, 0);
  std::vector<Candidate> candidates;
  std::vector<LogNormalizer> norms(s.tp);
  for (int64_t i = 0; i < m; ++i) {
    candidates.clear();
    for (int r = 0; r < s.tp; ++r) {
      const absl::Status read = read_candidates(blobs[r], &pos[r], &norms[r], &candidates);
      LTM_ASSERT(read.ok(), "candidates from tp rank ", r, ": ", read.ToString());
    }
    const RowSampling& rs = plan.sampling[i];
    Rng rng = token_rng(rs.params.seed, rs.token_index);
    (*samples)[i] = sample_from_candidates(candidates, combine_normalizers(norms, rs.params),
                                           rs.params, rng);
  }
}

}  // namespace ltm
