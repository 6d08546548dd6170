// The vocab-parallel sampling wire format: rows written by append_candidates read back exactly,
// in order, and a truncated or corrupt blob is refused instead of read past its end.
#include "runtime/engine/candidate_exchange.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ltm {
namespace {

CandidateSet make_set(int n, float max, double sum) {
  CandidateSet s;
  for (int i = 0; i < n; ++i) s.candidates.push_back({100 + 7 * i, 0.5f * i - 3.0f});
  s.local_max = max;
  s.local_sum_exp = sum;
  return s;
}

TEST(CandidateExchange, RowsRoundTripInOrder) {
  std::string blob;
  append_candidates(make_set(3, 1.5f, 2.25), &blob);
  append_candidates(make_set(0, -1.0f, 0.0), &blob);
  append_candidates(make_set(5, 4.0f, 7.125), &blob);
  EXPECT_EQ(blob.size(), 3 * 16 + 8 * 8u);

  size_t pos = 0;
  std::vector<Candidate> got;
  LogNormalizer norm;
  ASSERT_TRUE(read_candidates(blob, &pos, &norm, &got).ok());
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(norm.max, 1.5f);
  EXPECT_EQ(norm.sum_exp, 2.25);
  EXPECT_EQ(got[2].id, 114);
  EXPECT_EQ(got[2].logit, -2.0f);
  ASSERT_TRUE(read_candidates(blob, &pos, &norm, &got).ok());
  EXPECT_EQ(got.size(), 3u);  // an empty row appends nothing
  EXPECT_EQ(norm.max, -1.0f);
  ASSERT_TRUE(read_candidates(blob, &pos, &norm, &got).ok());
  EXPECT_EQ(got.size(), 8u);  // appended after the first row's
  EXPECT_EQ(got[3].id, 100);
  EXPECT_EQ(norm.sum_exp, 7.125);
  EXPECT_EQ(pos, blob.size());
}

TEST(CandidateExchange, TruncatedOrCorruptBlobsAreDataLoss) {
  std::string blob;
  append_candidates(make_set(4, 0.0f, 1.0), &blob);
  for (size_t cut : {size_t{0}, size_t{7}, size_t{16}, blob.size() - 1}) {
    size_t pos = 0;
    std::vector<Candidate> got;
    LogNormalizer norm;
    const absl::Status s = read_candidates(blob.substr(0, cut), &pos, &norm, &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << cut;
    EXPECT_TRUE(got.empty()) << cut;
    EXPECT_EQ(pos, 0u) << cut;
  }
  std::string bad = blob;
  const int32_t negative = -2;
  std::memcpy(bad.data(), &negative, sizeof(negative));
  size_t pos = 0;
  std::vector<Candidate> got;
  LogNormalizer norm;
  EXPECT_EQ(read_candidates(bad, &pos, &norm, &got).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ltm
