// Automatic prefix caching, step by step against the fake engine (tests/sched/fake_engine.h),
// whose tokens depend on the K/V the plans' block tables read: a reused block with the wrong
// contents changes the tokens, and a plan that writes a block another sequence reads, or reads a
// slot never written, is reported. Every test compares tokens with the fake model's own
// continuation, which is what the cache must not change.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/sched/scheduler.h"
#include "tests/sched/scheduler_rig.h"

namespace ltm {
namespace {

using namespace sched_test;

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs `req` alone and returns where its first plan started computing.
struct Solo {
  std::shared_ptr<Received> out;
  int32_t start = -1;
};
Solo run_alone(Rig& rig, const GenerationRequest& req) {
  const size_t before = rig.engine.plans().size();
  Solo r;
  r.out = rig.submit(req);
  rig.scheduler.run_until_idle();
  EXPECT_GT(rig.engine.plans().size(), before);
  if (rig.engine.plans().size() > before) r.start = rig.engine.plans()[before].input.positions[0];
  return r;
}

TEST(PrefixCache, ReusesWholeCachedBlocksOfASharedPrefixAndComputesTheRest) {
  Rig rig(64, 4, SchedulerOptions{});
  const auto shared = prompt_of(10, 1);  // two whole blocks and two tokens
  Solo a = run_alone(rig, request(concat(shared, prompt_of(3, 2)), 5));
  EXPECT_EQ(a.start, 0);
  // 10 shared tokens: blocks 0-1 (8 tokens) are reused, the rest computed from position 8.
  const auto pb = concat(shared, prompt_of(5, 3));
  Solo b = run_alone(rig, request(pb, 5));
  EXPECT_EQ(b.start, 8);
  expect_served(*b.out, rig.engine.expected_tokens(pb, 5), FinishReason::kLength);
  const SchedulerStats s = rig.scheduler.stats();
  EXPECT_EQ(s.prefix_cache_query_tokens, 13 + 15);
  EXPECT_EQ(s.prefix_cache_hit_tokens, 8);
  EXPECT_GT(s.kv_blocks_cached, 0);
  rig.expect_clean();  // cached blocks count as free
}

TEST(PrefixCache, AWholeCachedPromptStillComputesItsLastToken) {
  Rig rig(64, 4, SchedulerOptions{});
  for (int n : {12, 13, 4, 1}) {  // a block boundary, one past it, one block, one token
    const auto p = prompt_of(n, n);
    Solo first = run_alone(rig, request(p, 3));
    EXPECT_EQ(first.start, 0);
    Solo again = run_alone(rig, request(p, 3));
    // At most every whole block before the last token: (n - 1) / 4 blocks.
    EXPECT_EQ(again.start, (n - 1) / 4 * 4) << n;
    expect_served(*again.out, rig.engine.expected_tokens(p, 3), FinishReason::kLength);
    EXPECT_EQ(again.out->tokens, first.out->tokens);
  }
  rig.expect_clean();
}

TEST(PrefixCache, ABlockOnlyPartlySharedIsNotReused) {
  Rig rig(64, 4, SchedulerOptions{});
  const auto shared = prompt_of(6, 4);  // one whole block and half of the next
  run_alone(rig, request(concat(shared, prompt_of(6, 5)), 2));
  const auto p = concat(shared, prompt_of(6, 6));
  Solo b = run_alone(rig, request(p, 4));
  EXPECT_EQ(b.start, 4);
  expect_served(*b.out, rig.engine.expected_tokens(p, 4), FinishReason::kLength);
  // A different first token: nothing reused, though later tokens agree.
  auto q = p;
  q[0] = (q[0] + 1) % kVocab;
  Solo c = run_alone(rig, request(q, 4));
  EXPECT_EQ(c.start, 0);
  expect_served(*c.out, rig.engine.expected_tokens(q, 4), FinishReason::kLength);
  rig.expect_clean();
}

TEST(PrefixCache, OffComputesEveryPromptWithTheSameTokens) {
  SchedulerOptions off;
  off.prefix_cache = false;
  Rig rig(64, 4, off);
  const auto p = prompt_of(14, 7);
  Solo a = run_alone(rig, request(p, 4));
  Solo b = run_alone(rig, request(p, 4));
  EXPECT_EQ(b.start, 0);
  EXPECT_EQ(b.out->tokens, a.out->tokens);
  const SchedulerStats s = rig.scheduler.stats();
  EXPECT_EQ(s.prefix_cache_query_tokens, 0);
  EXPECT_EQ(s.kv_blocks_cached, 0);
  rig.expect_clean();
}

TEST(PrefixCache, AMultiTurnChatReusesTheEarlierTurnsGeneratedTokensToo) {
  Rig rig(64, 4, SchedulerOptions{});
  auto history = prompt_of(9, 8);
  int32_t computed_before = 0;  // tokens whose K/V the previous turn computed
  for (int turn = 0; turn < 3; ++turn) {
    Solo r = run_alone(rig, request(history, 7));
    expect_served(*r.out, rig.engine.expected_tokens(history, 7), FinishReason::kLength);
    // Every full block the previous turn computed (its prompt and all but its last answer
    // token), but not the new prompt's last token.
    const int32_t n = static_cast<int32_t>(history.size());
    EXPECT_EQ(r.start, std::min(computed_before / 4, (n - 1) / 4) * 4) << turn;
    computed_before = n + 7 - 1;
    history = concat(concat(history, r.out->tokens), prompt_of(3, 20 + turn));
  }
  rig.expect_clean();
}

TEST(PrefixCache, ConcurrentRequestsShareHeldBlocksWithoutWritingThem) {
  SchedulerOptions options;
  options.max_batch_tokens = 64;
  Rig rig(96, 4, options);
  const auto shared = prompt_of(16, 9);
  Solo warm = run_alone(rig, request(concat(shared, prompt_of(2, 1)), 2));
  const size_t warm_plans = rig.engine.plans().size();
  // Prefixes of different lengths: inside a block, on a boundary, the whole shared prefix, and
  // exactly the cached prompt.
  std::vector<std::vector<int32_t>> prompts = {
      concat(prompt_of(5, 9), prompt_of(4, 30)), concat(prompt_of(8, 9), prompt_of(5, 31)),
      concat(shared, prompt_of(7, 32)), concat(shared, prompt_of(2, 1)),
      concat(shared, prompt_of(7, 32))};
  std::vector<std::shared_ptr<Received>> out;
  for (const auto& p : prompts) out.push_back(rig.submit(request(p, 6)));
  // The fake engine reports a block written while another sequence of the plan reads it.
  rig.scheduler.run_until_idle();
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompts[i], 6), FinishReason::kLength);
  EXPECT_EQ(out[3]->tokens.front(), warm.out->tokens.front());  // the same prompt
  // The five were admitted together; all of them read the first cached block (held 5 times).
  const StepPlan& together = rig.engine.plans()[warm_plans];
  ASSERT_EQ(together.input.n_seqs(), 5);
  for (int32_t s = 1; s < 5; ++s)
    EXPECT_EQ(together.input.block_tables[s * together.input.max_blocks_per_seq],
              together.input.block_tables[0]);
  const SchedulerStats s = rig.scheduler.stats();
  EXPECT_EQ(s.prefix_cache_hit_tokens, 4 + 8 + 16 + 16 + 16);
  rig.expect_clean();
}

