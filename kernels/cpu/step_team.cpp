#include "kernels/cpu/step_team.h"

#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>

namespace ltm::kernels::cpu {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// How long a waiting thread spins before it sleeps: longer than the gaps between one layer's
// kernels (the step thread's layer norms, quantization, KV writes: microseconds), short enough
// that a step that waits on something else gives the core away.
constexpr auto kSpin = std::chrono::microseconds(50);

struct Team {
  int size = 1;
  // Bumped for each job (and once more to end the step); the waiting threads compare it with
  // the last one they saw.
  std::atomic<uint64_t> generation{0};
  std::atomic<int> done{0};
  std::atomic<int> sleepers{0};
  std::atomic<bool> lead_sleeps{false};  // thread 0 sleeps until `done` is complete
  bool stop = false;  // written before the generation that ends the step
  void (*job)(void*, int, int) = nullptr;
  void* ctx = nullptr;
  std::mutex mu;
  std::condition_variable cv;

  // Publishes the job (or the stop) set by the caller.
  void post() {
    generation.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }

  // A waiting thread: the next generation after `seen`.
  uint64_t await(uint64_t seen) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 1;; ++i) {
      const uint64_t g = generation.load(std::memory_order_acquire);
      if (g != seen) return g;
      cpu_relax();
      if (i % 256 == 0 && std::chrono::steady_clock::now() - t0 > kSpin) break;
    }
    std::unique_lock<std::mutex> lock(mu);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint64_t g;
    cv.wait(lock, [&] { return (g = generation.load(std::memory_order_seq_cst)) != seen; });
    sleepers.fetch_sub(1, std::memory_order_relaxed);
    return g;
  }

  void serve(int t) {
    uint64_t seen = 0;
    for (;;) {
      seen = await(seen);
      if (stop) return;
      job(ctx, t, size);
      done.fetch_add(1, std::memory_order_seq_cst);
      if (lead_sleeps.load(std::memory_order_seq_cst)) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }

  // Thread 0: until the other threads have finished the job (spinning a while, then sleeping,
  // so that a thread that lost its core to another process gets one).
  void await_done() {
    const int others = size - 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 1; done.load(std::memory_order_acquire) < others; ++i) {
      cpu_relax();
      if (i % 256 == 0 && std::chrono::steady_clock::now() - t0 > kSpin) {
        std::unique_lock<std::mutex> lock(mu);
        lead_sleeps.store(true, std::memory_order_seq_cst);
        cv.wait(lock, [&] { return done.load(std::memory_order_seq_cst) >= others; });
        lead_sleeps.store(false, std::memory_order_relaxed);
        return;
      }
    }
  }
};

thread_local Team* current = nullptr;

}  // namespace

bool in_step_team() { return current != nullptr; }

int step_team_size() { return current != nullptr ? current->size : 1; }

void step_team_run(void (*job)(void*, int, int), void* ctx) {
  Team& team = *current;
  team.job = job;
  team.ctx = ctx;
  team.done.store(0, std::memory_order_relaxed);
  team.post();
  job(ctx, 0, team.size);
  team.await_done();
}

void run_step_team(int threads, const std::function<void()>& step) {
  if (threads <= 1 || omp_in_parallel()) {  // inside a step: thread 0 is in its region
    step();
    return;
  }
  Team team;
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
#pragma omp single
    team.size = omp_get_num_threads();  // its barrier: every thread sees the size
    if (t == 0) {
      current = team.size > 1 ? &team : nullptr;
      try {
        step();
      } catch (...) {
        error = std::current_exception();
      }
      current = nullptr;
      if (team.size > 1) {
        team.stop = true;
        team.post();
      }
    } else {
      team.serve(t);
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace ltm::kernels::cpu
