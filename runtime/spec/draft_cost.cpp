#include "runtime/spec/draft_cost.h"

#include <algorithm>
#include <cmath>

namespace ltm {

int DraftCostModel::bucket_of(int32_t rows) {
  if (rows <= kExact) return std::max(0, rows - 1);
  // Eight a doubling above kExact rows (each within 9% of its size).
  const int b = kExact + static_cast<int>(std::floor(8.0 * std::log2((rows - 1.0) / kExact)));
  return std::min(b, kBuckets - 1);
}

void DraftCostModel::observe(int32_t rows, double s) {
  if (rows <= 0 || !std::isfinite(s) || s <= 0) return;
  for (Bucket& b : buckets_) b.weight *= kDecay;
  Bucket& b = buckets_[static_cast<size_t>(bucket_of(rows))];
  if (b.seen == 0) {
    b.seconds = s;
    b.rows = rows;
  } else if (b.seen == 1) {  // the first step of a size is often a cold one
    b.seconds = std::min(b.seconds, s);
    b.rows += 0.5 * (rows - b.rows);
  } else {
    // Toward s by kDown or kUp of itself, never past s (so steady times are met exactly).
    b.seconds = s < b.seconds ? std::max(s, b.seconds * (1 - kDown))
                              : std::min(s, b.seconds * (1 + kUp));
    b.rows += 0.1 * (rows - b.rows);
  }
  b.weight += 1;
  b.seen++;
  n_++;
}

bool DraftCostModel::ready() const {
  if (n_ < kMinObservations) return false;
  int sizes = 0;
  for (const Bucket& b : buckets_) sizes += b.seen >= kSeenToTrust;
  return sizes >= 2;
}

int DraftCostModel::sizes_within(double lo, double hi) const {
  int n = 0;
  for (const Bucket& k : buckets_) n += k.seen >= 2 && k.rows >= lo && k.rows <= hi;
  return n;
}

void DraftCostModel::fit(double* a, double* b, double lo, double hi) const {
  double w = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Bucket& k : buckets_) {
    if (k.seen < 2 || k.rows < lo || k.rows > hi) continue;
    const double wk = std::max(k.weight, kFloor);
    w += wk;
    sx += wk * k.rows;
    sy += wk * k.seconds;
    sxx += wk * k.rows * k.rows;
    sxy += wk * k.rows * k.seconds;
  }
  *a = *b = 0;
  if (w <= 0) return;
  const double mx = sx / w, my = sy / w, var = sxx / w - mx * mx;
  *b = var > 1e-12 ? std::max(0.0, (sxy / w - mx * my) / var) : 0;
  *a = my - *b * mx;
  if (*a < 0) {  // the line through the origin that fits best
    *a = 0;
    *b = sxx > 0 ? std::max(0.0, sxy / sxx) : 0;
  }
}

double DraftCostModel::token_cost(int32_t batch, double fallback) const {
  if (!ready()) return fallback;
  // The slope where drafts would take the step (B rows, up to 2B with one draft a sequence and
  // beyond): fitted through the sizes from B / 2 to 4 B where two are known, since the cost is
  // not one line (on the CPU a row past a register tile of 6 costs more than the rows before).
  const double B = std::max(1, batch);
  double a, b;
  if (sizes_within(B / 2, 4 * B) >= 2) {
    fit(&a, &b, B / 2, 4 * B);
  } else {
    fit(&a, &b);
  }
  const double rows = b * B;
  if (a + rows <= 0) return fallback;
  return std::clamp(rows / (a + rows), 0.01, 1.0);
}

double DraftCostModel::fixed_s() const {
  double a, b;
  fit(&a, &b);
  return a;
}

double DraftCostModel::per_row_s() const {
  double a, b;
  fit(&a, &b);
  return b;
}

}  // namespace ltm
