#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/static_for.h"
#include "kernels/cpu/step_team.h"

namespace ltm::kernels::cpu {

void kv_cache_write(const float* qkv, const int32_t* slot_mapping, int64_t n_tokens, int n_head,
                    int head_dim, int block_size, float* k_cache, float* v_cache, int n_kv_head) {
  const int n_kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t q_cols = static_cast<int64_t>(n_head) * head_dim;
  const int64_t kv_cols = static_cast<int64_t>(n_kv) * head_dim;
  const int64_t stride = q_cols + 2 * kv_cols;
  // Tokens on every thread (their slots are distinct): each row goes to a cold line of the pool.
  static_for(n_tokens, n_tokens >= 8, [&](int64_t t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) return;  // a padding row (decode graphs): no token to keep
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    const float* k = qkv + t * stride + q_cols;
    const float* v = k + kv_cols;
    for (int h = 0; h < n_kv; ++h) {
      const int64_t dst = ((block * n_kv + h) * block_size + offset) * head_dim;
      std::memcpy(k_cache + dst, k + static_cast<int64_t>(h) * head_dim, sizeof(float) * head_dim);
      std::memcpy(v_cache + dst, v + static_cast<int64_t>(h) * head_dim, sizeof(float) * head_dim);
    }
  });
}

void kv_cache_write(const float* qkv, const int32_t* slot_mapping, int64_t n_tokens, int n_head,
                    int head_dim, int block_size, WeightType kv_type, void* k_cache,
                    void* v_cache, int n_kv_head) {
  if (kv_type == WeightType::kF32) {
    kv_cache_write(qkv, slot_mapping, n_tokens, n_head, head_dim, block_size,
                   static_cast<float*>(k_cache), static_cast<float*>(v_cache), n_kv_head);
    return;
  }
  const KernelTable& kt = kernel_table();
  const auto convert = kv_type == WeightType::kBF16 ? kt.f32_to_bf16_n : kt.f32_to_f16_n;
  auto* kc = static_cast<uint16_t*>(k_cache);
  auto* vc = static_cast<uint16_t*>(v_cache);
  const int n_kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t q_cols = static_cast<int64_t>(n_head) * head_dim;
  const int64_t kv_cols = static_cast<int64_t>(n_kv) * head_dim;
  const int64_t stride = q_cols + 2 * kv_cols;
  static_for(n_tokens, n_tokens >= 8, [&](int64_t t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) return;  // a padding row (decode graphs): no token to keep
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    const float* k = qkv + t * stride + q_cols;
    const float* v = k + kv_cols;
    for (int h = 0; h < n_kv; ++h) {
      const int64_t dst = ((block * n_kv + h) * block_size + offset) * head_dim;
      convert(k + static_cast<int64_t>(h) * head_dim, kc + dst, head_dim);
      convert(v + static_cast<int64_t>(h) * head_dim, vc + dst, head_dim);
    }
  });
}

