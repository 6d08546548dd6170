#include "runtime/model/weight_source.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numbers>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ltm {
namespace {

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(std::shared_ptr<const Checkpoint> ckpt, std::string dir)
      : ckpt_(std::move(ckpt)), dir_(std::move(dir)) {}
  const ModelConfig& config() const override { return ckpt_->config(); }
  const float* f32_in_place(std::string_view name) const override {
    return ckpt_->f32_in_place(name);
  }
  void read_f32(std::string_view name, const SliceSpec& slice, float* out) const override {
    ckpt_->read_f32(name, slice, out);
  }
  uint64_t bytes_read() const override { return ckpt_->bytes_read(); }
  std::string describe() const override { return absl::StrCat("checkpoint ", dir_); }

 private:
  std::shared_ptr<const Checkpoint> ckpt_;
  std::string dir_;
};

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// murmur3's 32-bit finaliser: a bijection of 32-bit words that mixes every input bit into every
// output bit. 32-bit multiplies vectorise on every x86-64 target we build for (SSE4.1's pmulld
// is in the x86-64-v2 baseline); 64-bit ones do not (vpmullq is AVX-512DQ), which kept the
// splitmix64 generator used before scalar.
inline uint32_t fmix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

class RandomSource final : public WeightSource {
 public:
  RandomSource(const ModelConfig& config, uint64_t seed, float std)
      : config_(config), seed_(seed), std_(std) {}
  const ModelConfig& config() const override { return config_; }
  const float* f32_in_place(std::string_view) const override { return nullptr; }
  void read_f32(std::string_view name, const SliceSpec& s, float* out) const override {
    const int64_t cols = full_cols(name);
    const bool gain = is_norm(name) && name.ends_with(".weight");
    const bool bias = name.ends_with(".bias");
    // The tensor's keys: one 64-bit hash of (seed, name), split into the words the element
    // generator mixes with the element's index.
    const uint64_t key = mix64(seed_ ^ hash_name(name));
    const uint64_t key2 = mix64(key);
    const Keys k{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32),
                 static_cast<uint32_t>(key2) | 1u};
    const int64_t n_rows = s.row_end - s.row_begin, n_cols = s.col_end - s.col_begin;
    // Rows in parallel, each row one vectorised loop: an element depends only on (seed, name,
    // index), so the slice a rank makes is the same whichever layout or thread made it.
#pragma omp parallel for schedule(static) if (n_rows * n_cols > (1 << 16))
    for (int64_t r = 0; r < n_rows; ++r) {
      float* row = out + r * n_cols;
      if (gain || bias) {
        const float v = gain ? 1.0f : 0.0f;
        for (int64_t c = 0; c < n_cols; ++c) row[c] = v;
        continue;
      }
      fill_normal(k, static_cast<uint64_t>((s.row_begin + r) * cols + s.col_begin), n_cols, std_,
                  row);
    }
    bytes_read_ += static_cast<uint64_t>(n_rows * n_cols) * sizeof(float);
  }
  uint64_t bytes_read() const override { return bytes_read_; }
  std::string describe() const override { return absl::StrCat("random weights (seed ", seed_, ")"); }

 private:
  struct Keys {
    uint32_t lo, hi, odd;
  };
  // A LayerNorm's or RMSNorm's tensor (GPT-2's ln_*, Llama's *layernorm and model.norm).
  static bool is_norm(std::string_view name) {
    return name.find("ln_") != std::string_view::npos ||
           name.find("layernorm") != std::string_view::npos || name == "model.norm.weight";
  }
  // Column count of the named tensor's 2-D HF shape (1 for vectors).
  int64_t full_cols(std::string_view name) const {
    const int64_t d = config_.n_embd;
    if (!name.ends_with(".weight") || is_norm(name)) return 1;
    if (config_.is_llama()) {  // nn.Linear [out, in]: cols = in
      if (name.ends_with("self_attn.o_proj.weight")) return config_.q_width();
      if (name.ends_with("mlp.down_proj.weight")) return config_.n_inner;
      return d;  // embed_tokens, lm_head, q/k/v, gate, up
    }
    if (name == "wte.weight" || name == "wpe.weight") return d;
    if (name.ends_with("attn.c_attn.weight")) return 3 * d;
    if (name.ends_with("mlp.c_fc.weight")) return config_.n_inner;
    return d;  // attn.c_proj, mlp.c_proj
  }
  // out[i] = std x N(0, 1) of element first + i, approximately: two 32-bit hashes of the
  // element's index give four 16-bit uniforms whose sum (Irwin-Hall, mean 2, variance 1/3) is
  // centred and scaled to variance 1. The tails end at 3.46 sigma, which an initialisation for
  // benchmarks and tests does not miss. Split where the index's low word wraps, so that each
  // piece is a loop over 32-bit lanes with the high word fixed.
  static void fill_normal(const Keys& k, uint64_t first, int64_t n, float std, float* out) {
    while (n > 0) {
      const uint32_t lo0 = static_cast<uint32_t>(first);
      const uint32_t hi = static_cast<uint32_t>(first >> 32);
      const int64_t piece = std::min<int64_t>(n, (int64_t{1} << 32) - lo0);
      const uint32_t khi = fmix32(hi ^ k.hi);
      const float scale = std * 1.7320508f / 65536.0f;
      const float offset = std * 1.7320508f * (2.0f / 65536.0f - 2.0f);
#pragma omp simd
      for (int64_t i = 0; i < piece; ++i) {
        const uint32_t x = (lo0 + static_cast<uint32_t>(i)) * k.odd + k.lo;
        const uint32_t a = fmix32(x ^ khi);
        const uint32_t b = fmix32(a + 0x9e3779b9u);
        const int32_t sum = static_cast<int32_t>((a & 0xffffu) + (a >> 16) + (b & 0xffffu) + (b >> 16));
        // ((sum + 2) / 65536 - 2) * sqrt(3): each uniform is (u + 0.5) / 65536.
        out[i] = static_cast<float>(sum) * scale + offset;
      }
      out += piece;
      first += static_cast<uint64_t>(piece);
      n -= piece;
    }
  }

  ModelConfig config_;
  uint64_t seed_;
  float std_;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace

std::unique_ptr<WeightSource> make_checkpoint_source(std::shared_ptr<const Checkpoint> checkpoint,
                                                     std::string dir) {
  return std::make_unique<CheckpointSource>(std::move(checkpoint), std::move(dir));
}

std::unique_ptr<WeightSource> make_random_source(const ModelConfig& config, uint64_t seed,
                                                 float std) {
  return std::make_unique<RandomSource>(config, seed, std);
}

}  // namespace ltm
