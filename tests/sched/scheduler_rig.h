// What the fake-engine scheduler tests share: a scheduler over a FakeEngine (fake_engine.h), a
// request's outcome as its callback saw it, prompts and requests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/sched/scheduler.h"
#include "tests/sched/fake_engine.h"

namespace ltm {
namespace sched_test {

inline constexpr int32_t kVocab = 101;

inline ModelConfig fake_config() {
  ModelConfig c;
  c.vocab_size = kVocab;
  c.n_positions = 1024;
  c.n_embd = 8;
  c.n_layer = 1;
  c.n_head = 1;
  c.n_inner = 8;
  c.eos_token_id = -1;
  return c;
}

// What one request received; written by the callback (the step thread).
struct Received {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::vector<RowLogprobs> prompt_logprobs;
  int finals = 0;
  int events_after_final = 0;
  GenerationEvent last;

  EventCallback callback() {
    return [this](GenerationEvent ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (finals > 0) events_after_final++;
      tokens.insert(tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      prompt_logprobs.insert(prompt_logprobs.end(), ev.prompt_logprobs.begin(),
                             ev.prompt_logprobs.end());
      if (ev.finished) {
        finals++;
        last = ev;
      }
      cv.notify_all();
    };
  }
  void wait_tokens(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return tokens.size() >= n || finals > 0; });
  }
  void wait_final() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finals > 0; });
  }
};

inline std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7 + salt * 13 + 3) % kVocab);
  return p;
}

inline GenerationRequest request(std::vector<int32_t> prompt, int max_new, std::string id = "r") {
  GenerationRequest r;
  r.request_id = std::move(id);
  r.prompt_ids = std::move(prompt);
  r.max_new_tokens = max_new;
  r.sampling.temperature = 0;
  return r;
}

struct Rig {
  int32_t n_blocks, block_size;
  ModelConfig config = fake_config();
  FakeEngine engine;
  Scheduler scheduler;
  Rig(int32_t blocks, int32_t block, SchedulerOptions options)
      : n_blocks(blocks), block_size(block), engine(kVocab, blocks, block),
        scheduler(engine, nullptr, config, blocks, block, options) {}

  std::shared_ptr<Received> submit(GenerationRequest r) {
    auto o = std::make_shared<Received>();
    absl::Status s = scheduler.submit(std::move(r), o->callback());
    EXPECT_TRUE(s.ok()) << s;
    return o;
  }
  void expect_clean() {
    for (const std::string& e : engine.errors()) ADD_FAILURE() << "fake engine: " << e;
    const SchedulerStats st = scheduler.stats();
    EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total) << "blocks leaked";
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.queue_depth, 0);
  }
};

inline void expect_served(const Received& o, const std::vector<int32_t>& want, FinishReason reason) {
  EXPECT_EQ(o.finals, 1);
  EXPECT_EQ(o.events_after_final, 0);
  EXPECT_EQ(o.tokens, want);
  EXPECT_EQ(o.last.finish_reason, reason) << finish_reason_name(o.last.finish_reason);
  EXPECT_EQ(o.last.completion_tokens, static_cast<int32_t>(o.tokens.size()));
}

}  // namespace sched_test
}  // namespace ltm
