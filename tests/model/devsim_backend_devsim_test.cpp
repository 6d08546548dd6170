// The emulated device (runtime/backend/devsim_backend.h) keeps a device's rules, and each rule
// catches the bug it is for: ops run only when the stream is drained; a host read before that
// sees poison (NaN), not the answer; a host pointer handed to an op or to the device
// communicator takes the process down naming it; freeing a buffer waits for the stream. Then the
// whole model through it equals the CPU backend bit for bit (same kernels, device discipline).
// The multi-rank layouts through it are tests/python/test_devsim_layouts.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/devsim_communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/devsim_backend.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"

namespace ltm {
namespace {

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

TEST(Devsim, OpsRunOnlyWhenTheStreamIsDrained) {
  DevsimBackend dev(1);
  const std::vector<float> x = iota(8, 1), y = iota(8, 100);
  DeviceBuffer dx = dev.upload(x.data(), x.size() * 4, false);
  DeviceBuffer dy = dev.upload(y.data(), y.size() * 4, false);
  EXPECT_EQ(dev.pending(), 2u);
  EXPECT_TRUE(std::isnan(dx.f32()[0])) << "an upload landed before the stream ran it";
  dev.synchronize();
  EXPECT_EQ(dx.f32()[3], 4.0f);
  dev.add(dx.f32(), dy.f32(), 8);
  EXPECT_EQ(dev.pending(), 1u);
  EXPECT_EQ(dx.f32()[3], 4.0f) << "add ran at once: the stream is not emulated";
  dev.synchronize();
  EXPECT_EQ(dev.pending(), 0u);
  EXPECT_EQ(dx.f32()[3], 4.0f + 103.0f);
}

TEST(Devsim, AHostReadBeforeTheStreamGotThereSeesPoison) {
  DevsimBackend dev(1);
  const std::vector<float> x = iota(16, 1);
  DeviceBuffer dx = dev.upload(x.data(), x.size() * 4, false);
  std::vector<float> host(16, 0.0f);
  dev.copy_to_host(host.data(), dx.data(), host.size() * 4);
  for (float v : host) ASSERT_TRUE(std::isnan(v)) << "an early read got data, not poison";
  dev.synchronize();
  EXPECT_EQ(host, x);
  // read_on_host is the right way: it waits.
  std::vector<unsigned char> staging;
  dev.add(dx.f32(), dx.f32(), 16);
  const float* seen = static_cast<const float*>(dev.read_on_host(dx.data(), 64, staging));
  EXPECT_EQ(seen[5], 12.0f);
}

TEST(Devsim, FreshDeviceMemoryReadsAsNaNAndZeroedAsZero) {
  DevsimBackend dev(1);
  DeviceBuffer a = dev.alloc(64);
  DeviceBuffer z = dev.alloc_zeroed(64);
  EXPECT_TRUE(std::isnan(a.f32()[7]));
  EXPECT_EQ(z.f32()[7], 0.0f);
}

TEST(Devsim, TheRegistryKnowsItsBuffersAndForgetsFreedOnes) {
  DevsimBackend dev(1);
  std::vector<float> host(8);
  const void* p = nullptr;
  {
    DeviceBuffer b = dev.alloc(32);
    p = b.data();
    EXPECT_TRUE(dev.owns(b.data(), 32));
    EXPECT_TRUE(dev.owns(b.f32() + 4, 16));
    EXPECT_FALSE(dev.owns(b.f32() + 4, 17)) << "a range past the end";
    EXPECT_FALSE(dev.owns(host.data(), 4));
  }
  EXPECT_FALSE(dev.owns(p, 4)) << "a freed buffer is still device memory";
}

TEST(Devsim, FreeingABufferWaitsForTheStream) {
  DevsimBackend dev(1);
  const std::vector<float> x = iota(8, 1);
  DeviceBuffer keep = dev.upload(x.data(), 32, false);
  {
    DeviceBuffer tmp = dev.upload(x.data(), 32, false);
    dev.add(keep.f32(), tmp.f32(), 8);
    EXPECT_GT(dev.pending(), 0u);
  }  // tmp freed here: the add that reads it must run first
  EXPECT_EQ(dev.pending(), 0u);
  EXPECT_EQ(keep.f32()[2], 6.0f);
}

TEST(DevsimDeathTest, AHostPointerHandedToAnOpAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevsimBackend dev(1);
  DeviceBuffer d = dev.alloc(32);
  std::vector<float> host(8, 1.0f);
  EXPECT_DEATH(dev.add(d.f32(), host.data(), 8), "not device memory of the emulated device");
}

// The device communicator's refusal, on a group of one (no MPI needed: the check comes first).
TEST(DevsimDeathTest, AHostBufferOnTheDeviceCommunicatorIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevsimBackend dev(1);
  parallel::SoloCommunicator host_comm{"tp"};
  parallel::DevsimCommunicator comm(
      host_comm, [&](const void* p, size_t n) { return dev.owns(p, n); },
      [&] { dev.synchronize(); });
  std::vector<float> host(8, 1.0f);
  EXPECT_DEATH(comm.all_reduce_sum(host.data(), host.size()),
               "devsim: all_reduce_sum on group tp was handed 32 bytes at 0x[0-9a-f]+, which are "
               "not device memory of the emulated device");
  EXPECT_DEATH(comm.post(host.data(), 32, 1, 7), "devsim: post on group tp .*not device memory");
  // A device buffer passes, and the stream has caught up when the transfer starts.
  DeviceBuffer d = dev.upload(host.data(), 32, false);
  EXPECT_EQ(dev.pending(), 1u);
  comm.all_reduce_sum(d.f32(), 8);
  EXPECT_EQ(dev.pending(), 0u);
  EXPECT_EQ(d.f32()[0], 1.0f);
}

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

// Prefill 7 tokens then decode 3, one sequence; returns every step's logits, read on the host the
// way the engine reads them (read_on_host). On the emulated device, `copies` gets each step's
// host-to-device copies (run_stage and compute_logits) and their bytes.
struct StepCopies {
  size_t copies, bytes, array_bytes;  // array_bytes: the step's int32 arrays, unpadded
};
std::vector<std::vector<float>> run_model(Backend& backend, std::vector<StepCopies>* copies = nullptr) {
  const ModelConfig config = small_config();
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<WeightSource> source = make_random_source(config, 7, 0.2f);
  auto loaded = Model::load(*source, backend, ShardSpec{}, tp);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  Model& model = **loaded;
  constexpr int kBlock = 4;
  KvCache cache(backend, config.n_layer, config.n_head, config.head_dim(), kBlock, 8);
  const std::vector<int32_t> tokens = {5, 17, 3, 99, 42, 8, 64, 23, 11, 77};
  const std::vector<int32_t> blocks = {6, 2, 5};
  std::vector<std::vector<float>> out;
  int32_t done = 0;
  DeviceBuffer hidden = backend.alloc(16 * config.n_embd * sizeof(float));
  DeviceBuffer logits = backend.alloc(config.vocab_size * sizeof(float));
  std::vector<unsigned char> staging;
  for (int32_t chunk : {7, 1, 1, 1}) {
    StepInput in;
    in.max_blocks_per_seq = static_cast<int32_t>(blocks.size());
    in.token_offsets = {0, chunk};
    for (int32_t j = 0; j < chunk; ++j) {
      const int32_t pos = done + j;
      in.token_ids.push_back(tokens[pos]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(blocks[pos / kBlock] * kBlock + pos % kBlock);
    }
    in.context_lens = {done + chunk};
    in.block_tables = blocks;
    in.logit_rows = {chunk - 1};
    auto* dev = dynamic_cast<DevsimBackend*>(&backend);
    const DevsimBackend::CopyCounts before = dev ? dev->copy_counts() : DevsimBackend::CopyCounts{};
    model.run_stage(in, hidden.f32(), cache);
    model.compute_logits(in, hidden.f32(), logits.f32());
    if (dev && copies) {
      const DevsimBackend::CopyCounts after = dev->copy_counts();
      // ... and a flag a sequence (Model::upload_step: which ones are verify rows)
      const size_t ints = in.token_offsets.size() + in.context_lens.size() +
                          in.block_tables.size() + in.slot_mapping.size() +
                          in.token_ids.size() + in.positions.size() + in.logit_rows.size() +
                          static_cast<size_t>(in.n_seqs());
      copies->push_back({after.h2d - before.h2d, after.h2d_bytes - before.h2d_bytes, ints * 4});
    }
    const float* seen = static_cast<const float*>(
        backend.read_on_host(logits.data(), config.vocab_size * sizeof(float), staging));
    out.emplace_back(seen, seen + config.vocab_size);
    done += chunk;
  }
  return out;
}

TEST(Devsim, TheModelGivesTheCpuBackendsLogitsBitForBit) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  std::unique_ptr<Backend> dev = make_devsim_backend(1);
  const auto want = run_model(*cpu);
  const auto got = run_model(*dev);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    for (float v : got[s]) ASSERT_FALSE(std::isnan(v)) << "step " << s << ": poison reached logits";
    EXPECT_EQ(0, std::memcmp(got[s].data(), want[s].data(), want[s].size() * sizeof(float)))
        << "step " << s;
  }
}

// The step's int32 arrays (offsets, contexts, block tables, slots, ids, positions, logit rows,
// verify-row flags) reach the device in one copy (one pinned copy on a GPU), not one per array.
TEST(Devsim, AStepsInputsGoToTheDeviceInOneCopy) {
  std::unique_ptr<Backend> dev = make_devsim_backend(1);
  std::vector<StepCopies> copies;
  run_model(*dev, &copies);
  ASSERT_EQ(copies.size(), 4u);
  for (size_t s = 0; s < copies.size(); ++s) {
    EXPECT_EQ(copies[s].copies, 1u) << "step " << s;
    // Each array padded to 16 bytes: at most 12 bytes more per array.
    EXPECT_GE(copies[s].bytes, copies[s].array_bytes) << "step " << s;
    EXPECT_LE(copies[s].bytes, copies[s].array_bytes + 8 * 12) << "step " << s;
  }
}

}  // namespace
}  // namespace ltm
