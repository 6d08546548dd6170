// ltm-plan's figures against values computed by hand (in the comments) for GPT-3 125M and 175B.
#include "runtime/model/capacity_plan.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/model/kv_cache.h"

namespace ltm {
namespace {

ModelConfig gpt3(int64_t layers, int64_t d, int64_t heads) {
  ModelConfig c;
  c.vocab_size = 50257;
  c.n_positions = 2048;
  c.n_embd = d;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_inner = 4 * d;
  return c;
}

// GPT-3 125M in bf16 weights and an fp16 KV cache on two CPU ranks.
PlanInput gpt3_125m_bf16_on_two_cpu_ranks() {
  PlanInput in;
  in.config = gpt3(12, 768, 12);
  in.device = *find_device("cpu");
  in.world_size = 2;
  in.weights = Precision::kBF16;
  in.kv = Precision::kF16;
  return in;
}

const LayoutPlan& layout(const Plan& p, int tp, int pp) {
  for (const LayoutPlan& l : p.layouts)
    if (l.tp == tp && l.pp == pp) return l;
  ADD_FAILURE() << "no layout tp " << tp << " pp " << pp;
  static LayoutPlan none;
  return none;
}

// A device whose figures make one term of the cost model dominate.
DeviceSpec custom(double bandwidth, double flops, double link, double latency) {
  DeviceSpec d;
  d.name = "test";
  d.memory_bytes = int64_t{1} << 40;
  d.memory_bandwidth = bandwidth;
  d.flops_f32 = d.flops_16 = flops;
  d.link_bandwidth = d.network_bandwidth = link;
  d.link_latency_s = d.network_latency_s = latency;
  d.devices_per_node = 64;
  return d;
}

TEST(CapacityPlan, Gpt3_125mByHand) {
  PlanInput in;
  in.config = gpt3(12, 768, 12);
  in.device = *find_device("cpu");
  in.world_size = 1;
  const Plan p = *make_plan(in);
  // wte 50257 x 768 + wpe 2048 x 768 + 12 x (12 d^2 + 13 d) + 2 d.
  EXPECT_EQ(p.parameters, 125226240);
  EXPECT_EQ(p.parameters_12ld2, 84934656);  // 12 x 12 x 768^2
  // 2 x (12 x (4 d^2 + 2 d x 4d) + V d) + 4 x 12 x 768 x 2048 (attention at the full context).
  EXPECT_DOUBLE_EQ(p.flops_per_token, 2.0 * (12 * 7077888.0 + 38597376.0) + 75497472.0);
  ASSERT_EQ(p.layouts.size(), 1u);
  const LayoutPlan& l = p.layouts[0];
  EXPECT_EQ(l.weight_bytes_per_rank, 125226240LL * 4);  // every parameter in fp32
  EXPECT_EQ(l.kv_bytes_per_token, 2 * 12 * 768 * 4);    // K and V, 12 layers, fp32
  EXPECT_EQ(l.allreduce_payload_bytes, 2 * 768 * 4);
  EXPECT_EQ(l.allreduce_bytes_moved, 0);  // tp 1: no all-reduce moves anything
  EXPECT_TRUE(l.fits);
  EXPECT_EQ(p.recommended, 0);
}

TEST(CapacityPlan, Gpt3_125mBf16TensorParallelByHand) {
  PlanInput in = gpt3_125m_bf16_on_two_cpu_ranks();
  const Plan p = *make_plan(in);
  const LayoutPlan& tp2 = layout(p, 2, 1);
  // Per layer: half of each matrix (12 d^2 / 2 elements, bf16) and the vectors (3d/2 + d + 4d/2
  // + d + 4d fp32); the vocab padded to 50258, half of it; wpe and ln_f fp32.
  EXPECT_EQ(tp2.weight_bytes_per_rank,
            12 * ((12 * 768 * 768 / 2) * 2 + (1152 + 768 + 1536 + 768 + 3072) * 4) +
                25129 * 768 * 2 + 2048 * 768 * 4 + 2 * 768 * 4);
  EXPECT_EQ(tp2.weight_bytes_per_rank, 130180608);
  EXPECT_EQ(tp2.kv_bytes_per_token, 2 * 12 * 6 * 64 * 2);  // 6 heads of 64, fp16
  EXPECT_EQ(tp2.allreduce_bytes_moved, 6144.0 * 2 * 1 / 2);
  // The host's memory is shared: each of the 2 ranks gets half.
  EXPECT_EQ(tp2.memory_per_rank, static_cast<int64_t>(in.device.memory_bytes * 0.9 / 2));
  const LayoutPlan& pp2 = layout(p, 1, 2);
  ASSERT_EQ(pp2.stages.size(), 2u);
  EXPECT_EQ(pp2.stages[0].layers + pp2.stages[1].layers, 12);
}

TEST(CapacityPlan, Int8Weights) {
  PlanInput in;
  in.config = gpt3(12, 768, 12);
  in.device = *find_device("cpu");
  in.world_size = 1;
  in.weights = Precision::kInt8;
  in.kv = Precision::kF16;
  const Plan p = *make_plan(in);
  // Matrices (12 x 12 d^2 and the embedding V x d) at 8.5 bits, vectors fp32.
  const int64_t matrix = 12LL * 12 * 768 * 768 + 50257LL * 768;
  const int64_t vectors = 125226240LL - matrix;
  EXPECT_EQ(p.layouts[0].weight_bytes_per_rank, matrix + matrix / 16 + vectors * 4);
  // A GPU holds int8 weights too (kernels/cuda/int8_gemm.h), and a dequantized fp16 copy of the
  // largest matrix (the head, 50257 x 768 padded) besides its activations: fewer KV blocks than
  // the same plan with that scratch left out would give, and more than with fp16 weights.
  in.device = *find_device("h100-sxm");
  const absl::StatusOr<Plan> gpu = make_plan(in);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->layouts[0].weight_bytes_per_rank, matrix + matrix / 16 + vectors * 4);
  EXPECT_EQ(gpu_int8_scratch_bytes(768, 3072, 50304, 1), 2 * 50304 * 768);
  in.weights = Precision::kF16;
  const absl::StatusOr<Plan> gpu16 = make_plan(in);
  ASSERT_TRUE(gpu16.ok());
  EXPECT_GT(gpu->layouts[0].worker_kv_blocks, gpu16->layouts[0].worker_kv_blocks);
  in.weights = Precision::kInt8;
  in.device = *find_device("cpu");
  in.kv = Precision::kInt8;
  EXPECT_FALSE(make_plan(in).ok());
}

TEST(CapacityPlan, Gpt3_175bOnSixteenH100sByHand) {
  PlanInput in;
  in.config = gpt3(96, 12288, 96);
  in.device = *find_device("h100-sxm");
  in.world_size = 16;
  in.weights = Precision::kBF16;
  in.kv = Precision::kF16;
  const Plan p = *make_plan(in);
  EXPECT_EQ(p.parameters, 174604259328);
  EXPECT_EQ(p.parameters_12ld2, 173946175488);
  ASSERT_EQ(p.layouts.size(), 5u);  // tp 1, 2, 4, 8, 16
  const LayoutPlan& l = layout(p, 8, 2);
  ASSERT_EQ(l.stages.size(), 2u);
  EXPECT_EQ(l.stages[0].layers, 48);
  EXPECT_EQ(l.stages[1].layers, 48);
  // Stage 0: 48 x (12 d^2 / 8 bf16 + (3d/8 + d + 4d/8 + d + 4d) fp32) + wte rows 50264 / 8 x d
  // bf16 + wpe 2048 x d fp32; stage 1: the same layers and wte, ln_f instead of wpe.
  const int64_t d = 12288;
  const int64_t layer = (12 * d * d / 8) * 2 + (3 * d / 8 + d + 4 * d / 8 + d + 4 * d) * 4;
  EXPECT_EQ(l.stages[0].weight_bytes, 48 * layer + 6283 * d * 2 + 2048 * d * 4);
  EXPECT_EQ(l.stages[0].weight_bytes, 22014566400);
  EXPECT_EQ(l.stages[1].weight_bytes, 48 * layer + 6283 * d * 2 + 2 * d * 4);
  EXPECT_EQ(l.weight_bytes_per_rank, 22014566400);
  EXPECT_EQ(l.kv_bytes_per_token, 2 * 48 * 12 * 128 * 2);  // 294912: 12 heads of 128, fp16
  EXPECT_EQ(l.allreduce_payload_bytes, 98304);             // 2 x 12288 x 4
  EXPECT_DOUBLE_EQ(l.allreduce_bytes_moved, 98304.0 * 2 * 7 / 8);
  // 2 x (96 x 12 d^2 + V d) + 4 x 96 x d x 2048.
  EXPECT_DOUBLE_EQ(p.flops_per_token,
                   2.0 * (96.0 * 12 * d * d + 50257.0 * d) + 4.0 * 96 * d * 2048);
  // Memory: 80 GB x 0.95 - 2 GiB overhead - weights, over 294912 bytes per token.
  const int64_t free_bytes = static_cast<int64_t>(80e9 * 0.95) - (int64_t{2} << 30) - 22014566400;
  EXPECT_EQ(l.kv_tokens_fit, free_bytes / 294912);
  EXPECT_EQ(l.batch_at_context, l.kv_tokens_fit / 2048);
  EXPECT_TRUE(layout(p, 16, 1).tp_crosses_nodes);
  EXPECT_FALSE(l.tp_crosses_nodes);
  // TP inside the 8-GPU node, the two stages across nodes: the planner's choice too.
  ASSERT_GE(p.recommended, 0);
  EXPECT_EQ(p.layouts[p.recommended].tp, 8);
  EXPECT_EQ(p.layouts[p.recommended].pp, 2);
  EXPECT_NE(p.reason.find("inside a node"), std::string::npos) << p.reason;
  // The JSON carries the same figures.
  const nlohmann::json j = nlohmann::json::parse(plan_json(p));
  EXPECT_EQ(j["parameters"], 174604259328);
  EXPECT_EQ(j["recommended"]["tp"], 8);
  EXPECT_EQ(j["layouts"][3]["weight_bytes_per_rank"], 22014566400);
}

TEST(CapacityPlan, DecodeIsWeightsAndKvOverBandwidth) {
  PlanInput in;
  in.config = gpt3(12, 768, 12);
  in.device = custom(1e11, 1e30, 1e30, 0);
  in.world_size = 1;
  in.context = 1000;
  const Plan p = *make_plan(in);
  const LayoutPlan& l = p.layouts[0];
  // Every weight but wpe (only one row is read) plus 1000 tokens of K and V.
  const double bytes = 125226240.0 * 4 - 2048 * 768 * 4 + 1000.0 * 2 * 12 * 768 * 4;
  EXPECT_NEAR(l.decode_s_per_token, bytes / 1e11, 1e-12);
  EXPECT_EQ(l.bound, "memory bandwidth");
}

TEST(CapacityPlan, AllReduceCostIsLatencyPlusRingShareOverLink) {
  PlanInput in;
  in.config = gpt3(12, 768, 12);
  in.device = custom(1e30, 1e30, 1e9, 5e-6);
  in.world_size = 4;
  const Plan p = *make_plan(in);
  const LayoutPlan& l = layout(p, 4, 1);
  // 2 per layer + the embedding's, each 5 us + 2 (4-1)/4 x 768 x 4 bytes / 1 GB/s; plus the
  // greedy candidates' exchange (one latency).
  const double one = 5e-6 + 1.5 * 768 * 4 / 1e9;
  EXPECT_NEAR(l.comm_s_per_step, 25 * one + 5e-6, 1e-12);
  EXPECT_NEAR(l.decode_s_per_token, l.comm_s_per_step, 1e-9);
  EXPECT_EQ(l.bound, "communication");
  // Pipeline: 4 hops of one activation row (3 between stages, 1 back to rank 0), no all-reduce.
  const LayoutPlan& pp4 = layout(p, 1, 4);
  EXPECT_NEAR(pp4.comm_s_per_step, 4 * (5e-6 + 768 * 4 / 1e9), 1e-12);
}

TEST(CapacityPlan, InvalidLayoutsAndModelsThatDoNotFit) {
  PlanInput in;
  in.config = gpt3(12, 768, 12);
  in.device = *find_device("cpu");
  in.world_size = 8;
  const Plan p = *make_plan(in);
  EXPECT_NE(layout(p, 8, 1).invalid.find("12 attention heads"), std::string::npos)
      << layout(p, 8, 1).invalid;
  EXPECT_TRUE(layout(p, 4, 2).invalid.empty());

  PlanInput big;
  big.config = gpt3(96, 12288, 96);
  big.device = *find_device("cpu");
  big.world_size = 2;
  const Plan q = *make_plan(big);
  EXPECT_EQ(q.recommended, -1);
  EXPECT_NE(q.reason.find("no layout fits"), std::string::npos) << q.reason;
  for (const LayoutPlan& l : q.layouts) EXPECT_FALSE(l.fits);

  in.world_size = 0;
  EXPECT_FALSE(make_plan(in).ok());
  in.world_size = 1;
  in.context = 4096;  // past the model's 2048
  EXPECT_FALSE(make_plan(in).ok());
  EXPECT_FALSE(find_device("tpu").has_value());
  EXPECT_TRUE(find_device("H100-SXM").has_value());
}

// Issue 20, item 8: on GPUs the worker's default KV cache is what is left of the device, not the
// CPU's 1 GiB (which gave 227 blocks, ~3.6k tokens, here).
TEST(CapacityPlan, Gpt3_175bOnSixteenH100sGetsTheGpuMemoryLeftForKv) {
  PlanInput in;
  in.config = gpt3(96, 12288, 96);
  in.device = *find_device("h100-sxm");
  in.world_size = 16;
  in.weights = Precision::kBF16;
  in.kv = Precision::kF16;
  const Plan p = *make_plan(in);
  const LayoutPlan& l = layout(p, 8, 2);
  // 0.9 x (80 GB - 22014566400 weights - activations - 256 MiB graphs - 2 GiB runtime) over
  // 16 x 294912 bytes a block. Activations: 2 x (512 x (2 d + 4 d / 8 + 4 d / 8) + 64 x 50264
  // / 8) x 4 bytes, d = 12288.
  const int64_t d = 12288;
  const int64_t act = 2 * (512 * (2 * d + 4 * d / 8 + 4 * d / 8) + 64 * (50264 / 8)) * 4;
  const int64_t left = 80 * int64_t{1000000000} - 22014566400 - act - (int64_t{256} << 20) -
                       (int64_t{2} << 30);
  const int64_t blocks = static_cast<int64_t>(left * 0.9) / (16 * 294912);
  EXPECT_EQ(l.worker_kv_blocks, blocks);
  EXPECT_GT(int64_t{l.worker_kv_blocks} * 16, 165000);  // ~170k tokens per rank
  EXPECT_LT(int64_t{l.worker_kv_blocks} * 16, 175000);
  EXPECT_EQ(l.worker_kv_bytes, int64_t{l.worker_kv_blocks} * 16 * 294912);
  // The worker's own sizing call with the device memory as an input gives the same figure.
  KvSizing z;
  z.n_layers_local = 48;
  z.n_head_local = 12;
  z.head_dim = 128;
  z.n_positions = 2048;
  z.serving = true;
  z.precision = Precision::kF16;
  z.device_memory_bytes = 80 * int64_t{1000000000};
  z.weight_bytes = 22014566400;
  z.activation_bytes = gpu_activation_bytes(d, 4 * d, 50264, 8, 512, 64);
  z.graph_bytes = kGpuGraphBytes;
  z.overhead_bytes = kGpuRuntimeBytes;
  EXPECT_EQ(z.activation_bytes, act);
  EXPECT_EQ(*plan_kv_blocks(z), l.worker_kv_blocks);
  // A single H100 (world 1) holds no 175B model: no KV blocks.
  in.world_size = 1;
  const Plan one = *make_plan(in);
  EXPECT_EQ(layout(one, 1, 1).worker_kv_blocks, 0);
  // --gpu-memory-fraction 0.45: half.
  in.world_size = 16;
  in.gpu_memory_fraction = 0.45;
  EXPECT_NEAR(layout(*make_plan(in), 8, 2).worker_kv_blocks, blocks / 2.0, 1);
}

TEST(CapacityPlan, WorkerKvCacheFollowsItsSizingPolicy) {
  PlanInput in;
  in.config = gpt3(12, 768, 12);
  in.device = *find_device("cpu");
  in.world_size = 2;
  in.serving = true;  // 1024 MiB per rank
  const Plan p = *make_plan(in);
  const LayoutPlan& l = layout(p, 2, 1);
  // A block of 16 tokens: 2 x 12 layers x 6 heads x 64 x 16 x 4 bytes = 589824.
  EXPECT_EQ(l.worker_kv_blocks, (int64_t{1024} << 20) / 589824);
  EXPECT_EQ(l.worker_kv_bytes, int64_t{l.worker_kv_blocks} * 589824);
  in.serving = false;  // one-shot: one full context
  const Plan q = *make_plan(in);
  EXPECT_EQ(layout(q, 2, 1).worker_kv_blocks, 2048 / 16);
}

}  // namespace
}  // namespace ltm

