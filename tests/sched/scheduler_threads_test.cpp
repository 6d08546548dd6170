// The scheduler's threads: client threads submit, cancel, set deadlines and poll stats() while
// the step thread serves (with preemption: the KV cache holds far fewer blocks than the running
// requests want), then stop() drains it. Each request gets exactly one final event, nothing after
// it, and as many tokens as its usage says. A real one-rank engine on a tiny random model runs the
// steps. Written for ThreadSanitizer above all (scripts/test_tsan runs every test of tests/serve
// and tests/sched): it puts the scheduler's cross-thread paths under TSan; ctest runs it too.
// (The scheduler's behaviour step by step is for a fake-engine suite, issue 21.)
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"
#include "runtime/sched/scheduler.h"

namespace ltm {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 97;
  c.n_positions = 64;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_inner = 64;
  c.eos_token_id = -1;
  return c;
}

// What one request saw, written by the step thread's callback and read by its client.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  int finals = 0;
  int events_after_final = 0;
  int tokens = 0;
  GenerationEvent last;
  bool refused = false;  // a deadline the scheduler projected it could not meet (admission.h)
};

struct Rig {
  static constexpr int kBlock = 4;
  static constexpr int kBlocks = 24;  // 96 token slots for up to 6 requests of up to 48 tokens
  ModelConfig config = tiny_config();
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  parallel::SoloCommunicator world{"world"};
  parallel::SoloCommunicator tp{"tp"};
  parallel::SoloCommunicator pp{"pp"};
  std::unique_ptr<WeightSource> source = make_random_source(config, 5, 0.2f);
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Engine> engine;

  Rig() {
    auto m = Model::load(*source, *backend, ShardSpec{}, tp);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(*m);
    cache = std::make_unique<KvCache>(*backend, config.n_layer, config.n_head, config.head_dim(),
                                      kBlock, kBlocks);
    engine = std::make_unique<Engine>(*model, *backend, *cache, Comms{world, tp, pp, tp, pp});
  }
};

