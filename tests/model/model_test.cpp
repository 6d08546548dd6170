// The model's batching and KV cache against itself: a batch that mixes sequences of different
// lengths, some in prefill and some in decode, with scattered block tables, gives each sequence
// the logits it gets alone; decoding through the cache equals recomputing the whole prefix.
// (The comparison with an independent PyTorch reference is tests/python/test_reference_model.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/cpu_backend.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"

namespace ltm {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 101;
  c.n_positions = 64;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_inner = 128;
  return c;
}

struct Fixture {
  ModelConfig config = small_config();
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<WeightSource> source = make_random_source(config, 7, 0.2f);
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  static constexpr int kBlock = 4;
  Fixture() {
    auto m = Model::load(*source, *backend, ShardSpec{}, tp);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(*m);
    cache = std::make_unique<KvCache>(*backend, 2, 4, 8, kBlock, 80);
  }
};

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int32_t computed = 0;
};

// Runs one step over `seqs`, each taking its next `chunk[i]` tokens; returns the logits of each
// sequence's last new row.
std::vector<std::vector<float>> run_step(Fixture& f, std::vector<Seq*> seqs,
                                         std::vector<int32_t> chunk) {
  StepInput in;
  int32_t max_blocks = 0;
  for (Seq* s : seqs) max_blocks = std::max<int32_t>(max_blocks, s->blocks.size());
  in.max_blocks_per_seq = max_blocks;
  in.token_offsets.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq* s = seqs[i];
    for (int32_t j = 0; j < chunk[i]; ++j) {
      const int32_t pos = s->computed + j;
      in.token_ids.push_back(s->tokens[pos]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(s->blocks[pos / Fixture::kBlock] * Fixture::kBlock +
                                pos % Fixture::kBlock);
    }
    in.token_offsets.push_back(in.n_tokens());
    in.context_lens.push_back(s->computed + chunk[i]);
    for (int32_t b = 0; b < max_blocks; ++b)
      in.block_tables.push_back(b < static_cast<int32_t>(s->blocks.size()) ? s->blocks[b] : 0);
    in.logit_rows.push_back(in.n_tokens() - 1);
  }
  std::vector<float> hidden(in.n_tokens() * f.config.n_embd);
  f.model->run_stage(in, hidden.data(), *f.cache);
  std::vector<float> logits(seqs.size() * f.model->vocab_local());
  f.model->compute_logits(in, hidden.data(), logits.data());
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    out.emplace_back(logits.begin() + i * f.model->vocab_local(),
                     logits.begin() + (i + 1) * f.model->vocab_local());
    seqs[i]->computed += chunk[i];
  }
  return out;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The cache takes its K and V memory through Backend::alloc_kv_cache (the CPU backend's is on
// huge pages: tests/kernels/weight_slabs_test.cpp), one buffer each a layer.
TEST(KvCache, TakesItsMemoryThroughAllocKvCache) {
  struct Counting : CpuBackend {
    Counting() : CpuBackend(1) {}
    std::vector<size_t> sizes;
    std::vector<const void*> taken, made_resident;
    DeviceBuffer alloc_kv_cache(size_t bytes) override {
      sizes.push_back(bytes);
      DeviceBuffer b = CpuBackend::alloc_kv_cache(bytes);
      taken.push_back(b.data());
      return b;
    }
    void make_resident(const DeviceBuffer& b) override {
      made_resident.push_back(b.data());
      CpuBackend::make_resident(b);
    }
  } backend;
  {
    KvCache cache(backend, 3, 4, 8, 16, 10, Precision::kF16);
    EXPECT_EQ(backend.sizes, std::vector<size_t>(6, size_t{10} * 4 * 16 * 8 * 2));
    EXPECT_EQ(cache.n_blocks(), 10);
    EXPECT_TRUE(backend.made_resident.empty());  // faulted in as used, by default
  }
  // --kv-resident: every buffer it took is made resident.
  backend.taken.clear();
  KvCache resident(backend, 3, 4, 8, 16, 10, Precision::kF16, /*resident=*/true);
  EXPECT_EQ(backend.made_resident, backend.taken);
  EXPECT_EQ(backend.taken.size(), 6u);
}

TEST(Model, DecodeThroughCacheEqualsFullRecompute) {
  Fixture f;
  std::vector<int32_t> tokens = {5, 17, 3, 99, 42, 8, 64, 23, 11, 77, 2, 50};
  // Incremental: prefill 5, then one token at a time.
  Seq inc{tokens, {9, 3, 14}, 0};
  std::vector<std::vector<float>> steps;
  steps.push_back(run_step(f, {&inc}, {5})[0]);
  for (int i = 5; i < 12; ++i) steps.push_back(run_step(f, {&inc}, {1})[0]);
  // Full recompute of each prefix in fresh blocks.
  for (int n = 5; n <= 12; ++n) {
    Seq full{std::vector<int32_t>(tokens.begin(), tokens.begin() + n), {30, 31, 32}, 0};
    const auto want = run_step(f, {&full}, {n})[0];
    const float d = max_diff(steps[n - 5], want);
    EXPECT_LT(d, 1e-5) << "prefix " << n;
  }
}

TEST(Model, MatrixPrefillEqualsTiledDecode) {
  // Prefill chunks of >= 16 rows take the GEMM path, shorter ones the tiled loop: the same
  // sequence computed either way gives the same logits.
  Fixture f;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 45; ++i) tokens.push_back((i * 37 + 11) % 101);
  Seq a{tokens, {3, 17, 8, 25, 1, 40, 33, 12, 9, 2, 60, 61}, 0};
  Seq b{tokens, {50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 62, 63}, 0};
  const auto whole = run_step(f, {&a}, {45})[0];           // one matrix-form prefill
  run_step(f, {&b}, {20});                                 // matrix chunk
  run_step(f, {&b}, {10});                                 // tiled chunk
  for (int i = 0; i < 14; ++i) run_step(f, {&b}, {1});     // decodes
  const auto last = run_step(f, {&b}, {1})[0];
  EXPECT_LT(max_diff(whole, last), 1e-5);
}

