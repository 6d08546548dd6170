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

// ---- Candidates of a vocab-sharded row (tp > 1), selected where the logits lie ----------------
//
// Each rank of a tp > 1 last stage reduces its slice of every row to what the candidate exchange
// needs (local_candidates in runtime/sampling/sampler.h) with the backend's op
// (Backend::select_candidates), so a device copies back candidates, not [rows, vocab / tp]
// logits. Output, one buffer: [rows] CandidateRowHeader, then row r's entries at byte
// 16 * rows + candidate_row_offset(params, r, valid), in one of two forms fixed by the row's
// parameters (candidate_row_pairs):
//   pairs  (greedy: 1; top_k with 2 min(top_k, valid) < valid: min(top_k, valid)) of
//          CandidateEntry {global id, penalized logit}, in no particular order;
//   slice  (anything else: top-p or plain draws, and top-k rows whose pairs would outweigh the
//          slice) the penalized logits of the whole slice, ids id_begin.. implicit.
// Sampling from the union of every rank's entries gives sample()'s token on the whole row (a
// top-k row's global top-k is among any superset of the local top-ks). A slice with a NaN or
// +inf has count 0 and that local_max, as local_candidates reports it. So a row copies back
// 16 bytes plus at most its slice (4 x valid bytes), 24 bytes for a greedy one.
struct CandidateRowHeader {
  float local_max = 0.0f;     // CandidateSet::local_max
  int32_t count = 0;          // entries written (pairs or logits)
  double local_sum_exp = 0.0; // CandidateSet::local_sum_exp
};
static_assert(sizeof(CandidateRowHeader) == 16, "CandidateRowHeader crosses to the host as bytes");
struct CandidateEntry {
  int32_t id;
  float logit;
};

#if defined(__CUDACC__)
#define LTM_HOST_DEVICE __host__ __device__
#else
#define LTM_HOST_DEVICE
#endif

// Whether row `p`'s entries are pairs (else the slice's logits).
LTM_HOST_DEVICE inline bool candidate_row_pairs(const SampleRowParams& p, int64_t valid) {
  if (p.temperature == 0.0f) return true;
  if (p.top_k <= 0) return false;
  const int64_t k = p.top_k < valid ? p.top_k : valid;
  return 2 * k < valid;
}
// Bytes of row `p`'s entries (a multiple of 8).
LTM_HOST_DEVICE inline int64_t candidate_row_bytes(const SampleRowParams& p, int64_t valid) {
  if (valid <= 0) return 0;
  if (p.temperature == 0.0f) return 8;
  if (candidate_row_pairs(p, valid)) return 8 * (p.top_k < valid ? p.top_k : valid);
  return (4 * valid + 7) / 8 * 8;
}
// Byte offset of row r's entries after the headers.
LTM_HOST_DEVICE inline int64_t candidate_row_offset(const SampleRowParams* params, int32_t r,
                                                    int64_t valid) {
  int64_t at = 0;
  for (int32_t i = 0; i < r; ++i) at += candidate_row_bytes(params[i], valid);
  return at;
}

// Pointers are the backend's memory (host memory for the CPU backend).
struct CandidateRowsArgs {
  int32_t rows = 0;
  int64_t valid = 0;                        // this rank's real vocab rows (padding excluded)
  int64_t stride = 0;                       // floats between rows of `logits` (>= valid)
  int32_t id_begin = 0;                     // global id of the slice's first logit
  const float* logits = nullptr;            // [rows, stride]: this rank's slice
  const SampleRowParams* params = nullptr;  // [rows] (seed and token_index unused)
  const int32_t* history = nullptr;         // global ids, as SampleRowsArgs'
  void* out = nullptr;                      // candidate_rows_bytes(...)
};
// Bytes of the output buffer: headers and every row's entries.
int64_t candidate_rows_bytes(const SampleRowParams* params, int32_t rows, int64_t valid);

// The host's op (the CPU backend's): local_candidates per row, written as above.
void select_candidates_host(const CandidateRowsArgs& args, int threads);
// Row r of an output buffer (on the host) as local_candidates' CandidateSet.
struct CandidateSet;
void read_candidate_row(const void* out, const SampleRowParams* params, int32_t rows,
                        int64_t valid, int32_t id_begin, int32_t r, CandidateSet* set);

}  // namespace ltm
