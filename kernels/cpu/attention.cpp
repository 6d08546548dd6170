#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/isa_kernels.h"

namespace ltm::kernels::cpu {

void kv_cache_write(const float* qkv, const int32_t* slot_mapping, int64_t n_tokens, int n_head,
                    int head_dim, int block_size, float* k_cache, float* v_cache) {
  const int64_t d_local = static_cast<int64_t>(n_head) * head_dim;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    const float* k = qkv + t * 3 * d_local + d_local;
    const float* v = k + d_local;
    for (int h = 0; h < n_head; ++h) {
      const int64_t dst = ((block * n_head + h) * block_size + offset) * head_dim;
      std::memcpy(k_cache + dst, k + static_cast<int64_t>(h) * head_dim, sizeof(float) * head_dim);
      std::memcpy(v_cache + dst, v + static_cast<int64_t>(h) * head_dim, sizeof(float) * head_dim);
    }
  }
}

namespace {

// A sequence with many new rows (a prefill chunk) in matrix form, one head after the other:
// gather the head's K and V from the blocks, S = Q K^T / sqrt(d_k) and O = softmax(S) V as
// OpenBLAS GEMMs (threaded by OpenBLAS), the causal mask and softmax by rows in between.
void attend_matrix(const PagedAttentionShape& s, int seq, const float* qkv, const float* k_cache,
                   const float* v_cache, float* out, std::vector<float>& scratch,
                   const KernelTable& kt) {
  const int hd = s.head_dim;
  const int64_t d_local = static_cast<int64_t>(s.n_head) * hd;
  const int first_row = s.token_offsets[seq];
  const int n_new = s.token_offsets[seq + 1] - first_row;
  const int ctx = s.context_lens[seq];
  const int pos0 = ctx - n_new;
  const int32_t* table = s.block_tables + static_cast<int64_t>(seq) * s.max_blocks_per_seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  scratch.resize(static_cast<size_t>(2 * ctx * hd + static_cast<int64_t>(n_new) * ctx));
  float* k = scratch.data();           // [ctx, hd]
  float* v = k + static_cast<int64_t>(ctx) * hd;  // [ctx, hd]
  float* sc = v + static_cast<int64_t>(ctx) * hd; // [n_new, ctx]
  for (int h = 0; h < s.n_head; ++h) {
    for (int p0 = 0; p0 < ctx; p0 += s.block_size) {
      const int n = std::min(s.block_size, ctx - p0);
      const int64_t src = ((static_cast<int64_t>(table[p0 / s.block_size]) * s.n_head + h) *
                           s.block_size) * hd;
      std::memcpy(k + static_cast<int64_t>(p0) * hd, k_cache + src, sizeof(float) * n * hd);
      std::memcpy(v + static_cast<int64_t>(p0) * hd, v_cache + src, sizeof(float) * n * hd);
    }
    const float* q = qkv + static_cast<int64_t>(first_row) * 3 * d_local + static_cast<int64_t>(h) * hd;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_new, ctx, hd, scale, q, 3 * d_local, k,
                hd, 0.0f, sc, ctx);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(n_new) * ctx > 32768)
    for (int r = 0; r < n_new; ++r) {
      float* row = sc + static_cast<int64_t>(r) * ctx;
      const int limit = pos0 + r + 1;  // keys 0 .. limit-1 are visible
      float mx = -std::numeric_limits<float>::infinity();
      for (int p = 0; p < limit; ++p) mx = std::max(mx, row[p]);
      const float sum = kt.exp_shift_sum(row, limit, mx);
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int p = 0; p < limit; ++p) row[p] *= inv;
      std::fill(row + limit, row + ctx, 0.0f);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_new, hd, ctx, 1.0f, sc, ctx, v, hd,
                0.0f, out + static_cast<int64_t>(first_row) * d_local + static_cast<int64_t>(h) * hd,
                d_local);
  }
}

}  // namespace

void paged_attention(const PagedAttentionShape& s, const float* qkv, const float* k_cache,
                     const float* v_cache, float* out) {
  // Sequences with at least kMatrixRows new rows go through the matrix form; the rest (decodes,
  // short chunks) through the tiled loop, threaded over (sequence, head, tile).
  constexpr int kMatrixRows = 16;
  const KernelTable& kt = kernel_table();  // outside the parallel regions: may throw
  struct Item {
    int seq, head, row_begin, n_rows;
  };
  std::vector<Item> items;
  std::vector<int> matrix_seqs;
  int max_ctx = 0;
  for (int seq = 0; seq < s.n_seqs; ++seq) {
    const int n_new = s.token_offsets[seq + 1] - s.token_offsets[seq];
    if (n_new >= kMatrixRows) {
      matrix_seqs.push_back(seq);
      continue;
    }
    max_ctx = std::max(max_ctx, static_cast<int>(s.context_lens[seq]));
    for (int h = 0; h < s.n_head; ++h)
      for (int r = 0; r < n_new; r += kQueryTile)
        items.push_back({seq, h, r, std::min(kQueryTile, n_new - r)});
  }
  if (!matrix_seqs.empty()) {
    static thread_local std::vector<float> scratch;  // reused: no page faults per layer
    for (int seq : matrix_seqs) attend_matrix(s, seq, qkv, k_cache, v_cache, out, scratch, kt);
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (n_items == 0) return;
#pragma omp parallel if (n_items > 1)
  {
    std::vector<float> scores(static_cast<size_t>(kQueryTile) * std::max(max_ctx, 1));
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i) {
      const Item& it = items[i];
      kt.attend_tile(s, it.seq, it.head, it.row_begin, it.n_rows, qkv, k_cache, v_cache, out,
                  scores.data());
    }
  }
}

}  // namespace ltm::kernels::cpu
