// The draft-model proposer (runtime/spec/draft_model.h) on a random-weight GPT-2 from a config
// file: its guesses are the model's greedy continuation, computed again from scratch for every
// token (a fresh proposer, one draft a call) as the reference; per-sequence state computes only
// the new tokens and rolls rejected drafts back; a batch of sequences gives each one's guesses;
// release and eviction free blocks; bad --draft-model values are refused by name.
#include "runtime/spec/draft_model.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace ltm {
namespace {

constexpr int32_t kVocab = 97;

std::string write_config(int vocab, int n_positions = 64) {
  const std::string path =
      ::testing::TempDir() + "/draft_model_test_" + std::to_string(vocab) + "_" +
      std::to_string(n_positions) + ".json";
  std::ofstream(path) << "{\"vocab_size\": " << vocab << ", \"n_positions\": " << n_positions
                      << ", \"n_embd\": 32, \"n_layer\": 2, \"n_head\": 4, "
                         "\"eos_token_id\": null}";
  return path;
}

std::unique_ptr<DraftModelProposer> load(int32_t max_sequences = 4, int n_positions = 64) {
  DraftModelOptions o;
  o.dir = write_config(kVocab, n_positions);
  o.target_vocab = kVocab;
  o.block_size = 4;
  o.max_sequences = max_sequences;
  o.init_std = 0.5f;  // far from uniform logits: no near-ties to round differently
  auto p = DraftModelProposer::load(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// The greedy continuation of `tokens`, one token per call of a fresh, stateless computation.
std::vector<int32_t> reference(std::vector<int32_t> tokens, int k) {
  auto p = load();
  std::vector<int32_t> out;
  for (int i = 0; i < k; ++i) {
    std::vector<int32_t> one;
    p->propose(tokens, 0, 1, &one);
    EXPECT_EQ(one.size(), 1u);
    out.push_back(one.at(0));
    tokens.push_back(one.at(0));
  }
  return out;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 11 + salt * 29 + 5) % kVocab);
  return p;
}

std::vector<int32_t> propose_one(DraftModelProposer& p, uint64_t id,
                                 const std::vector<int32_t>& tokens, int k) {
  std::vector<int32_t> out;
  const DraftRequest r{id, tokens, 0, k, &out};
  p.propose_all(std::span<const DraftRequest>(&r, 1));
  return out;
}

TEST(DraftModel, GuessesTheGreedyContinuationAndRollsRejectedDraftsBack) {
  auto p = load();
  std::vector<int32_t> tokens = prompt(9, 1);
  std::vector<int32_t> d = propose_one(*p, 1, tokens, 5);
  EXPECT_EQ(d, reference(tokens, 5));
  // The prompt, then one row per draft but the last.
  EXPECT_EQ(p->forward_tokens(), 9 + 4);
  EXPECT_EQ(p->forward_steps(), 5);
  // The target accepted two drafts and corrected the third: only the correction is new.
  tokens.insert(tokens.end(), d.begin(), d.begin() + 2);
  tokens.push_back((d[2] + 1) % kVocab);
  const int64_t before = p->forward_tokens();
  d = propose_one(*p, 1, tokens, 5);
  EXPECT_EQ(d, reference(tokens, 5));
  EXPECT_EQ(p->forward_tokens() - before, 1 + 4);
  // All accepted and the last token after them: the last draft (never computed) and the new one.
  tokens.insert(tokens.end(), d.begin(), d.end());
  tokens.push_back(7);
  const int64_t before2 = p->forward_tokens();
  d = propose_one(*p, 1, tokens, 3);
  EXPECT_EQ(d, reference(tokens, 3));
  EXPECT_EQ(p->forward_tokens() - before2, 2 + 2);
  // Tokens that part from the cached ones early (not the scheduler's way, but state is checked,
  // not trusted): recomputed from where they part.
  tokens[3] = (tokens[3] + 1) % kVocab;
  const int64_t before3 = p->forward_tokens();
  d = propose_one(*p, 1, tokens, 2);
  EXPECT_EQ(d, reference(tokens, 2));
  EXPECT_EQ(p->forward_tokens() - before3, static_cast<int64_t>(tokens.size()) - 3 + 1);
  EXPECT_EQ(p->sequences(), 1);
  p->release(1);
  EXPECT_EQ(p->sequences(), 0);
  EXPECT_EQ(p->blocks_free(), p->blocks_total());
}

TEST(DraftModel, ABatchGivesEachSequenceItsOwnGuessesInOnePassPerDraft) {
  auto p = load();
  const std::vector<std::vector<int32_t>> tokens = {prompt(5, 1), prompt(12, 2), prompt(7, 3)};
  const std::vector<int> k = {4, 2, 6};
  std::vector<std::vector<int32_t>> out(3);
  std::vector<DraftRequest> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back({static_cast<uint64_t>(10 + i), tokens[i], 0, k[i], &out[i]});
  p->propose_all(reqs);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], reference(tokens[i], k[i])) << i;
  EXPECT_EQ(p->forward_steps(), 6);  // the longest: one pass per draft, not per sequence
  EXPECT_EQ(p->sequences(), 3);
  for (int i = 0; i < 3; ++i) p->release(10 + i);
  EXPECT_EQ(p->blocks_free(), p->blocks_total());
}

TEST(DraftModel, AFullCacheDropsTheLeastRecentlyUsedSequence) {
  auto p = load(/*max_sequences=*/2);
  // 60 tokens and 3 drafts take 16 blocks of 4: a whole context each.
  const std::vector<int32_t> a = prompt(60, 1), b = prompt(60, 2), c = prompt(60, 3);
  EXPECT_EQ(propose_one(*p, 1, a, 3), reference(a, 3));
  EXPECT_EQ(propose_one(*p, 2, b, 3), reference(b, 3));
  EXPECT_EQ(propose_one(*p, 3, c, 3), reference(c, 3));  // 1 is dropped
  EXPECT_EQ(p->evictions(), 1);
  EXPECT_EQ(p->sequences(), 2);
  EXPECT_EQ(propose_one(*p, 1, a, 3), reference(a, 3));  // computed again
  // Near the end of the context window: no draft at a position past it.
  auto q = load(2, /*n_positions=*/16);
  EXPECT_EQ(propose_one(*q, 1, prompt(14, 1), 8).size(), 3u);  // positions 14, 15, 16
  EXPECT_TRUE(propose_one(*q, 2, prompt(17, 1), 8).empty());
}

TEST(DraftModel, BadDraftModelsAreRefusedByName) {
  DraftModelOptions o;
  o.target_vocab = kVocab;
  o.dir = ::testing::TempDir() + "/no_such_draft_model";
  auto missing = DraftModelProposer::load(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--draft-model"), std::string::npos);
  EXPECT_NE(missing.status().message().find("no such folder"), std::string::npos);
  o.dir = write_config(kVocab + 3);
  auto other = DraftModelProposer::load(o);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("vocabulary of 100 tokens"), std::string::npos)
      << other.status();
  EXPECT_NE(other.status().message().find("target's tokenizer"), std::string::npos);
  o.dir = ::testing::TempDir() + "/draft_model_test_bad.json";
  std::ofstream(o.dir) << "{not json";
  auto bad = DraftModelProposer::load(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--draft-model"), std::string::npos);
}

}  // namespace
}  // namespace ltm