namespace ltm {
namespace {

// --kv-resident: on the CPU the worker's KV cache is resident from start-up and the plan counts
// it there; a GPU's cache is device memory either way.
TEST(CapacityPlan, AResidentKvCacheIsCountedAtStartUpOnTheCpu) {
  PlanInput in = gpt3_125m_bf16_on_two_cpu_ranks();
  const Plan lazy = *make_plan(in);
  in.kv_resident = true;
  const Plan resident = *make_plan(in);
  for (int tp : {1, 2}) {
    const LayoutPlan& a = layout(lazy, tp, 2 / tp);
    const LayoutPlan& b = layout(resident, tp, 2 / tp);
    ASSERT_GT(a.worker_kv_bytes, 0);
    for (size_t s = 0; s < a.stages.size(); ++s)
      EXPECT_EQ(b.stages[s].resident_at_load_bytes,
                a.stages[s].resident_at_load_bytes + a.stages[s].worker_kv_bytes);
    EXPECT_EQ(b.resident_at_load_bytes, b.resident_bytes);  // full from the start
    EXPECT_EQ(b.resident_bytes, a.resident_bytes);
  }
  EXPECT_NE(plan_text(resident).find("(the KV cache too: --kv-resident)"), std::string::npos);
  EXPECT_EQ(plan_text(lazy).find("--kv-resident"), std::string::npos);
  in.device = *find_device("h100-sxm");
  in.kv_resident = false;
  const Plan gpu_lazy = *make_plan(in);
  in.kv_resident = true;
  const Plan gpu = *make_plan(in);
  EXPECT_EQ(layout(gpu, 1, 2).resident_at_load_bytes, layout(gpu_lazy, 1, 2).resident_at_load_bytes);
}

// --speculative draft: rank 0 also holds the draft model (runtime/spec/draft_model.h), its
// weights and a KV cache with a full context for --spec-max-batch + 1 sequences.
TEST(CapacityPlan, DraftModelIsCountedOnRankZero) {
  PlanInput in = gpt3_125m_bf16_on_two_cpu_ranks();
  const Plan without = *make_plan(in);
  in.draft = true;
  in.draft_config = gpt3(2, 256, 4);  // 2 layers, d 256, the target's vocabulary
  in.draft_weights = Precision::kF16;
  const Plan p = *make_plan(in);
  ASSERT_TRUE(p.has_draft);
  EXPECT_TRUE(p.draft_counted);
  // wte 50257 x 256 + wpe 2048 x 256 + 2 x (12 d^2 + 13 d) + 2 d.
  EXPECT_EQ(p.draft.parameters, 14970112);
  // Matrices and wte fp16, vectors and wpe fp32 (as the target's bf16 by-hand figure).
  EXPECT_EQ(p.draft.weight_bytes,
            2 * (12 * 256 * 256 * 2 + 13 * 256 * 4) + 50257 * 256 * 2 + 2048 * 256 * 4 + 2 * 256 * 4);
  EXPECT_EQ(p.draft.kv, Precision::kF16);
  EXPECT_EQ(p.draft.max_sequences, 5);  // min(--spec-max-batch 4, --max-running 64) + 1
  EXPECT_EQ(p.draft.kv_blocks, 5 * 2048 / 16);
  EXPECT_EQ(p.draft.kv_bytes, int64_t{640} * 16 * 2 * 2 * 256 * 2);  // K and V, 2 layers, fp16
  const int64_t draft = p.draft.total_bytes();
  for (int tp : {1, 2}) {
    const LayoutPlan& a = layout(without, tp, 2 / tp);
    const LayoutPlan& b = layout(p, tp, 2 / tp);
    // Rank 0 (stage 0) holds the draft: its resident figures grow by it, the others' do not.
    EXPECT_EQ(b.stages[0].resident_at_load_bytes,
              a.stages[0].resident_at_load_bytes + p.draft.weight_bytes);
    if (b.stages.size() > 1) {
      EXPECT_EQ(b.stages[1].resident_at_load_bytes, a.stages[1].resident_at_load_bytes);
    }
    EXPECT_EQ(b.rank0_bytes,
              b.stages[0].weight_bytes + b.stages[0].worker_kv_bytes + draft);
    EXPECT_EQ(b.resident_bytes, std::max(a.resident_bytes,
                                         a.stages[0].weight_bytes + a.stages[0].worker_kv_bytes +
                                             draft + in.device.overhead_bytes));
    // Less room for the target's KV on rank 0: about the draft's bytes' worth of tokens.
    EXPECT_LT(b.kv_tokens_fit, a.kv_tokens_fit);
    if (b.stages.size() == 1) {  // tp 2: the draft's bytes' worth of tokens, rounded either way
      EXPECT_NEAR(static_cast<double>(a.kv_tokens_fit - b.kv_tokens_fit),
                  static_cast<double>(draft) / b.kv_bytes_per_token, 1.0);
    }
  }
  const std::string text = plan_text(p);
  EXPECT_NE(text.find("draft model (--speculative draft"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 0 in all"), std::string::npos) << text;
  const nlohmann::json j = nlohmann::json::parse(plan_json(p));
  EXPECT_EQ(j["draft"]["weight_bytes"].get<int64_t>(), p.draft.weight_bytes);
  EXPECT_EQ(j["draft"]["kv_bytes"].get<int64_t>(), p.draft.kv_bytes);

  // A memory that holds the target with one context of KV but not the draft too: the layout
  // does not fit, and the plan says the draft is why.
  PlanInput tight = in;
  tight.world_size = 1;
  tight.draft = false;
  const Plan alone = *make_plan(tight);
  const LayoutPlan& l = alone.layouts[0];
  tight.device.memory_bytes = static_cast<int64_t>(
      (tight.device.overhead_bytes + l.weight_bytes_per_rank + 2048 * l.kv_bytes_per_token +
       draft / 2) / tight.device.usable_fraction);
  EXPECT_TRUE(make_plan(tight)->layouts[0].fits);
  tight.draft = true;
  const Plan over = *make_plan(tight);
  EXPECT_FALSE(over.layouts[0].fits);
  EXPECT_TRUE(over.layouts[0].draft_pushes_over);
  EXPECT_EQ(over.recommended, -1);
  EXPECT_NE(over.reason.find("draft model"), std::string::npos) << over.reason;
  EXPECT_NE(plan_text(over).find("the draft model is what pushes rank 0 over"), std::string::npos);

  // On a GPU the draft runs in rank 0's host memory: reported, not counted against the GPU.
  PlanInput gpu = in;
  gpu.device = *find_device("h100-sxm");
  const Plan g = *make_plan(gpu);
  gpu.draft = false;
  const Plan g0 = *make_plan(gpu);
  EXPECT_FALSE(g.draft_counted);
  EXPECT_EQ(layout(g, 2, 1).kv_tokens_fit, layout(g0, 2, 1).kv_tokens_fit);
  EXPECT_EQ(layout(g, 2, 1).rank0_bytes, layout(g0, 2, 1).rank0_bytes + draft);
  EXPECT_NE(plan_text(g).find("not on the GPU"), std::string::npos);

  // --draft-device device: on the GPU, counted against rank 0's memory: its weights, KV cache,
  // activations and workspaces (draft_device_bytes), reserved before the KV cache of every
  // rank as the worker does (the ranks hold the same blocks).
  gpu.draft = true;
  gpu.draft_on_device = true;
  const Plan gd = *make_plan(gpu);
  EXPECT_TRUE(gd.draft_counted);
  const int64_t on_gpu = draft_device_bytes(gpu.draft_config, gd.draft);
  EXPECT_EQ(gd.draft.device_extra_bytes, on_gpu - draft);
  EXPECT_GT(gd.draft.device_extra_bytes, kGpuDraftRuntimeBytes);  // and the activations
  {
    const LayoutPlan& a = layout(g0, 2, 1);
    const LayoutPlan& b = layout(gd, 2, 1);
    EXPECT_EQ(b.rank0_bytes, b.stages[0].weight_bytes + b.stages[0].worker_kv_bytes + on_gpu);
    const double per_block = static_cast<double>(a.worker_kv_bytes) / a.worker_kv_blocks;
    EXPECT_NEAR(static_cast<double>(a.worker_kv_blocks - b.worker_kv_blocks),
                in.gpu_memory_fraction * on_gpu / per_block, 1.0);
    EXPECT_LT(b.kv_tokens_fit, a.kv_tokens_fit);
  }
  const std::string gtext = plan_text(gd);
  EXPECT_NE(gtext.find("on rank 0's GPU"), std::string::npos) << gtext;
  EXPECT_NE(gtext.find("of activations and workspaces"), std::string::npos) << gtext;
  const nlohmann::json gj = nlohmann::json::parse(plan_json(gd));
  EXPECT_TRUE(gj["draft"]["on_device"].get<bool>());
  EXPECT_EQ(gj["draft"]["device_extra_bytes"].get<int64_t>(), gd.draft.device_extra_bytes);
  // On the CPU the draft counts against rank 0's memory either way, with nothing more.
  PlanInput cpu_device = in;
  cpu_device.draft_on_device = true;
  const Plan c = *make_plan(cpu_device);
  EXPECT_EQ(c.draft.device_extra_bytes, 0);
  EXPECT_EQ(layout(c, 2, 1).rank0_bytes, layout(p, 2, 1).rank0_bytes);

  // A draft of another vocabulary is refused.
  PlanInput other = in;
  other.draft_config.vocab_size = 4096;
  const absl::StatusOr<Plan> bad = make_plan(other);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace ltm