TEST(SchedulerThreads, ClientsSubmitCancelAndPollWhileTheStepThreadServesThenADrain) {
  Rig rig;
  SchedulerOptions options;
  options.max_batch_tokens = 24;
  options.max_running = 6;
  options.max_queue = 512;
  Scheduler scheduler(*rig.engine, nullptr, rig.config, Rig::kBlocks, Rig::kBlock, options);
  // One OpenMP thread on the step thread (the backend set it only on this one): the kernels'
  // parallel regions would synchronize inside libgomp, which TSan does not see; this test is
  // about the scheduler's threads, not the kernels'.
  std::thread step([&] {
    omp_set_num_threads(1);
    scheduler.serve();
  });

  constexpr int kClients = 4;
  constexpr int kPerClient = 24;
  std::vector<std::shared_ptr<Outcome>> outcomes(kClients * kPerClient);
  std::vector<GenerationRequest> sent(outcomes.size());
  std::atomic<bool> clients_done{false};
  std::atomic<int64_t> polls{0};

  std::thread poller([&] {
    while (!clients_done.load()) {
      const SchedulerStats s = scheduler.stats();
      EXPECT_LE(s.kv_blocks_free, s.kv_blocks_total);
      EXPECT_LE(s.running, options.max_running);
      (void)scheduler.adapters();
      polls.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });

  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(1000 + c);
      for (int i = 0; i < kPerClient; ++i) {
        const int k = c * kPerClient + i;
        auto outcome = std::make_shared<Outcome>();
        outcomes[k] = outcome;
        GenerationRequest req;
        req.request_id = absl::StrCat("r", k);
        const int n_prompt = 8 + static_cast<int>(rng() % 9);
        for (int t = 0; t < n_prompt; ++t)
          req.prompt_ids.push_back(static_cast<int32_t>(rng() % rig.config.vocab_size));
        req.max_new_tokens = 16 + static_cast<int32_t>(rng() % 17);
        req.sampling.temperature = (k % 2 == 0) ? 0.0f : 0.8f;
        req.sampling.seed = static_cast<uint64_t>(k);
        req.ignore_eos = true;
        if (k % 7 == 3) req.deadline = Clock::now() + std::chrono::milliseconds(2 + k % 5);
        std::shared_ptr<CancelFlag> cancel = req.cancel;
        sent[k] = req;
        absl::Status s = scheduler.submit(std::move(req), [outcome](GenerationEvent e) {
          std::lock_guard<std::mutex> lock(outcome->mu);
          if (outcome->finals > 0) {
            outcome->events_after_final++;
            return;
          }
          outcome->tokens += static_cast<int>(e.token_ids.size());
          if (e.finished) {
            outcome->finals++;
            outcome->last = std::move(e);
            outcome->cv.notify_all();
          }
        });
        if (k % 7 == 3 && s.code() == absl::StatusCode::kResourceExhausted) {
          outcome->refused = true;  // its callback never runs
          continue;
        }
        ASSERT_TRUE(s.ok()) << s;
        if (k % 5 == 1) {  // cancelled from this thread while it runs (or waits)
          std::this_thread::sleep_for(std::chrono::microseconds(100 * (k % 4)));
          cancel->cancelled.store(true);
        }
      }
      // Each client waits for its own requests' final events, as an RPC thread would.
      for (int i = 0; i < kPerClient; ++i) {
        Outcome& o = *outcomes[c * kPerClient + i];
        if (o.refused) continue;
        std::unique_lock<std::mutex> lock(o.mu);
        ASSERT_TRUE(o.cv.wait_for(lock, std::chrono::seconds(120), [&] { return o.finals > 0; }))
            << "request r" << c * kPerClient + i << " never finished";
      }
    });
  }
  for (std::thread& t : clients) t.join();
  clients_done.store(true);
  poller.join();

  scheduler.stop(Clock::now() + std::chrono::seconds(10));
  step.join();
  // After the drain: refused at once, and the callback never runs.
  GenerationRequest late;
  late.prompt_ids = {1, 2, 3};
  bool called = false;
  absl::Status s = scheduler.submit(std::move(late), [&](GenerationEvent) { called = true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_FALSE(called);

  int lengths = 0, cut = 0, refused = 0;
  for (size_t k = 0; k < outcomes.size(); ++k) {
    Outcome& o = *outcomes[k];
    std::lock_guard<std::mutex> lock(o.mu);
    SCOPED_TRACE(absl::StrCat("request r", k));
    if (o.refused) {
      ++refused;
      EXPECT_EQ(o.finals, 0);
      continue;
    }
    EXPECT_EQ(o.finals, 1);
    EXPECT_EQ(o.events_after_final, 0);
    EXPECT_EQ(o.tokens, o.last.completion_tokens);
    EXPECT_EQ(o.last.prompt_tokens, static_cast<int>(sent[k].prompt_ids.size()));
    const bool may_be_cut = (k % 5 == 1) || (k % 7 == 3);
    if (o.last.finish_reason == FinishReason::kLength) {
      ++lengths;
      EXPECT_EQ(o.last.completion_tokens, sent[k].max_new_tokens);
    } else {
      ++cut;
      EXPECT_TRUE(may_be_cut) << "ended " << finish_reason_name(o.last.finish_reason) << ": "
                              << o.last.status;
      EXPECT_EQ(o.last.finish_reason, FinishReason::kCancelled);
      EXPECT_LT(o.last.completion_tokens, sent[k].max_new_tokens);
    }
  }
  const SchedulerStats st = scheduler.stats();
  EXPECT_EQ(st.requests_served, static_cast<int64_t>(outcomes.size()) - refused);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queue_depth, 0);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  EXPECT_GT(st.preemptions, 0) << "the cache was meant to run out: the test covers too little";
  EXPECT_GT(lengths, 0);
  EXPECT_GT(polls.load(), 0);
  std::printf("scheduler threads: %d whole, %d cancelled or past their deadline, %d refused for "
              "their deadline, %lld preemptions, %lld steps, %lld stats polls\n",
              lengths, cut, refused, static_cast<long long>(st.preemptions),
              static_cast<long long>(st.steps), static_cast<long long>(polls.load()));
}

}  // namespace
}  // namespace ltm
