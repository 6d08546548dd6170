#include "runtime/engine/candidate_exchange.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ltm {
namespace {

constexpr size_t kHeaderBytes = sizeof(int32_t) + sizeof(float) + sizeof(double);
static_assert(sizeof(Candidate) == 8, "Candidate is sent as 8 bytes");

}  // namespace

void append_candidates(const CandidateSet& set, std::string* blob) {
  const int32_t n = static_cast<int32_t>(set.candidates.size());
  blob->append(reinterpret_cast<const char*>(&n), sizeof(n));
  blob->append(reinterpret_cast<const char*>(&set.local_max), sizeof(set.local_max));
  blob->append(reinterpret_cast<const char*>(&set.local_sum_exp), sizeof(set.local_sum_exp));
  blob->append(reinterpret_cast<const char*>(set.candidates.data()), n * sizeof(Candidate));
}

absl::Status read_candidates(const std::string& blob, size_t* pos, LogNormalizer* norm,
                             std::vector<Candidate>* out) {
  if (*pos > blob.size() || blob.size() - *pos < kHeaderBytes)
    return absl::DataLossError(absl::StrCat("candidate blob of ", blob.size(),
                                            " bytes ends inside the row header at ", *pos));
  const char* p = blob.data() + *pos;
  int32_t n = 0;
  std::memcpy(&n, p, sizeof(n));
  const size_t body = n < 0 ? 0 : static_cast<size_t>(n) * sizeof(Candidate);
  if (n < 0 || blob.size() - *pos - kHeaderBytes < body)
    return absl::DataLossError(absl::StrCat("candidate blob of ", blob.size(), " bytes: row at ",
                                            *pos, " claims ", n, " candidates"));
  std::memcpy(&norm->max, p + sizeof(int32_t), sizeof(float));
  std::memcpy(&norm->sum_exp, p + sizeof(int32_t) + sizeof(float), sizeof(double));
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(n));
  if (n > 0) std::memcpy(out->data() + at, p + kHeaderBytes, body);
  *pos += kHeaderBytes + body;
  return absl::OkStatus();
}

}  // namespace ltm