namespace {

// Copies n cached rows of head_dim elements of type t, converted to fp32, to dst.
void gather_rows_f32(const void* cache, int64_t src, int64_t n, WeightType t, float* dst,
                     const KernelTable& kt) {
  switch (t) {
    case WeightType::kF32:
      std::memcpy(dst, static_cast<const float*>(cache) + src, sizeof(float) * n);
      break;
    case WeightType::kBF16: kt.bf16_to_f32_n(static_cast<const uint16_t*>(cache) + src, dst, n); break;
    case WeightType::kF16: kt.f16_to_f32_n(static_cast<const uint16_t*>(cache) + src, dst, n); break;
    case WeightType::kInt8: break;  // weights only: no cache holds it (the backends refuse it)
  }
}

// A sequence with many new rows (a prefill chunk) in matrix form, one KV head after the other:
// gather the head's K and V from the blocks; then, by blocks of rows, stack the Q rows of every
// query head that reads this KV head (grouped-query attention: n_head / n_kv_head of them; one
// for multi-head attention), S = Q K^T / sqrt(d_k) and O = softmax(S) V as OpenBLAS GEMMs
// (threaded by OpenBLAS) with the causal mask and softmax by rows in between, and put O's rows
// back in place. A block's GEMMs run over only the keys its last row sees, so a fresh prompt's
// masked upper triangle is not computed, and a group's heads share one pass over K and V.
void attend_matrix(const PagedAttentionShape& s, int seq, const float* qkv, const void* k_cache,
                   const void* v_cache, float* out, std::vector<float>& scratch,
                   const KernelTable& kt) {
  const int hd = s.head_dim;
  const int64_t d_local = static_cast<int64_t>(s.n_head) * hd;
  const int64_t stride = qkv_stride(s);
  const int first_row = s.token_offsets[seq];
  const int n_new = s.token_offsets[seq + 1] - first_row;
  const int ctx = s.context_lens[seq];
  const int pos0 = ctx - n_new;
  const int32_t* table = s.block_tables + static_cast<int64_t>(seq) * s.max_blocks_per_seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int group = s.n_head / kv_heads(s);             // query heads per KV head
  const int block = std::max(16, 256 / group);          // rows of each head per block
  const int64_t m_max = static_cast<int64_t>(group) * std::min(block, n_new);
  scratch.resize(static_cast<size_t>(2 * static_cast<int64_t>(ctx) * hd + 2 * m_max * hd +
                                     m_max * ctx));
  float* k = scratch.data();                       // [ctx, hd]
  float* v = k + static_cast<int64_t>(ctx) * hd;   // [ctx, hd]
  float* qg = v + static_cast<int64_t>(ctx) * hd;  // [group * rows, hd]: the group's Q rows
  float* og = qg + m_max * hd;                     // [group * rows, hd]: their outputs
  float* sc = og + m_max * hd;                     // [group * rows, keys]
  for (int kvh = 0; kvh < kv_heads(s); ++kvh) {
    for (int p0 = 0; p0 < ctx; p0 += s.block_size) {
      const int n = std::min(s.block_size, ctx - p0);
      const int64_t src =
          ((static_cast<int64_t>(table[p0 / s.block_size]) * kv_heads(s) + kvh) * s.block_size) * hd;
      gather_rows_f32(k_cache, src, static_cast<int64_t>(n) * hd, s.kv_type,
                      k + static_cast<int64_t>(p0) * hd, kt);
      gather_rows_f32(v_cache, src, static_cast<int64_t>(n) * hd, s.kv_type,
                      v + static_cast<int64_t>(p0) * hd, kt);
    }
    for (int r0 = 0; r0 < n_new; r0 += block) {
      const int rows = std::min(block, n_new - r0), keys = pos0 + r0 + rows;
      const int m = group * rows;  // row j * rows + r: head kvh * group + j, new row r0 + r
      for (int j = 0; j < group; ++j)
        for (int r = 0; r < rows; ++r)
          std::memcpy(qg + (static_cast<int64_t>(j) * rows + r) * hd,
                      qkv + (first_row + r0 + r) * stride + static_cast<int64_t>(kvh * group + j) * hd,
                      sizeof(float) * hd);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, keys, hd, scale, qg, hd, k, hd, 0.0f,
                  sc, keys);
      static_for(m, static_cast<int64_t>(m) * keys > 32768, [&](int64_t i) {
        float* row = sc + i * keys;
        const int limit = pos0 + r0 + static_cast<int>(i % rows) + 1;  // keys 0 .. limit-1 seen
        float mx = -std::numeric_limits<float>::infinity();
        for (int p = 0; p < limit; ++p) mx = std::max(mx, row[p]);
        const float sum = kt.exp_shift_sum(row, limit, mx);
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int p = 0; p < limit; ++p) row[p] *= inv;
        std::fill(row + limit, row + keys, 0.0f);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, keys, 1.0f, sc, keys, v, hd,
                  0.0f, og, hd);
      for (int j = 0; j < group; ++j)
        for (int r = 0; r < rows; ++r)
          std::memcpy(out + (first_row + r0 + r) * d_local + static_cast<int64_t>(kvh * group + j) * hd,
                      og + (static_cast<int64_t>(j) * rows + r) * hd, sizeof(float) * hd);
    }
  }
}

}  // namespace

void paged_attention(const PagedAttentionShape& s, const float* qkv, const float* k_cache,
                     const float* v_cache, float* out) {
  if (s.kv_type != WeightType::kF32)
    throw std::invalid_argument(std::string("paged_attention: fp32 caches given for kv_type ") +
                                weight_type_name(s.kv_type));
  paged_attention(s, qkv, static_cast<const void*>(k_cache), static_cast<const void*>(v_cache),
                  out);
}

