#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/fast_math.h"

#ifdef __AVX512F__
// GCC 12 false positive inside _mm512_reduce_add_ps (_mm256_undefined_pd, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

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

// q . k over n floats: 16 independent lanes (one AVX-512 register), summed once at the end.
inline float dot(const float* __restrict a, const float* __restrict b, int n) {
#ifdef __AVX512F__
  // The lane sum as a shuffle tree (_mm512_reduce_add_ps): the portable loop below ends in 16
  // dependent scalar adds, which made decode attention a tenth of a batch-32 step.
  __m512 acc = _mm512_setzero_ps();
  int c = 0;
  for (; c + 16 <= n; c += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + c), _mm512_loadu_ps(b + c), acc);
  if (c < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - c)) - 1u);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, a + c), _mm512_maskz_loadu_ps(tail, b + c),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
#else
  float lane[16] = {};
  int c = 0;
  for (; c + 16 <= n; c += 16)
    for (int j = 0; j < 16; ++j) lane[j] += a[c + j] * b[c + j];
  float sum = 0.0f;
  for (int j = 0; j < 16; ++j) sum += lane[j];
  for (; c < n; ++c) sum += a[c] * b[c];
  return sum;
#endif
}

constexpr int kQueryTile = 4;  // query rows computed together: each key row is loaded once per tile

// One (sequence, head, tile of up to kQueryTile query rows). `scores` holds kQueryTile * context.
void attend_tile(const PagedAttentionShape& s, int seq, int head, int row_begin, int n_rows,
                 const float* qkv, const float* k_cache, const float* v_cache, float* out,
                 float* scores) {
  const int hd = s.head_dim;
  const int64_t d_local = static_cast<int64_t>(s.n_head) * hd;
  const int first_row = s.token_offsets[seq];
  const int n_new = s.token_offsets[seq + 1] - first_row;
  const int ctx = s.context_lens[seq];
  const int pos0 = ctx - n_new;  // position of the sequence's first new row
  const int32_t* table = s.block_tables + static_cast<int64_t>(seq) * s.max_blocks_per_seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  const float* q[kQueryTile];
  int limit[kQueryTile];  // keys 0 .. limit-1 are visible to row r
  for (int r = 0; r < n_rows; ++r) {
    const int row = first_row + row_begin + r;
    q[r] = qkv + static_cast<int64_t>(row) * 3 * d_local + static_cast<int64_t>(head) * hd;
    limit[r] = pos0 + row_begin + r + 1;
  }
  const int n_keys = limit[n_rows - 1];

  // Scores: each key row is read once for the whole tile.
  for (int p = 0; p < n_keys; ++p) {
    const int64_t block = table[p / s.block_size];
    const float* k = k_cache + ((block * s.n_head + head) * s.block_size + p % s.block_size) * hd;
    for (int r = 0; r < n_rows; ++r)
      scores[r * n_keys + p] =
          p < limit[r] ? dot(q[r], k, hd) * scale : -std::numeric_limits<float>::infinity();
  }
  // Softmax per row.
  float inv_sum[kQueryTile];
  for (int r = 0; r < n_rows; ++r) {
    float* sc = scores + r * n_keys;
    float mx = -std::numeric_limits<float>::infinity();
    for (int p = 0; p < limit[r]; ++p) mx = std::max(mx, sc[p]);
    float sum = 0.0f;
    for (int p = 0; p < n_keys; ++p) {
      sc[p] = p < limit[r] ? exp_approx(sc[p] - mx) : 0.0f;
      sum += sc[p];
    }
    inv_sum[r] = 1.0f / sum;
  }
  // Weighted sum of V.
  float acc[kQueryTile][512];  // head_dim <= 512 (checked by the caller)
  for (int r = 0; r < n_rows; ++r) std::fill(acc[r], acc[r] + hd, 0.0f);
  for (int p = 0; p < n_keys; ++p) {
    const int64_t block = table[p / s.block_size];
    const float* v = v_cache + ((block * s.n_head + head) * s.block_size + p % s.block_size) * hd;
    for (int r = 0; r < n_rows; ++r) {
      const float w = scores[r * n_keys + p];
      if (w == 0.0f) continue;
#pragma omp simd
      for (int c = 0; c < hd; ++c) acc[r][c] += w * v[c];
    }
  }
  for (int r = 0; r < n_rows; ++r) {
    float* o = out + static_cast<int64_t>(first_row + row_begin + r) * d_local +
               static_cast<int64_t>(head) * hd;
    for (int c = 0; c < hd; ++c) o[c] = acc[r][c] * inv_sum[r];
  }
}

// A sequence with many new rows (a prefill chunk) in matrix form, one head after the other:
// gather the head's K and V from the blocks, S = Q K^T / sqrt(d_k) and O = softmax(S) V as
// OpenBLAS GEMMs (threaded by OpenBLAS), the causal mask and softmax by rows in between.
void attend_matrix(const PagedAttentionShape& s, int seq, const float* qkv, const float* k_cache,
                   const float* v_cache, float* out, std::vector<float>& scratch) {
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
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int p = 0; p < limit; ++p) {
        row[p] = exp_approx(row[p] - mx);
        sum += row[p];
      }
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
    for (int seq : matrix_seqs) attend_matrix(s, seq, qkv, k_cache, v_cache, out, scratch);
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (n_items == 0) return;
#pragma omp parallel if (n_items > 1)
  {
    std::vector<float> scores(static_cast<size_t>(kQueryTile) * std::max(max_ctx, 1));
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i) {
      const Item& it = items[i];
      attend_tile(s, it.seq, it.head, it.row_begin, it.n_rows, qkv, k_cache, v_cache, out,
                  scores.data());
    }
  }
}

}  // namespace ltm::kernels::cpu
