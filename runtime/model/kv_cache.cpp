#include "runtime/model/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ltm {

KvCache::KvCache(Backend& backend, int64_t n_layers_local, int64_t n_head_local, int64_t head_dim,
                 int32_t block_size, int32_t n_blocks, Precision precision)
    : block_size_(block_size), n_blocks_(n_blocks), precision_(precision) {
  LTM_ASSERT(block_size > 0 && n_blocks > 0, "block_size ", block_size, " n_blocks ", n_blocks);
  const size_t bytes = static_cast<size_t>(n_blocks) * n_head_local * block_size * head_dim *
                       precision_size(precision);
  for (int64_t l = 0; l < n_layers_local; ++l) {
    // Zeroed so that a stale slot can never hold NaN/Inf that a masked weight of 0 would spread.
    k_.push_back(backend.alloc_zeroed(bytes));
    v_.push_back(backend.alloc_zeroed(bytes));
    k_.back().set_precision(precision);
    v_.back().set_precision(precision);
  }
}

int64_t KvCache::block_bytes(int64_t n_layers, int64_t n_head_local, int64_t head_dim,
                             int32_t block_size, Precision precision) {
  return 2 * n_layers * n_head_local * block_size * head_dim *
         static_cast<int64_t>(precision_size(precision));
}

absl::StatusOr<int32_t> plan_kv_blocks(const KvSizing& z) {
  const int64_t per_block =
      KvCache::block_bytes(z.n_layers_local, z.n_head_local, z.head_dim, z.block_size, z.precision);
  const int32_t context_blocks = blocks_for(z.n_positions, z.block_size);
  int64_t budget_mb = z.kv_memory_mb;
  if (budget_mb == 0) budget_mb = z.serving ? 1024 : 0;
  int64_t n_blocks = budget_mb > 0 ? (budget_mb << 20) / per_block : context_blocks;
  if (n_blocks < context_blocks && z.kv_memory_mb == 0) n_blocks = context_blocks;
  if (n_blocks < 1)
    return absl::InvalidArgumentError(absl::StrCat("--kv-memory-mb ", z.kv_memory_mb,
                                                   " holds no KV block (one block takes ",
                                                   per_block, " bytes on this rank)"));
  return static_cast<int32_t>(std::min<int64_t>(n_blocks, int64_t{1} << 30));
}

}  // namespace ltm
