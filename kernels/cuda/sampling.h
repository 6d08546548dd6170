// Sampling on the device: the CUDA twin of the host sampler (runtime/sampling/sampler.h, over a
// batch as sample_rows_host in runtime/sampling/sample_rows.h), drawing the same tokens.
//
// One thread block per row runs the host's algorithm step by step: repetition penalty, the row
// max through order keys (bad rows: the same RowError), greedy's first argmax, the normalizer z
// summed exactly as the host sums it (blocks of 256 ids, 8 lanes added in a fixed tree, blocks
// added in id order, in double), top-k as the k largest values sorted descending, top-p by the
// host's widening thresholds (its blocked estimate over the kept values in id order included),
// the draw with the generator RngCore::for_step (runtime/sampling/rng_core.h, the host's code),
// and a drawn position mapped to ids in (logit desc, id asc) order. The host's exp_approx is
// ported operation for operation and this file is compiled with --fmad=false (the host sampler
// with -ffp-contract=off), so every float and double operation rounds as on the host; sorting
// and selection only permute equal values (and -0/+0, whose weights are equal), which no decision
// depends on. So a seeded row gives the host's token bit for bit, and the logprob too except
// that log(z) is the device's double log (<= 1 ulp of double from glibc's), which reaches the
// float logprob only when it falls on a rounding boundary (the GPU test allows 1 float ulp).
//
// Not the host's: a history id outside [0, vocab) is skipped (the host asserts; requests are
// validated before they are queued). Cost: a few passes over the row per step, plus a sort of the
// kept values: in shared memory up to 4096 of them, else a bitonic sort in global memory (top-p
// over a near-uniform row of a large vocab sorts most of it: milliseconds, not yet measured).
//
// Device pointers; enqueues on `stream`; no allocation: the caller provides the workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "runtime/sampling/sample_rows.h"

namespace ltm::kernels::cuda {

// Bytes of workspace sample_rows needs for a batch of `rows` rows of `vocab` logits (rows beyond
// a fixed number per launch reuse the same workspace, so this stops growing with the batch).
size_t sample_rows_workspace_bytes(int64_t vocab, int32_t rows);

// Every row of `args` (runtime/sampling/sample_rows.h): tokens[r] and, when args.logprobs is
// set, logprobs[r], as sample_rows_host writes them. `workspace` holds at least
// sample_rows_workspace_bytes(args.vocab, args.rows) bytes.
void sample_rows(const SampleRowsArgs& args, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream);

// Every row's candidates from this rank's vocab slice (CandidateRowsArgs,
// runtime/sampling/sample_rows.h) as select_candidates_host writes them (the CPU twin): one block
// per row runs sampling_row.h's local_candidates (the host's name), with the same penalty, order
// keys, bad-slice rule and normalizer sum as the sampler above, and the top-k set by the same
// radix select. `workspace` holds at least sample_rows_workspace_bytes(args.valid, args.rows).
void select_candidates(const CandidateRowsArgs& args, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream);

}  // namespace ltm::kernels::cuda
