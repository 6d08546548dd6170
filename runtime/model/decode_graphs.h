// DecodeGraphs: decode steps replayed from captured graphs (CUDA graphs; --cuda-graphs).
//
// A decode step (one new token per sequence, no LoRA adapter) of `n` sequences runs as the graph
// of its bucket (runtime/backend/graph_buckets.h: 1, 2, 4, then multiples of 8 up to
// --max-running): the step's arrays are padded to the bucket and copied, in one copy, into input
// buffers at fixed addresses; the graph then runs this stage's forward pass (Model::forward)
// and, on the last stage, the logits of every row (Model::logits_from), sampling staying outside
// the graph. The first step of a bucket captures its graph (Backend::capture: it runs once as
// usual, then is recorded); later ones replay it. Anything else (prefill, a mixed batch, an
// adapter, a batch above the largest bucket, a block table wider than the graphs') runs eagerly.
//
// Padding rows (n .. bucket-1): token 0 at position 0, one new token over a context of 1 (their
// block-table row is all block 0, which they read and never write: slot -1), logit row = the
// row itself. Their outputs are ignored; every op is row-independent, so a replay gives the n
// real rows what the same padded step gives them run eagerly, bit for bit (the decode attention
// of a sequence does not depend on the split hint: partitions past its context do nothing, and
// one partition merged is the unsplit result). Against the unpadded eager step a GPU may differ
// in rounding: cuBLAS may choose another algorithm for another row count.
//
// Fixed for every graph: `hidden` [max bucket, d], the logits [max bucket, vocab_local], the
// activation workspace (Model::Workspace for the largest bucket) and the input buffers, all
// allocated before the first capture and never reallocated; the backend's own scratch belongs to
// each graph (Backend::capture). The attention hints are those of the longest context
// (max_context), so a graph's grid and workspace fit every step of its bucket.
//
// Threading: the step thread, like the Model. Failure: as the backend's and communicators'.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/step_input.h"

namespace ltm {

class DecodeGraphs {
 public:
  // `max_batch`: the largest decode batch (--max-running); `max_context`: the longest context a
  // sequence may reach (the model's n_positions). `backend.supports_graphs()` must hold.
  DecodeGraphs(Model& model, Backend& backend, KvCache& cache, int max_batch, int max_context);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // The bucket `step` runs in, or 0 when it runs eagerly (see above). The same answer on every
  // rank for the same step.
  int bucket_for(const StepInput& step) const;
  // [max bucket, d] device: a graph step's input (stages after the first receive into its first
  // n rows) and output (the stage's result in the first n rows).
  float* hidden();
  // Runs `step` (bucket_for(step) > 0) on hidden(): captures its bucket's graph the first time,
  // replays it afterwards. On the last stage, logits() then holds its rows' logits.
  void run(const StepInput& step);
  // [n, vocab_local] device (rows of step.logit_rows = 0 .. n-1), after run() on the last stage.
  const float* logits() const { return logits_.f32(); }

  int max_bucket() const { return buckets_.empty() ? 0 : buckets_.back(); }
  int graphs() const { return static_cast<int>(graphs_.size()); }
  int64_t replays() const { return replays_; }

 private:
  void allocate();

  Model& model_;
  Backend& backend_;
  KvCache& cache_;
  std::vector<int> buckets_;
  int table_width_ = 0;  // block-table columns of every graph: ceil(max_context / block size)
  std::map<int, std::unique_ptr<BackendGraph>> graphs_;  // by bucket
  int64_t replays_ = 0;
  bool allocated_ = false;
  DeviceBuffer hidden_;  // [max bucket, d]
  DeviceBuffer logits_;  // [max bucket, vocab_local]  last stage
  DeviceBuffer inputs_;  // int32 sections, each at a fixed offset (decode_graphs.cpp)
  Model::Workspace ws_;
  std::vector<int32_t> host_inputs_;  // the padded arrays on their way to inputs_
};

}  // namespace ltm