TEST(PrefixCache, PreemptedSequencesResumeFromTheirCachedBlocksWithTheSameTokens) {
  SchedulerOptions options;
  options.max_batch_tokens = 16;
  Rig rig(12, 4, options);  // 48 slots; four requests growing to 10 + 14 = 24 tokens each
  const auto shared = prompt_of(8, 11);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<Received>> out;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(concat(shared, prompt_of(2, 40 + i)));
    out.push_back(rig.submit(request(prompts.back(), 14)));
  }
  rig.scheduler.run_until_idle();
  for (int i = 0; i < 4; ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompts[i], 14), FinishReason::kLength);
  const SchedulerStats s = rig.scheduler.stats();
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prefix_cache_hit_tokens, 0);
  rig.expect_clean();
}

TEST(PrefixCache, CachedBlocksAreEvictedOnlyWhenBlocksRunOut) {
  Rig rig(8, 4, SchedulerOptions{});  // 32 slots
  const auto a = prompt_of(12, 12), b = prompt_of(12, 13);
  run_alone(rig, request(a, 2));  // caches 3 blocks of a
  run_alone(rig, request(b, 2));  // caches 3 of b: 6 cached, 2 plain free
  EXPECT_EQ(rig.scheduler.stats().kv_blocks_cached, 6);
  // Still both cached: a and b are reused.
  EXPECT_EQ(run_alone(rig, request(a, 2)).start, 8);
  EXPECT_EQ(run_alone(rig, request(b, 2)).start, 8);
  // A request needing 7 blocks (24 tokens + 1) is admitted at once, evicting the least recently
  // used cached blocks rather than waiting or preempting.
  const auto c = prompt_of(24, 14);
  Solo rc = run_alone(rig, request(c, 2));
  EXPECT_EQ(rc.start, 0);
  expect_served(*rc.out, rig.engine.expected_tokens(c, 2), FinishReason::kLength);
  EXPECT_EQ(rig.scheduler.stats().preemptions, 0);
  EXPECT_EQ(run_alone(rig, request(a, 2)).start, 0);  // evicted
  rig.expect_clean();
}

