// ServeMetrics (runtime/sched/metrics.h): the Prometheus text it renders, line by line — HELP and
// TYPE before every family, cumulative histogram buckets ending in +Inf == _count, label
// escaping, counters and live gauges. (The e2e test also parses it with prometheus_client.)
#include "runtime/sched/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace ltm {
namespace {

using ::testing::HasSubstr;

// name{labels} -> value for every sample line; fails on a line that is not a comment or sample.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(MetricsTest, HistogramIsCumulative) {
  Histogram h({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 5.0, 50.0}) h.observe(v);
  h.observe(std::nan(""));  // ignored
  const Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 5}));  // le is inclusive
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 55.65);
}

TEST(MetricsTest, RendersEveryFamilyWithHelpAndType) {
  ServeMetrics m;
  m.set_build_info({"1.2.3", "tp2pp2", "bf16", "fp16"});
  m.set_stats_source([] {
    LiveStats l;
    l.engine.kv_blocks_total = 100;
    l.engine.kv_blocks_free = 60;
    l.engine.kv_blocks_cached = 25;
    l.engine.queue_depth = 3;
    l.engine.running = 5;
    l.preemptions = 7;
    l.steps = 11;
    l.prefix_cache_query_tokens = 900;
    l.prefix_cache_hit_tokens = 640;
    l.spec_proposed_tokens = 50;
    l.spec_accepted_tokens = 30;
    l.spec_steps = 12;
    return l;
  });
  m.count_request(FrontDoor::kHttp, Outcome::kOk);
  m.count_request(FrontDoor::kHttp, Outcome::kOk);
  m.count_request(FrontDoor::kGrpc, Outcome::kQueueFull);
  m.count_refused(RefuseReason::kDeadline);
  m.count_refused(RefuseReason::kDeadline);
  m.count_shed(ShedReason::kDeadline);
  m.add_prompt_tokens(10);
  m.add_generation_tokens(4);
  m.observe_time_to_first_token(0.003);
  m.observe_inter_token_latency(0.02);
  m.observe_inter_token_latency(200);  // beyond the last bound: +Inf only
  m.observe_request_latency(1.5);
  m.observe_step(0.004, 0.001);
  m.observe_request_spec(10, 7);
  m.observe_request_spec(0, 0);  // no drafts: not a sample
  const std::string text = m.render();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');

  const std::map<std::string, double> s = samples(text);
  EXPECT_EQ(s.at(R"(ltm_build_info{version="1.2.3",layout="tp2pp2",weight_dtype="bf16",kv_dtype="fp16"})"), 1);
  EXPECT_EQ(s.at(R"(ltm_requests_total{front_door="http",outcome="ok"})"), 2);
  EXPECT_EQ(s.at(R"(ltm_requests_total{front_door="grpc",outcome="queue_full"})"), 1);
  EXPECT_EQ(s.at(R"(ltm_requests_total{front_door="grpc",outcome="ok"})"), 0);  // present at 0
  EXPECT_EQ(s.at(R"(ltm_requests_refused_total{reason="deadline"})"), 2);
  EXPECT_EQ(s.at(R"(ltm_requests_refused_total{reason="queue_full"})"), 0);
  EXPECT_EQ(s.at(R"(ltm_requests_shed_total{reason="deadline"})"), 1);
  EXPECT_EQ(s.at("ltm_prompt_tokens_total"), 10);
  EXPECT_EQ(s.at("ltm_generation_tokens_total"), 4);
  EXPECT_EQ(s.at("ltm_preemptions_total"), 7);
  EXPECT_EQ(s.at("ltm_steps_total"), 11);
  EXPECT_EQ(s.at("ltm_queue_depth"), 3);
  EXPECT_EQ(s.at("ltm_running_sequences"), 5);
  EXPECT_EQ(s.at("ltm_kv_blocks_used"), 40);
  EXPECT_EQ(s.at("ltm_kv_blocks_total"), 100);
  EXPECT_EQ(s.at("ltm_kv_blocks_cached"), 25);
  EXPECT_EQ(s.at("ltm_prefix_cache_query_tokens_total"), 900);
  EXPECT_EQ(s.at("ltm_prefix_cache_hit_tokens_total"), 640);
  EXPECT_EQ(s.at("ltm_spec_proposed_tokens_total"), 50);
  EXPECT_EQ(s.at("ltm_spec_accepted_tokens_total"), 30);
  EXPECT_EQ(s.at("ltm_spec_steps_total"), 12);
  EXPECT_EQ(s.at(R"(ltm_spec_request_acceptance_rate_bucket{le="0.6"})"), 0);
  EXPECT_EQ(s.at(R"(ltm_spec_request_acceptance_rate_bucket{le="0.7"})"), 1);
  EXPECT_EQ(s.at("ltm_spec_request_acceptance_rate_count"), 1);
  EXPECT_EQ(s.at(R"(ltm_time_to_first_token_seconds_bucket{le="0.0025"})"), 0);
  EXPECT_EQ(s.at(R"(ltm_time_to_first_token_seconds_bucket{le="0.005"})"), 1);
  EXPECT_EQ(s.at(R"(ltm_inter_token_latency_seconds_bucket{le="120"})"), 1);
  EXPECT_EQ(s.at(R"(ltm_inter_token_latency_seconds_bucket{le="+Inf"})"), 2);
  EXPECT_EQ(s.at("ltm_inter_token_latency_seconds_count"), 2);
  EXPECT_DOUBLE_EQ(s.at("ltm_inter_token_latency_seconds_sum"), 200.02);
  EXPECT_EQ(s.at("ltm_e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(s.at("ltm_step_seconds_count"), 1);
  EXPECT_EQ(s.at("ltm_allreduce_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(s.at("ltm_allreduce_seconds_sum"), 0.001);

  // Every family has HELP then TYPE, once, before its samples.
  for (const char* family :
       {"ltm_build_info gauge", "ltm_requests_total counter", "ltm_prompt_tokens_total counter",
        "ltm_requests_refused_total counter", "ltm_requests_shed_total counter",
        "ltm_generation_tokens_total counter", "ltm_preemptions_total counter",
        "ltm_queue_depth gauge", "ltm_running_sequences gauge", "ltm_kv_blocks_used gauge",
        "ltm_kv_blocks_total gauge", "ltm_kv_blocks_cached gauge",
        "ltm_prefix_cache_query_tokens_total counter", "ltm_prefix_cache_hit_tokens_total counter",
        "ltm_spec_proposed_tokens_total counter", "ltm_spec_accepted_tokens_total counter",
        "ltm_spec_steps_total counter", "ltm_spec_request_acceptance_rate histogram",
        "ltm_time_to_first_token_seconds histogram",
        "ltm_inter_token_latency_seconds histogram", "ltm_e2e_request_latency_seconds histogram",
        "ltm_step_seconds histogram", "ltm_allreduce_seconds histogram"}) {
    const std::string type_line = std::string("# TYPE ") + family + "\n";
    const size_t at = text.find(type_line);
    ASSERT_NE(at, std::string::npos) << family;
    EXPECT_EQ(text.find(type_line, at + 1), std::string::npos) << family;
    const std::string name = std::string(family).substr(0, std::string(family).find(' '));
    EXPECT_LT(text.find("# HELP " + name + " "), at) << family;
  }
  // Bucket bounds are written short, not as 0.0025000000000000001.
  EXPECT_THAT(text, HasSubstr(R"(le="0.0025")"));
  EXPECT_EQ(text.find("00000000001"), std::string::npos);
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  EXPECT_EQ(prometheus_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  ServeMetrics m;
  m.set_build_info({"v\"1", "tp1pp1", "f32", "f32"});
  EXPECT_THAT(m.render(), HasSubstr(R"(version="v\"1")"));
}

TEST(MetricsTest, OutcomesOfStatusCodes) {
  EXPECT_EQ(outcome_of(absl::StatusCode::kOk), Outcome::kOk);
  EXPECT_EQ(outcome_of(absl::StatusCode::kInvalidArgument), Outcome::kInvalid);
  EXPECT_EQ(outcome_of(absl::StatusCode::kUnauthenticated), Outcome::kUnauthenticated);
  EXPECT_EQ(outcome_of(absl::StatusCode::kResourceExhausted), Outcome::kQueueFull);
  EXPECT_EQ(outcome_of(absl::StatusCode::kUnavailable), Outcome::kUnavailable);
  EXPECT_EQ(outcome_of(absl::StatusCode::kCancelled), Outcome::kCancelled);
  EXPECT_EQ(outcome_of(absl::StatusCode::kDeadlineExceeded), Outcome::kCancelled);
  EXPECT_EQ(outcome_of(absl::StatusCode::kInternal), Outcome::kError);
}

}  // namespace
}  // namespace ltm
