// Decode steps for the decode-graph tests (decode_graphs_devsim_test on the emulated device,
// cuda_graphs_gpu_test on a GPU): a small random model, three sequences prefilled eagerly, then
// decode steps over changing sets of them, with or without DecodeGraphs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/model/decode_graphs.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"

namespace ltm {

inline ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 101;
  c.n_positions = 64;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_inner = 128;
  return c;
}

inline constexpr int kBlock = 4;
inline constexpr int kBlocksPerSeq = 4;

// Three sequences (prompts of 5, 3 and 6 tokens, prefilled eagerly one by one), then decode
// steps over changing sets of them: {0,1,2} (bucket 4, one padding row), {0,2} (bucket 2),
// {0,1,2} (bucket 4 again: a replay), {1} (bucket 1), {0,1,2}. Returns each decode step's
// logits ([rows, vocab] read on the host) and, with graphs, how many were captured and replayed.
struct DecodeRun {
  std::vector<std::vector<float>> logits;
  int graphs = 0;
  int64_t replays = 0;
};

// The decode steps' sets of sequences, and their buckets: 4 (one padding row), 2, 4 (a replay),
// 1, 4 (a replay).
inline const std::vector<std::vector<int>>& decode_steps() {
  static const std::vector<std::vector<int>> steps = {{0, 1, 2}, {0, 2}, {0, 1, 2}, {1}, {0, 1, 2}};
  return steps;
}

// `repeat_first`: run the first decode step twice (the second time from the graph the first
// captured, over the same inputs: it rewrites the same cache slots with the same values).
inline DecodeRun run_decode(Backend& backend, bool graphs, Precision weights = Precision::kF32,
                            Precision kv = Precision::kF32, bool repeat_first = false) {
  const ModelConfig config = small_config();
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<WeightSource> source = make_random_source(config, 11, 0.3f);
  ModelOptions options;
  options.weights = weights;
  auto loaded = Model::load(*source, backend, ShardSpec{}, tp, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  Model& model = **loaded;
  KvCache cache(backend, config.n_layer, config.n_head, config.head_dim(), kBlock,
                3 * kBlocksPerSeq + 1, kv);
  std::unique_ptr<DecodeGraphs> dg;
  if (graphs) dg = std::make_unique<DecodeGraphs>(model, backend, cache, 8, config.n_positions);
  // Sequence s owns blocks 1 + s*4 .. 4 + s*4 (block 0 stays free: the padding rows read it).
  auto table = [](int s) {
    std::vector<int32_t> t;
    for (int b = 0; b < kBlocksPerSeq; ++b) t.push_back(1 + s * kBlocksPerSeq + b);
    return t;
  };
  auto slot = [&](int s, int pos) { return table(s)[pos / kBlock] * kBlock + pos % kBlock; };
  std::vector<int> len = {0, 0, 0};
  DeviceBuffer hidden = backend.alloc(16 * config.n_embd * sizeof(float));
  DeviceBuffer logits = backend.alloc(8 * config.vocab_size * sizeof(float));
  std::vector<unsigned char> staging;
  const std::vector<int> prompt = {5, 3, 6};
  for (int s = 0; s < 3; ++s) {  // prefill, eager
    StepInput in;
    in.max_blocks_per_seq = kBlocksPerSeq;
    in.token_offsets = {0, prompt[s]};
    for (int j = 0; j < prompt[s]; ++j) {
      in.token_ids.push_back((7 * s + 13 * j + 1) % config.vocab_size);
      in.positions.push_back(j);
      in.slot_mapping.push_back(slot(s, j));
    }
    in.context_lens = {prompt[s]};
    in.block_tables = table(s);
    in.logit_rows = {prompt[s] - 1};
    if (dg) {
      EXPECT_EQ(dg->bucket_for(in), 0) << "a prefill step went to a graph";
    }
    model.run_stage(in, hidden.f32(), cache);
    len[s] = prompt[s];
  }
  DecodeRun run;
  std::vector<std::vector<int>> steps = decode_steps();
  if (repeat_first) steps.insert(steps.begin(), steps.front());
  for (size_t k = 0; k < steps.size(); ++k) {
    const std::vector<int>& seqs = steps[k];
    const bool again = repeat_first && k == 0;  // run this step's inputs once more next
    const int n = static_cast<int>(seqs.size());
    StepInput in;
    in.max_blocks_per_seq = kBlocksPerSeq;
    in.token_offsets.push_back(0);
    for (int i = 0; i < n; ++i) {
      const int s = seqs[i];
      const int index = static_cast<int>(k) - (repeat_first && k > 0 ? 1 : 0);  // the step's
      in.token_ids.push_back((31 * s + 5 * index + 2) % config.vocab_size);
      in.positions.push_back(len[s]);
      in.slot_mapping.push_back(slot(s, len[s]));
      in.token_offsets.push_back(i + 1);
      in.context_lens.push_back(len[s] + 1);
      const std::vector<int32_t> t = table(s);
      in.block_tables.insert(in.block_tables.end(), t.begin(), t.end());
      in.logit_rows.push_back(i);
      if (!again) ++len[s];
    }
    const float* out = nullptr;
    const size_t bytes = static_cast<size_t>(n) * config.vocab_size * sizeof(float);
    if (dg) {
      EXPECT_GT(dg->bucket_for(in), 0) << "decode step " << k << " ran eagerly";
      dg->run(in);
      out = static_cast<const float*>(backend.read_on_host(dg->logits(), bytes, staging));
    } else {
      model.run_stage(in, hidden.f32(), cache);
      model.compute_logits(in, hidden.f32(), logits.f32());
      out = static_cast<const float*>(backend.read_on_host(logits.data(), bytes, staging));
    }
    run.logits.emplace_back(out, out + static_cast<size_t>(n) * config.vocab_size);
  }
  if (dg) {
    run.graphs = dg->graphs();
    run.replays = dg->replays();
  }
  return run;
}

}  // namespace ltm
