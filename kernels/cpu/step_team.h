// A small step (a one-row decode, a speculative verify step, a few sequences' decode: up to
// Backend::kSmallStepRows rows) on a team of threads without an OpenMP region per kernel.
//
// A one-sequence decode step runs ~60 parallel kernels (each layer's four gemvs and its attention,
// then the logits), each a few to a few tens of microseconds. As OpenMP regions each costs a
// region start and an end barrier in libgomp, with a futex wake (a system call) in each: ~3 us a
// region on the Zen 5 VM, together ~5% of an int8 GPT-2-124M token there (docs/benchmarks.md,
// "A step-long team for one-row decode"). run_step_team instead opens one OpenMP region for the
// whole step: the calling thread runs the step as thread 0, and the others wait in a loop for
// the kernels it hands out (step_team_run), spinning a while and then sleeping, so that a step
// that waits (an MPI receive, the sampler) does not hold their cores. Verify steps of 2-8 rows
// ran on regions until 2026-12-06, so the team made the one-row steps cheaper and not them:
// speculative decoding's gain on models/kjv-small's copy prompts (Zen 4 VM) was 1.57x before
// the team, 1.24-1.33x after; with verify steps on the team too, 1.35-1.37x.
//
// Kernels that a step calls ask in_step_team(): when true they hand their work to
// step_team_run instead of opening a region (one opened anyway runs on thread 0 alone: OpenMP
// does not nest here). Nothing may throw inside a job; the step itself may throw (the team is
// released and the exception rethrown on the calling thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace ltm::kernels::cpu {

// Runs step() on this thread with `threads` threads in all (the others serve step_team_run).
// With threads <= 1, inside another parallel region, or in a step already: step() alone.
void run_step_team(int threads, const std::function<void()>& step);

// Whether this thread is driving a step team (inside run_step_team's step).
bool in_step_team();

// The team's size (1 outside a step).
int step_team_size();

// job(t, nt) on every thread of the step's team (t = 0 on this one); returns when all are done.
// Only from the step's thread, while in_step_team().
void step_team_run(void (*job)(void* ctx, int t, int nt), void* ctx);

template <typename Fn>
void step_team_run(Fn& fn) {
  step_team_run([](void* ctx, int t, int nt) { (*static_cast<Fn*>(ctx))(t, nt); }, &fn);
}

// fn(i) for i in [0, n) on the step's team, each thread taking the next i as it frees up (as
// OpenMP's schedule(dynamic)). Only while in_step_team().
template <typename Fn>
void step_team_for(int64_t n, Fn&& fn) {
  std::atomic<int64_t> next{0};
  auto job = [&](int, int) {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  };
  step_team_run(job);
}

// fn(i) for i in [0, n) on the step's team in contiguous blocks, thread t taking
// [n t / nt, n (t + 1) / nt) (as OpenMP's schedule(static)). Only while in_step_team().
template <typename Fn>
void step_team_static(int64_t n, Fn&& fn) {
  auto job = [&](int t, int nt) {
    for (int64_t i = n * t / nt, end = n * (t + 1) / nt; i < end; ++i) fn(i);
  };
  step_team_run(job);
}

}  // namespace ltm::kernels::cpu
