// Captured graphs on the emulated device (Backend::capture / replay, runtime/model/
// decode_graphs.h): the recorded ops replay what they did, with the pointers and host scalars of
// the capture; each rule of a CUDA capture (no allocation, no host wait, no host copy, no buffer
// freed under a graph) aborts naming it; the device communicator's all-reduce is recorded and runs
// at each replay; and decode steps run from graphs give the eager steps' logits bit for bit, on
// padded buckets that change from step to step. tp 2 through MPI: test_devsim_graphs.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/devsim_communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/devsim_backend.h"
#include "runtime/model/decode_graphs.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"
#include "tests/model/decode_graph_steps.h"

namespace ltm {
namespace {

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

TEST(DevsimGraph, ReplayRunsTheRecordedOpsWithTheirCapturedArguments) {
  DevsimBackend dev(1);
  const std::vector<float> x = iota(8, 1), y = iota(8, 100);
  DeviceBuffer dx = dev.upload(x.data(), 32, false);
  DeviceBuffer dy = dev.upload(y.data(), 32, false);
  dev.synchronize();
  int calls = 0;
  std::unique_ptr<BackendGraph> g = dev.capture([&] {
    ++calls;
    dev.add(dx.f32(), dy.f32(), 8);
  });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(dev.pending(), 1u) << "the capture's first run is queued; the recording is not";
  dev.synchronize();
  EXPECT_EQ(dx.f32()[2], 3.0f + 102.0f);
  dev.replay(*g);
  dev.replay(*g);
  EXPECT_EQ(dev.pending(), 2u);
  EXPECT_EQ(dx.f32()[2], 3.0f + 102.0f) << "a replay ran before the stream got there";
  dev.synchronize();
  EXPECT_EQ(dx.f32()[2], 3.0f + 3 * 102.0f);
  EXPECT_EQ(calls, 2) << "replay called the host code again";
}

// A host communicator that counts its all-reduces (and adds 1 to every element, so a run shows).
class CountingComm final : public parallel::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  void all_reduce_sum(float* data, size_t count) override {
    ++all_reduces;
    for (size_t i = 0; i < count; ++i) data[i] += 1.0f;
  }
  void all_gather(const void*, void*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void send(const void*, size_t, int, int) override {}
  void recv(void*, size_t, int, int) override {}
  void barrier() override {}
  int all_reduces = 0;

 private:
  std::string name_ = "tp";
};

parallel::DevsimCommunicator device_comm(DevsimBackend& dev, parallel::Communicator& host) {
  return parallel::DevsimCommunicator(
      host, [&dev](const void* p, size_t n) { return dev.owns(p, n); },
      [&dev] { dev.synchronize(); },
      [&dev](std::function<void()> op) { return dev.record_if_capturing(std::move(op)); });
}

TEST(DevsimGraph, TheDeviceCommunicatorsAllReduceIsRecordedAndRunsAtEachReplay) {
  DevsimBackend dev(1);
  CountingComm host;
  parallel::DevsimCommunicator comm = device_comm(dev, host);
  const std::vector<float> x = iota(4, 0);
  DeviceBuffer dx = dev.upload(x.data(), 16, false);
  std::unique_ptr<BackendGraph> g = dev.capture([&] {
    dev.add(dx.f32(), dx.f32(), 4);  // x *= 2, then the all-reduce adds 1
    comm.all_reduce_sum(dx.f32(), 4);
  });
  EXPECT_EQ(host.all_reduces, 1) << "the capture's recording ran the all-reduce";
  EXPECT_EQ(dx.f32()[3], 3.0f * 2 + 1);
  dev.replay(*g);
  EXPECT_EQ(host.all_reduces, 1) << "the replay's all-reduce ran before the stream got there";
  dev.synchronize();
  EXPECT_EQ(host.all_reduces, 2);
  EXPECT_EQ(dx.f32()[3], (3.0f * 2 + 1) * 2 + 1);
}

TEST(DevsimGraphDeathTest, EachRuleOfACaptureAbortsNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevsimBackend dev(1);
  DeviceBuffer a = dev.alloc_zeroed(64);
  std::vector<float> host(16, 1.0f);
  EXPECT_DEATH(dev.capture([&] { DeviceBuffer b = dev.alloc(128); }),
               "devsim: an allocation of 128 bytes while capturing a graph");
  EXPECT_DEATH(dev.capture([&] { dev.copy_to_device(a.data(), host.data(), 64); }),
               "devsim: copy_to_device of 64 bytes of host memory while capturing a graph");
  EXPECT_DEATH(dev.capture([&] { dev.copy_to_host(host.data(), a.data(), 64); }),
               "devsim: copy_to_host of 64 bytes while capturing a graph");
  EXPECT_DEATH(dev.capture([&] {
                 dev.add(a.f32(), a.f32(), 16);
                 dev.synchronize();
               }),
               "devsim: the stream was drained .* while capturing a graph");
  // A transfer other than an all-reduce drains the stream: not in a capture.
  CountingComm hc;
  parallel::DevsimCommunicator comm = device_comm(dev, hc);
  EXPECT_DEATH(dev.capture([&] { comm.post(a.data(), 64, 1, 5); }),
               "devsim: the stream was drained .* while capturing a graph");
}

TEST(DevsimGraphDeathTest, AReplayOverAFreedBufferAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevsimBackend dev(1);
  DeviceBuffer a = dev.alloc_zeroed(64);
  auto b = std::make_unique<DeviceBuffer>(dev.alloc_zeroed(64));
  std::unique_ptr<BackendGraph> g = dev.capture([&] { dev.add(a.f32(), b->f32(), 16); });
  dev.replay(*g);  // fine while b lives
  dev.synchronize();
  b.reset();
  EXPECT_DEATH(dev.replay(*g), "devsim: a graph replay would use 0x[0-9a-f]+, which was device "
                               "memory at capture and has been freed since");
}

TEST(DecodeGraphs, ReplayedDecodeStepsGiveTheEagerLogitsBitForBit) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  std::unique_ptr<Backend> eager_dev = make_devsim_backend(1);
  std::unique_ptr<Backend> graph_dev = make_devsim_backend(1);
  const DecodeRun want = run_decode(*cpu, false);
  const DecodeRun eager = run_decode(*eager_dev, false);
  const DecodeRun got = run_decode(*graph_dev, true);
  EXPECT_EQ(got.graphs, 3) << "buckets 4, 2 and 1";
  EXPECT_EQ(got.replays, 2) << "steps 3 and 5 replay bucket 4";
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t k = 0; k < want.logits.size(); ++k) {
    ASSERT_EQ(got.logits[k].size(), want.logits[k].size());
    for (float v : got.logits[k]) ASSERT_FALSE(std::isnan(v)) << "step " << k << ": NaN";
    float max_diff = 0;
    for (size_t i = 0; i < want.logits[k].size(); ++i)
      max_diff = std::max(max_diff, std::fabs(got.logits[k][i] - want.logits[k][i]));
    std::printf("decode step %zu: graph vs cpu eager max |diff| %g\n", k, max_diff);
    EXPECT_EQ(0, std::memcmp(got.logits[k].data(), want.logits[k].data(),
                             want.logits[k].size() * sizeof(float)))
        << "step " << k << " (graph vs cpu eager)";
    EXPECT_EQ(0, std::memcmp(eager.logits[k].data(), want.logits[k].data(),
                             want.logits[k].size() * sizeof(float)))
        << "step " << k << " (devsim eager vs cpu eager)";
  }
}

