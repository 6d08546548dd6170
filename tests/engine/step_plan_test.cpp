// The step plan's wire encoding: every field survives the round trip, each plan kind decodes to
// itself, and a truncated, extended or unknown-kind buffer is refused (DataLoss), never misread.
#include "runtime/engine/step_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace ltm {
namespace {

StepPlan sample_plan() {
  StepPlan p;
  p.kind = PlanKind::kStep;
  StepInput& in = p.input;
  in.token_ids = {50256, 11, 7, 3};
  in.positions = {0, 1, 40, 41};
  in.slot_mapping = {16, 17, 104, 105};
  in.token_offsets = {0, 2, 4};
  in.context_lens = {2, 42};
  in.max_blocks_per_seq = 3;
  in.block_tables = {1, 0, 0, 4, 5, 6};
  in.logit_rows = {1, 3};
  RowSampling a;
  a.params.temperature = 0.7f;
  a.params.top_k = 40;
  a.params.top_p = 0.9f;
  a.params.repetition_penalty = 1.3f;
  a.params.seed = 0x123456789abcdefull;
  a.token_index = 5;
  a.history = {50256, 11, 9};
  RowSampling b;
  b.token_index = 0;
  b.want_logprob = false;
  p.sampling = {a, b};
  p.want_logits = true;
  return p;
}

TEST(StepPlan, RoundTripKeepsEveryField) {
  const StepPlan p = sample_plan();
  absl::StatusOr<StepPlan> q = decode_plan(encode_plan(p));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->kind, p.kind);
  EXPECT_EQ(q->want_logits, true);
  EXPECT_EQ(q->input.token_ids, p.input.token_ids);
  EXPECT_EQ(q->input.positions, p.input.positions);
  EXPECT_EQ(q->input.slot_mapping, p.input.slot_mapping);
  EXPECT_EQ(q->input.token_offsets, p.input.token_offsets);
  EXPECT_EQ(q->input.context_lens, p.input.context_lens);
  EXPECT_EQ(q->input.block_tables, p.input.block_tables);
  EXPECT_EQ(q->input.max_blocks_per_seq, 3);
  EXPECT_EQ(q->input.logit_rows, p.input.logit_rows);
  ASSERT_EQ(q->sampling.size(), 2u);
  const RowSampling& a = q->sampling[0];
  EXPECT_EQ(a.params.temperature, 0.7f);
  EXPECT_EQ(a.params.top_k, 40);
  EXPECT_EQ(a.params.top_p, 0.9f);
  EXPECT_EQ(a.params.repetition_penalty, 1.3f);
  EXPECT_EQ(a.params.seed, 0x123456789abcdefull);
  EXPECT_EQ(a.token_index, 5);
  EXPECT_EQ(a.history, (std::vector<int32_t>{50256, 11, 9}));
  EXPECT_TRUE(a.want_logprob);
  EXPECT_TRUE(q->sampling[1].history.empty());
  EXPECT_FALSE(q->sampling[1].want_logprob);
}

TEST(StepPlan, AdapterIdsAndAdapterControlRoundTrip) {
  StepPlan p = sample_plan();
  p.input.adapter_ids.assign(p.input.n_seqs(), 0);
  p.input.adapter_ids.back() = 7;
  absl::StatusOr<StepPlan> q = decode_plan(encode_plan(p));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->input.adapter_ids, p.input.adapter_ids);
  StepPlan load;
  load.kind = PlanKind::kLoadAdapter;
  load.adapter_id = 3;
  load.adapter_max_rank = 64;
  load.adapter_dir = "/srv/lora/sql-ä";
  q = decode_plan(encode_plan(load));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->kind, PlanKind::kLoadAdapter);
  EXPECT_EQ(q->adapter_id, 3);
  EXPECT_EQ(q->adapter_max_rank, 64);
  EXPECT_EQ(q->adapter_dir, "/srv/lora/sql-ä");
}

TEST(StepPlan, EveryKindDecodesToItself) {
  for (PlanKind kind : {PlanKind::kStep, PlanKind::kShutdown, PlanKind::kKeepAlive,
                        PlanKind::kLoadAdapter, PlanKind::kUnloadAdapter}) {
    StepPlan p;
    p.kind = kind;
    absl::StatusOr<StepPlan> q = decode_plan(encode_plan(p));
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(q->kind, kind);
    EXPECT_EQ(q->input.n_tokens(), 0);
  }
}

TEST(StepPlan, MalformedBuffersAreRefused) {
  const std::string bytes = encode_plan(sample_plan());
  for (size_t n : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    absl::StatusOr<StepPlan> q = decode_plan(bytes.substr(0, n));
    EXPECT_EQ(q.status().code(), absl::StatusCode::kDataLoss) << n << " of " << bytes.size();
  }
  EXPECT_EQ(decode_plan(bytes + "x").status().code(), absl::StatusCode::kDataLoss);
  // The kind is the int32 after the 4-byte magic: 0 and 6 are not kinds.
  for (int32_t bad : {0, 6, -1}) {
    std::string b = bytes;
    std::memcpy(b.data() + 4, &bad, sizeof(bad));
    EXPECT_EQ(decode_plan(b).status().code(), absl::StatusCode::kDataLoss) << "kind " << bad;
  }
}

}  // namespace
}  // namespace ltm

namespace ltm {
namespace {

// Regression of fuzz/step_plan_fuzz.cpp (input fuzz/corpus/step_plan_fuzz/regression-empty-vectors):
// a plan whose vectors are all empty decoded through memcpy(nullptr, ..., 0), undefined behaviour
// that UBSan reports; the ASan + UBSan run of the unit tests (scripts/test_asan) covers it.
TEST(StepPlan, ScoringRowsAndTopNRoundTripAndAreBounded) {
  StepPlan p;
  p.input.logit_rows = {0, 1};
  RowSampling score;
  score.target = 7;
  score.top_n = 5;
  RowSampling sample;
  sample.top_n = kMaxTopLogprobs;
  p.sampling = {score, sample};
  absl::StatusOr<StepPlan> back = decode_plan(encode_plan(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sampling[0].target, 7);
  EXPECT_EQ(back->sampling[0].top_n, 5);
  EXPECT_EQ(back->sampling[1].target, -1);
  EXPECT_EQ(back->sampling[1].top_n, kMaxTopLogprobs);
  for (auto [target, top_n] : {std::pair{-2, -1}, std::pair{-1, -2}, std::pair{-1, 21}}) {
    p.sampling[0].target = target;
    p.sampling[0].top_n = top_n;
    EXPECT_FALSE(decode_plan(encode_plan(p)).ok()) << target << " " << top_n;
  }
}

TEST(StepPlan, AllEmptyVectorsDecodeWithoutTouchingNull) {
  std::string bytes;
  auto put = [&](int32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
  put(0x4c544d34);  // LTM4
  put(3);  // KeepAlive
  put(0);
  for (int i = 0; i < 6; ++i) put(0);  // token_ids .. block_tables: empty
  put(1);                              // max_blocks_per_seq
  put(0);                              // logit_rows: empty
  put(0);                              // adapter_ids: empty
  put(0);                              // adapter_id
  put(0);                              // adapter_max_rank
  put(0);                              // adapter_dir: empty
  put(0);                              // no sampling rows
  absl::StatusOr<StepPlan> p = decode_plan(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, PlanKind::kKeepAlive);
  EXPECT_TRUE(p->input.token_ids.empty());
  EXPECT_EQ(encode_plan(*p), bytes);
}

}  // namespace
}  // namespace ltm
