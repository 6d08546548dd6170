#include "kernels/cpu/embedding.h"

#include <cmath>
#include <cstring>

namespace ltm::kernels::cpu {

void embedding(const int32_t* ids, const float* table, int64_t row_begin, int64_t row_end,
               float* out, int64_t n_tokens, int64_t d) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t id = ids[t];
    if (id >= row_begin && id < row_end)
      std::memcpy(out + t * d, table + (id - row_begin) * d, sizeof(float) * d);
    else
      std::memset(out + t * d, 0, sizeof(float) * d);
  }
}

void add_position_embedding(float* x, const float* table, const int32_t* positions,
                            int64_t n_tokens, int64_t d) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* row = x + t * d;
    const int64_t p = positions[t];
    if (table) {
      const float* pe = table + p * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) row[c] += pe[c];
    } else {
      for (int64_t c = 0; c < d; c += 2) {
        const double angle = static_cast<double>(p) / std::pow(10000.0, static_cast<double>(c) / d);
        row[c] += static_cast<float>(std::sin(angle));
        if (c + 1 < d) row[c + 1] += static_cast<float>(std::cos(angle));
      }
    }
  }
}

}  // namespace ltm::kernels::cpu