void paged_attention(const PagedAttentionShape& s, const float* qkv, const void* k_cache,
                     const void* v_cache, float* out) {
  // Sequences with at least kMatrixRows new rows go through the matrix form; the rest (decodes,
  // short chunks, verify rows: s.exact) through the tiled loop, threaded over (sequence, head,
  // tile).
  const auto matrix = [&](int seq) {
    return s.token_offsets[seq + 1] - s.token_offsets[seq] >= kMatrixRows &&
           (s.exact == nullptr || s.exact[seq] == 0);
  };
  const KernelTable& kt = kernel_table();  // outside the parallel regions: may throw
  struct Item {
    int seq, head, row_begin, n_rows;
  };
  std::vector<int> matrix_seqs;
  int max_ctx = 0;
  for (int seq = 0; seq < s.n_seqs; ++seq) {
    if (matrix(seq)) {
      matrix_seqs.push_back(seq);
      continue;
    }
    max_ctx = std::max(max_ctx, static_cast<int>(s.context_lens[seq]));
  }
  if (!matrix_seqs.empty()) {
    static thread_local std::vector<float> scratch;  // reused: no page faults per layer
    for (int seq : matrix_seqs) attend_matrix(s, seq, qkv, k_cache, v_cache, out, scratch, kt);
  }
  // A sequence's heads on one thread, in order: head h's rows of a cache block sit next to head
  // h + 1's, so the hardware's prefetch of one helps the next (10% for a batch of 32). With fewer
  // sequences than twice the threads that would leave threads idle (one sequence's decode or
  // verify step: every head on one thread), so there the heads are dealt out one by one. An fp32
  // cache's item is then a tile of a sequence's rows with every head (head -1), each row reading
  // a cache block's runs of all the heads front to back (attend_tile): its kernel 1.17x with the
  // caches in memory; a 16-bit cache's kernel ran 0.85-0.91x so (docs/benchmarks.md, "Decode
  // attention a block at a time").
  const int n_tiled_seqs = s.n_seqs - static_cast<int>(matrix_seqs.size());
  const bool many = n_tiled_seqs >= 2 * omp_get_max_threads();
  const bool all_heads = many && s.kv_type == WeightType::kF32;
  const int chunk = many && !all_heads ? std::max(1, s.n_head) : 1;
  std::vector<Item> items;
  for (int seq = 0; seq < s.n_seqs; ++seq) {
    const int n_new = s.token_offsets[seq + 1] - s.token_offsets[seq];
    if (matrix(seq)) continue;
    for (int h = all_heads ? -1 : 0; h < (all_heads ? 0 : s.n_head); ++h)
      for (int r = 0; r < n_new; r += kQueryTile)
        items.push_back({seq, h, r, std::min(kQueryTile, n_new - r)});
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (n_items == 0) return;
  const auto attend = [&](const Item& it, float* scores) {
    switch (s.kv_type) {
      case WeightType::kF32:
        kt.attend_tile(s, it.seq, it.head, it.row_begin, it.n_rows, qkv,
                       static_cast<const float*>(k_cache), static_cast<const float*>(v_cache), out,
                       scores);
        break;
      case WeightType::kBF16:
        kt.attend_tile_bf16(s, it.seq, it.head, it.row_begin, it.n_rows, qkv,
                            static_cast<const uint16_t*>(k_cache),
                            static_cast<const uint16_t*>(v_cache), out, scores);
        break;
      case WeightType::kF16:
        kt.attend_tile_f16(s, it.seq, it.head, it.row_begin, it.n_rows, qkv,
                           static_cast<const uint16_t*>(k_cache),
                           static_cast<const uint16_t*>(v_cache), out, scores);
        break;
      case WeightType::kInt8: break;  // weights only (see gather_rows_f32)
    }
  };
  const size_t score_floats =
      static_cast<size_t>(all_heads ? std::max(kQueryTile, s.n_head) : kQueryTile) *
      std::max(max_ctx, 1);
  if (in_step_team()) {  // a small step's team (step_team.h): items in turn, no region
    step_team_for(n_items, [&](int64_t i) {
      static thread_local std::vector<float> scores;  // each team thread's own
      if (scores.size() < score_floats) scores.resize(score_floats);
      attend(items[i], scores.data());
    });
    return;
  }
#pragma omp parallel if (n_items > 1)
  {
    std::vector<float> scores(score_floats);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t i = 0; i < n_items; ++i) attend(items[i], scores.data());
  }
}

}  // namespace ltm::kernels::cpu
