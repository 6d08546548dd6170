// The wire format of vocab-parallel sampling (runtime/engine/engine.cpp): each TP rank of the
// last stage reduces its slice of every logit row to a CandidateSet (runtime/sampling/sampler.h)
// and sends one blob for the whole batch to tp_rank 0, which reads them back row by row.
//
// Per row, little-endian, packed: n (int32), local max (float), local sum_exp (double), then n
// Candidates (int32 id, float logit). Every rank runs the same binary, so the layout is the
// in-memory one of those fields.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/sampling/sampler.h"

namespace ltm {

// Appends one row's candidate set to `blob`.
void append_candidates(const CandidateSet& set, std::string* blob);

// Reads the row at `*pos` of `blob`: its normalizer into `*norm` and its candidates appended to
// `*out`; advances `*pos` past the row. DataLoss (nothing appended) when the blob ends early or a
// count is negative: a bug or a version mismatch between ranks.
absl::Status read_candidates(const std::string& blob, size_t* pos, LogNormalizer* norm,
                             std::vector<Candidate>* out);

}  // namespace ltm
