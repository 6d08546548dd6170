// Guards around loading weights, for checkpoints that lie and configs that are too large.
//
// make_guarded_source(inner, check_finite) wraps a WeightSource so that:
//   - nothing is used in place (f32_in_place answers nullptr): every weight is copied into the
//     model's own memory at load, so a checkpoint file truncated or rewritten on disk while it is
//     mapped can no longer raise SIGBUS in a serving rank after load (the mapping is never touched
//     again);
//   - with check_finite, every value read is checked for NaN and Inf; the first bad tensor is
//     recorded and reported by status() (DataLoss naming the tensor, the element and the value).
// verify_unchanged(files) re-reads size and modification time of the checkpoint's files after
// load: a file that changed while it was being read is DataLoss, named, rather than weights that
// are half old, half new.
//
// weight_bytes_per_rank(config, shard, precision) is the bytes of the weights one rank holds (its stage's
// layers' slices, its vocab rows of wte on the first and last stage, wpe, norms), and
// check_host_memory() refuses a model whose weights would not fit in this host's available memory
// (MemAvailable) before anything is allocated, with the numbers.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/model.h"
#include "runtime/model/weight_source.h"

namespace ltm {

class GuardedSource : public WeightSource {
 public:
  // OK, or DataLoss for the first non-finite value read (check_finite only).
  virtual absl::Status status() const = 0;
};

std::unique_ptr<GuardedSource> make_guarded_source(std::unique_ptr<WeightSource> inner,
                                                   bool check_finite);

// Size and modification time of files, to compare after load.
struct FileStamp {
  std::string path;
  int64_t size = 0;
  int64_t mtime_ns = 0;
};
// The stamps of the checkpoint folder's weight files (*.safetensors); empty for a config file.
std::vector<FileStamp> stamp_checkpoint_files(const std::string& dir);
absl::Status verify_unchanged(const std::vector<FileStamp>& stamps);

// `weights`: the precision of the weight matrices and the tied embedding (the rest is fp32).
int64_t weight_bytes_per_rank(const ModelConfig& config, const ShardSpec& shard,
                              Precision weights = Precision::kF32);
// MemAvailable of /proc/meminfo in bytes; -1 when it cannot be read.
int64_t available_host_memory();
// ResourceExhausted when `ranks_on_host` ranks of `bytes_per_rank` each exceed `available`
// (bytes; < 0: unknown, always OK).
absl::Status check_host_memory(int64_t bytes_per_rank, int ranks_on_host, int64_t available);
// The same for ltm-worker --kv-resident, after the weights are loaded: ResourceExhausted when
// `ranks_on_host` KV caches of `kv_bytes_per_rank` exceed `available` (< 0: unknown, OK).
absl::Status check_resident_kv_memory(int64_t kv_bytes_per_rank, int ranks_on_host,
                                      int64_t available);

}  // namespace ltm
