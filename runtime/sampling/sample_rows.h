// The sample op's arguments (Backend::sample_rows): a batch of logit rows sampled where they lie,
// so that a device backend copies back token ids (and logprobs when asked), not [rows, vocab]
// logits. Plain data with no dependencies: the CUDA kernels (kernels/cuda/sampling.cu) read the
// same structs, and the host sampler (sample_rows_host below) is the reference they must equal.
//
// Each row is sample() (runtime/sampling/sampler.h) on logits[r * stride, r * stride + vocab)
// with the row's params, its history and the generator Rng::for_step(seed, token_index); the
// token (or a RowError, < 0) goes to tokens[r] and, when `logprobs` is not null, sample()'s
// logprob to logprobs[r] (NaN for a greedy row whose want_logprob is 0, and for a failed row).
#pragma once

#include <cstdint>

namespace ltm {

// One row's sampling parameters (SamplingParams plus where its history lies). 40 bytes, 8-aligned.
struct SampleRowParams {
  float temperature = 1.0f;         // >= 0; 0 => greedy
  int32_t top_k = 0;                // >= 0; 0 => off
  float top_p = 1.0f;               // (0, 1]; 1 => off
  float repetition_penalty = 1.0f;  // > 0; 1 => off
  uint64_t seed = 0;                // with token_index: the row's generator (RngCore::for_step)
  int32_t token_index = 0;
  int32_t history_offset = 0;       // this row's ids: history[history_offset, + history_count)
  int32_t history_count = 0;        // read only when repetition_penalty != 1
  int32_t want_logprob = 1;         // 0: a greedy row may skip the softmax normalizer
};
static_assert(sizeof(SampleRowParams) == 40, "SampleRowParams crosses to the device as bytes");

// Pointers are the backend's memory (host memory for the CPU backend).
struct SampleRowsArgs {
  int32_t rows = 0;
  int64_t vocab = 0;                         // the real vocab (a padded row is cut to it)
  int64_t stride = 0;                        // floats between rows of `logits` (>= vocab)
  const float* logits = nullptr;             // [rows, stride]
  const SampleRowParams* params = nullptr;   // [rows]
  const int32_t* history = nullptr;          // every row's history ids, concatenated
  int32_t* tokens = nullptr;                 // [rows] out
  float* logprobs = nullptr;                 // [rows] out, or null: none asked
};

// The host sampler over a batch, rows spread over up to `threads` OpenMP threads (each row has
// its own generator, so the split does not change any result). The CPU backend's sample op.
// Preconditions as sample()'s (LTM_ASSERT; the first failure is rethrown on the caller's thread).
void sample_rows_host(const SampleRowsArgs& args, int threads);

}  // namespace ltm
