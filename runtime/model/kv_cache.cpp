#include "runtime/model/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ltm {

KvCache::KvCache(Backend& backend, int64_t n_layers_local, int64_t n_head_local, int64_t head_dim,
                 int32_t block_size, int32_t n_blocks, Precision precision, bool resident)
    : block_size_(block_size), n_blocks_(n_blocks), precision_(precision) {
  LTM_ASSERT(block_size > 0 && n_blocks > 0, "block_size ", block_size, " n_blocks ", n_blocks);
  const size_t bytes = static_cast<size_t>(n_blocks) * n_head_local * block_size * head_dim *
                       precision_size(precision);
  for (int64_t l = 0; l < n_layers_local; ++l) {
    // Zeroed so that a stale slot can never hold NaN/Inf that a masked weight of 0 would spread.
    k_.push_back(backend.alloc_kv_cache(bytes));
    v_.push_back(backend.alloc_kv_cache(bytes));
    k_.back().set_precision(precision);
    v_.back().set_precision(precision);
    if (resident) {  // --kv-resident: the whole cache faulted in now (Backend::make_resident)
      backend.make_resident(k_.back());
      backend.make_resident(v_.back());
    }
  }
}

int64_t KvCache::block_bytes(int64_t n_layers, int64_t n_head_local, int64_t head_dim,
                             int32_t block_size, Precision precision) {
  return 2 * n_layers * n_head_local * block_size * head_dim *
         static_cast<int64_t>(precision_size(precision));
}

int64_t gpu_activation_bytes(int64_t n_embd, int64_t n_inner, int64_t vocab_padded, int tp,
                             int64_t max_tokens, int64_t max_sequences) {
  const int64_t t = std::max<int64_t>(tp, 1);
  const int64_t per_row = 2 * n_embd + (3 * n_embd + n_embd) / t + n_inner / t;
  const int64_t rows = std::max<int64_t>(max_tokens, 1);
  const int64_t logits = std::min(rows, std::max<int64_t>(max_sequences, 1)) * (vocab_padded / t);
  return 2 * (rows * per_row + logits) * static_cast<int64_t>(sizeof(float));
}

int64_t gpu_int8_scratch_bytes(int64_t n_embd, int64_t n_inner, int64_t vocab_padded, int tp) {
  const int64_t t = std::max<int64_t>(tp, 1);
  const int64_t elems = std::max({3 * n_embd * n_embd, 2 * n_embd * n_inner, vocab_padded * n_embd});
  return 2 * ((elems + t - 1) / t);
}

int64_t gpu_kv_budget_bytes(const KvSizing& z) {
  const int64_t left = z.device_memory_bytes - z.weight_bytes - z.activation_bytes -
                       z.graph_bytes - z.overhead_bytes - z.draft_bytes;
  return left > 0 ? static_cast<int64_t>(static_cast<double>(left) * z.gpu_memory_fraction) : 0;
}

absl::StatusOr<int32_t> plan_kv_blocks(const KvSizing& z) {
  const int64_t per_block =
      KvCache::block_bytes(z.n_layers_local, z.n_head_local, z.head_dim, z.block_size, z.precision);
  const int32_t context_blocks = blocks_for(z.n_positions, z.block_size);
  int64_t budget_bytes = z.kv_memory_mb << 20;
  if (z.kv_memory_mb == 0 && z.serving) {
    if (z.device_memory_bytes > 0) {
      budget_bytes = gpu_kv_budget_bytes(z);
      if (budget_bytes / per_block < context_blocks)
        return absl::ResourceExhaustedError(absl::StrCat(
            "the GPU has no room for one context of KV cache (", context_blocks, " blocks of ",
            per_block, " bytes; --kv-memory-mb sets a smaller budget): ",
            z.gpu_memory_fraction, " x (", z.device_memory_bytes >> 20,
            " MiB of device memory - weights ", z.weight_bytes >> 20, " MiB - activations ",
            z.activation_bytes >> 20, " MiB - graphs ", z.graph_bytes >> 20, " MiB - runtime ",
            z.overhead_bytes >> 20, " MiB",
            z.draft_bytes > 0 ? absl::StrCat(" - the draft model ", z.draft_bytes >> 20, " MiB")
                              : std::string(),
            ") leaves ", budget_bytes >> 20, " MiB"));
    } else {
      budget_bytes = int64_t{1024} << 20;
    }
  }
  int64_t n_blocks = budget_bytes > 0 ? budget_bytes / per_block : context_blocks;
  if (n_blocks < context_blocks && z.kv_memory_mb == 0) n_blocks = context_blocks;
  if (n_blocks < 1)
    return absl::InvalidArgumentError(absl::StrCat("--kv-memory-mb ", z.kv_memory_mb,
                                                   " holds no KV block (one block takes ",
                                                   per_block, " bytes on this rank)"));
  return static_cast<int32_t>(std::min<int64_t>(n_blocks, int64_t{1} << 30));
}

}  // namespace ltm