TEST(PrefixCache, AdaptersNeverShareBlocksAndAReloadedAdapterDoesNotReuseItsOldOnes) {
  Rig rig(96, 4, SchedulerOptions{});
  ASSERT_TRUE(rig.scheduler.load_adapter("a", "/lora/a").ok());
  ASSERT_TRUE(rig.scheduler.load_adapter("b", "/lora/b").ok());
  const int32_t id_a = rig.engine.loads()[0], id_b = rig.engine.loads()[1];
  const auto p = prompt_of(13, 15);
  auto with = [&](const std::string& adapter) {
    GenerationRequest r = request(p, 4);
    r.adapter = adapter;
    return r;
  };
  EXPECT_EQ(run_alone(rig, with("")).start, 0);
  EXPECT_EQ(run_alone(rig, with("a")).start, 0);  // not the base model's blocks
  EXPECT_EQ(run_alone(rig, with("b")).start, 0);  // nor a's
  Solo a2 = run_alone(rig, with("a"));
  EXPECT_EQ(a2.start, 12);  // a's own
  expect_served(*a2.out, rig.engine.expected_tokens(p, 4, id_a), FinishReason::kLength);
  Solo b2 = run_alone(rig, with("b"));
  EXPECT_EQ(b2.start, 12);
  expect_served(*b2.out, rig.engine.expected_tokens(p, 4, id_b), FinishReason::kLength);

  // Unload a and load it again (another generation, maybe other weights): nothing reused.
  AdapterOp op;
  op.kind = AdapterOp::Kind::kUnload;
  op.name = "a";
  bool unloaded = false;
  op.done = [&](absl::StatusOr<AdapterStatus> s) { unloaded = s.ok(); };
  rig.scheduler.submit_adapter_op(op);
  rig.scheduler.run_until_idle();
  ASSERT_TRUE(unloaded);
  ASSERT_TRUE(rig.scheduler.load_adapter("a", "/lora/a").ok());
  const int32_t id_a2 = rig.engine.loads().back();
  EXPECT_NE(id_a2, id_a);
  Solo a3 = run_alone(rig, with("a"));
  EXPECT_EQ(a3.start, 0);
  expect_served(*a3.out, rig.engine.expected_tokens(p, 4, id_a2), FinishReason::kLength);
  EXPECT_EQ(run_alone(rig, with("a")).start, 12);
  rig.expect_clean();
}

TEST(PrefixCache, PromptScoringRequestsComputeTheirWholePrompt) {
  Rig rig(64, 4, SchedulerOptions{});
  const auto p = prompt_of(11, 16);
  run_alone(rig, request(p, 2));
  GenerationRequest scored = request(p, 2);
  scored.score_prompt = true;
  scored.logprob_alternatives = 1;
  Solo r = run_alone(rig, scored);
  EXPECT_EQ(r.start, 0);
  ASSERT_EQ(r.out->prompt_logprobs.size(), p.size() - 1);
  for (size_t i = 0; i + 1 < p.size(); ++i) EXPECT_EQ(r.out->prompt_logprobs[i].token, p[i + 1]);
  expect_served(*r.out, rig.engine.expected_tokens(p, 2), FinishReason::kLength);
  GenerationRequest logits = request(p, 1);
  logits.return_prompt_logits = true;
  EXPECT_EQ(run_alone(rig, logits).start, 0);
  // A later plain request still reuses what the scoring requests computed.
  EXPECT_EQ(run_alone(rig, request(p, 2)).start, 8);
  rig.expect_clean();
}

TEST(PrefixCache, MicroBatchesWithSharedPrefixes) {
  SchedulerOptions options;
  options.micro_batches = 3;
  Rig rig(96, 4, options);
  const auto shared = prompt_of(12, 17);
  run_alone(rig, request(concat(shared, prompt_of(1, 0)), 1));
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<Received>> out;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(concat(shared, prompt_of(1 + i, 50 + i)));
    out.push_back(rig.submit(request(prompts.back(), 9)));
  }
  rig.scheduler.run_until_idle();
  for (int i = 0; i < 6; ++i)
    expect_served(*out[i], rig.engine.expected_tokens(prompts[i], 9), FinishReason::kLength);
  EXPECT_EQ(rig.engine.max_in_flight(), 3);
  rig.expect_clean();
}

}  // namespace
}  // namespace ltm