TEST(DecodeGraphs, OnlyDecodeStepsWithoutAdaptersWithinTheLargestBucketGoToAGraph) {
  std::unique_ptr<Backend> dev = make_devsim_backend(1);
  const ModelConfig config = small_config();
  parallel::SoloCommunicator tp{"tp"};
  std::unique_ptr<WeightSource> source = make_random_source(config, 11, 0.3f);
  auto model = Model::load(*source, *dev, ShardSpec{}, tp);
  ASSERT_TRUE(model.ok());
  KvCache cache(*dev, config.n_layer, config.n_head, config.head_dim(), kBlock, 8);
  DecodeGraphs dg(**model, *dev, cache, 10, config.n_positions);  // buckets 1 2 4 8 16
  EXPECT_EQ(dg.max_bucket(), 16);
  auto decode = [](int n) {
    StepInput in;
    in.max_blocks_per_seq = 1;
    in.token_offsets.push_back(0);
    for (int i = 0; i < n; ++i) {
      in.token_ids.push_back(1);
      in.positions.push_back(2);
      in.slot_mapping.push_back(i);
      in.token_offsets.push_back(i + 1);
      in.context_lens.push_back(3);
      in.block_tables.push_back(0);
      in.logit_rows.push_back(i);
    }
    return in;
  };
  EXPECT_EQ(dg.bucket_for(decode(1)), 1);
  EXPECT_EQ(dg.bucket_for(decode(3)), 4);
  EXPECT_EQ(dg.bucket_for(decode(9)), 16);
  EXPECT_EQ(dg.bucket_for(decode(17)), 0);
  StepInput lora = decode(2);
  lora.adapter_ids = {0, 3};
  EXPECT_EQ(dg.bucket_for(lora), 0);
  StepInput mixed = decode(2);  // the second sequence has two new tokens
  mixed.token_ids.push_back(1);
  mixed.positions.push_back(3);
  mixed.slot_mapping.push_back(5);
  mixed.token_offsets.back() = 3;
  EXPECT_EQ(dg.bucket_for(mixed), 0);
  StepInput rows = decode(2);
  rows.logit_rows = {1};
  EXPECT_EQ(dg.bucket_for(rows), 0);
  StepInput wide = decode(1);
  wide.max_blocks_per_seq = 17;  // 64 positions / 4 = 16 columns in the graphs
  wide.block_tables.assign(17, 0);
  EXPECT_EQ(dg.bucket_for(wide), 0);
}

}  // namespace
}  // namespace ltm