TEST(Model, MixedBatchEqualsEachSequenceAlone) {
  Fixture f;
  Seq a{{1, 2, 3, 4, 5, 6, 7}, {0, 7}, 0};
  Seq b{{9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11}, {12, 2, 5}, 0};
  Seq c{{33, 44}, {20}, 0};
  // Alone.
  Seq a1 = a, b1 = b, c1 = c;
  a1.blocks = {40, 41};
  b1.blocks = {42, 43, 44};
  c1.blocks = {45};
  auto la = run_step(f, {&a1}, {6});
  auto la2 = run_step(f, {&a1}, {1});
  auto lb = run_step(f, {&b1}, {11});
  auto lc = run_step(f, {&c1}, {2});
  // Together: a decodes its 7th token, b prefills in two chunks, c prefills at once.
  run_step(f, {&a}, {6});
  auto mixed1 = run_step(f, {&a, &b, &c}, {1, 4, 2});
  auto mixed2 = run_step(f, {&b}, {7});
  EXPECT_LT(max_diff(mixed1[0], la2[0]), 1e-5);
  EXPECT_LT(max_diff(mixed1[2], lc[0]), 1e-5);
  EXPECT_LT(max_diff(mixed2[0], lb[0]), 1e-5);
}

TEST(Model, RandomWeightsAreTheSameSliceByFromAnyLayout) {
  // A tp=2 rank's slice of c_attn equals the matching columns of the whole tensor.
  ModelConfig c = small_config();
  auto src = make_random_source(c, 3, 0.02f);
  std::vector<float> whole(c.n_embd * 3 * c.n_embd), part(c.n_embd * 8);
  src->read_f32("h.1.attn.c_attn.weight", {0, c.n_embd, 0, 3 * c.n_embd}, whole.data());
  src->read_f32("h.1.attn.c_attn.weight", {0, c.n_embd, 40, 48}, part.data());
  for (int64_t r = 0; r < c.n_embd; ++r)
    for (int64_t k = 0; k < 8; ++k)
      ASSERT_EQ(part[r * 8 + k], whole[r * 3 * c.n_embd + 40 + k]);
}

}  // namespace
}  // namespace ltm
