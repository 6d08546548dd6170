// Engine: runs one forward step on every rank of the group, as rank 0 plans it.
//
// Rank 0 calls step(plan): the plan is posted to all ranks (without waiting for them); each pipeline stage runs its
// layers (receiving activations from the previous stage, sending to the next); the last stage
// computes its vocab slice of the logits, the TP ranks of the last stage combine what sampling
// needs, and the sampled ids travel back to rank 0. Every other rank sits in follow(), executing
// plans until rank 0 calls shutdown().
// Threading: step()/shutdown() from one thread on rank 0 only; follow() on the other ranks.
// Failure: communication failures and timeouts abort the whole group (parallel/ watchdog).
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/model/decode_graphs.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/sampling/sampler.h"
#include "runtime/engine/step_engine.h"
#include "runtime/engine/step_plan.h"

namespace ltm {

// Two communicators per group: a host one (MPI, host memory: plans, sampling candidates, gathered
// logits, samples) and a device one for activations (the backend's memory, ordered on its
// stream: NCCL for CUDA, the devsim communicator for the emulated device, the same MPI
// communicator again for the CPU backend, whose device memory is host memory). The engine never
// asks which: the launcher picks (launcher/model_setup.cpp, device_comm).
struct Comms {
  parallel::Communicator& world;
  parallel::Communicator& tp;         // this rank's TP group (same stage), host memory
  parallel::Communicator& pp;         // this rank's PP group (same tp_rank), host memory
  parallel::Communicator& tp_device;  // the TP group on device memory (the model's all-reduces)
  parallel::Communicator& pp_device;  // the PP group on device memory (`hidden` between stages)
};

class Engine final : public StepEngine {
 public:
  Engine(Model& model, Backend& backend, KvCache& cache, Comms comms);

  // Rank 0: runs `plan` on every rank and returns the sampled tokens (submit + collect).
  StepOutput step(const StepPlan& plan);
  // Rank 0, pipelined: submit() posts a plan to every rank and runs rank 0's stage on it, then returns
  // while the later stages work; collect() returns the oldest submitted plan's samples (waiting
  // for the last stage). With pp stages up to pp plans (micro-batches) keep every stage busy.
  // A plan with want_logits should be collected before the next submit (its logits are large).
  void submit(const StepPlan& plan) override;
  StepOutput collect() override;
  int in_flight() const override { return static_cast<int>(ready_.size() + in_flight_.size()); }
  // Rank 0, between steps: loads the PEFT adapter at `dir` as `id` (> 0, unused) on every rank.
  // Rank 0 opens and checks the whole adapter (runtime/model/lora.h) and loads its own slices
  // first; only then does a kLoadAdapter plan tell the other ranks to load theirs, so a defective
  // adapter is refused with the error and no other rank sees it. The folder must be readable at
  // the same path on every rank (as the checkpoint): a rank that then cannot load it takes the
  // group down with a message naming it. Later plans naming `id` reach every rank after it.
  absl::Status load_adapter(int32_t id, const std::string& dir, int max_rank,
                            LoraSummary* summary = nullptr) override;
  // Rank 0: frees adapter `id` on every rank. No step still to be submitted may name it.
  void unload_adapter(int32_t id) override;
  // Rank 0: releases the other ranks from follow().
  void shutdown();
  // Rank 0, while idle: a plan with nothing to run, which resets the other ranks' idle timeout.
  void keep_alive() override;
  // Other ranks: once the first plan has arrived, waiting longer than `seconds` for the next one
  // means rank 0 is stuck, and takes the group down (watchdog message, non-zero exit). <= 0 (the
  // default): wait for ever. The first plan may take any time (rank 0 may still be loading).
  void set_idle_timeout(double seconds) { idle_timeout_s_ = seconds; }
  // Other ranks: executes the posted plans until shutdown.
  void follow();

  // Decode steps of up to `max_batch` sequences run as captured graphs (--cuda-graphs;
  // runtime/model/decode_graphs.h), on every rank alike; the backend must support_graphs().
  // Call before the first step.
  void enable_decode_graphs(int max_batch);
  // Decode graphs captured and replayed so far on this rank (0 without them).
  int decode_graphs() const { return graphs_ ? graphs_->graphs() : 0; }
  int64_t decode_graph_replays() const { return graphs_ ? graphs_->replays() : 0; }

  // Seconds spent in communication on this rank (plan posting excluded), for benchmarks.
  double comm_seconds() const { return comm_seconds_; }
  // Seconds this rank's stage spent in tensor-parallel all-reduces (Model::allreduce_seconds).
  double allreduce_seconds() const override { return model_.allreduce_seconds(); }

 private:
  // A small step's rows x vocab up to which its logits and sampler run in the step's team
  // (execute): models/kjv-small's verify steps (6 x 4096), GPT-2's one-row decode (50257).
  static constexpr int64_t kSmallSampleFloats = 65536;
  StepOutput execute(const StepPlan& plan);
  void post_plan(const StepPlan& plan);
  std::vector<SampleResult> sample_last_stage(const StepPlan& plan, std::vector<float>* full_logits,
                                              std::vector<RowLogprobs>* logprobs);
  // Last stage, tp > 1: each rank's candidates (the backend's select_candidates on
  // `device_logits`), exchanged on the host communicator; tp_rank 0 samples.
  void samples_from_candidates(const StepPlan& plan, const float* device_logits,
                               std::vector<SampleResult>* samples);
  // Last stage, tp 1: the backend's sample op on `device_logits` [rows, vocab_local].
  void sample_on_backend(const StepPlan& plan, const float* device_logits,
                         std::vector<SampleResult>* samples);
  // The rows' SampleRowParams, then their histories, staged in one copy (sample_in_): the
  // device copy; *any_logprob: a row wants its token's logprob.
  const SampleRowParams* stage_sample_params(const StepPlan& plan, const int32_t** history,
                                             bool* any_logprob);

  Model& model_;
  Backend& backend_;
  KvCache& cache_;
  Comms comms_;
  int last_stage_root_ = 0;  // world rank of the last stage's tp_rank 0
  struct InFlight {
    int rows;
    bool want_logits;
    bool want_logprobs;
  };
  std::deque<InFlight> in_flight_;  // submitted plans whose samples the last stage will send
  std::deque<StepOutput> ready_;    // results already here (rank 0 is on the last stage)
  DeviceBuffer hidden_;      // [n_tokens, d]
  DeviceBuffer logits_;      // [rows, vocab_local]
  std::vector<unsigned char> host_logits_;  // the logits' host copy (a device backend)
  const float* host_rows_ = nullptr;  // this step's logits on the host: logits_ itself on the CPU
  std::unique_ptr<DecodeGraphs> graphs_;  // null: every step eager
  bool graph_step_ = false;  // this step ran from a graph: its hidden and logits are graphs_'s
  std::vector<unsigned char> sample_in_host_;  // sample_on_backend: params + histories (host)
  DeviceBuffer sample_in_;                     // their device copy (Backend::stage_bytes)
  DeviceBuffer sample_out_;                    // [rows] tokens, then [rows] logprobs
  DeviceBuffer candidates_out_;                // select_candidates' output
  std::vector<unsigned char> host_samples_;    // what comes back of sample_out_
  double comm_seconds_ = 0;
  double idle_timeout_s_ = 0;
};

// The random stream for a request's `token_index`-th token.
Rng token_rng(uint64_t seed, int32_t token_index);

}  // namespace ltm
