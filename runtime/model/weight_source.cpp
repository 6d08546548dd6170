#include "runtime/model/weight_source.h"

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

class RandomSource final : public WeightSource {
 public:
  RandomSource(const ModelConfig& config, uint64_t seed, float std)
      : config_(config), seed_(seed), std_(std) {}
  const ModelConfig& config() const override { return config_; }
  const float* f32_in_place(std::string_view) const override { return nullptr; }
  void read_f32(std::string_view name, const SliceSpec& s, float* out) const override {
    const int64_t cols = full_cols(name);
    const bool gain = (name.find("ln_") != std::string_view::npos) && name.ends_with(".weight");
    const bool bias = name.ends_with(".bias");
    const uint64_t base = mix64(seed_ ^ hash_name(name));
    int64_t i = 0;
    for (int64_t r = s.row_begin; r < s.row_end; ++r) {
      for (int64_t c = s.col_begin; c < s.col_end; ++c, ++i) {
        if (gain) {
          out[i] = 1.0f;
        } else if (bias) {
          out[i] = 0.0f;
        } else {
          out[i] = std_ * normal(base, static_cast<uint64_t>(r * cols + c));
        }
      }
    }
    bytes_read_ += static_cast<uint64_t>(i) * sizeof(float);
  }
  uint64_t bytes_read() const override { return bytes_read_; }
  std::string describe() const override { return absl::StrCat("random weights (seed ", seed_, ")"); }

 private:
  // Column count of the named tensor's 2-D HF shape (1 for vectors).
  int64_t full_cols(std::string_view name) const {
    const int64_t d = config_.n_embd;
    if (!name.ends_with(".weight") || (name.find("ln_") != std::string_view::npos)) return 1;
    if (name == "wte.weight" || name == "wpe.weight") return d;
    if (name.ends_with("attn.c_attn.weight")) return 3 * d;
    if (name.ends_with("mlp.c_fc.weight")) return config_.n_inner;
    return d;  // attn.c_proj, mlp.c_proj
  }
  // Box-Muller over two hashed uniforms of the element index.
  static float normal(uint64_t base, uint64_t index) {
    const uint64_t a = mix64(base + 2 * index);
    const uint64_t b = mix64(base + 2 * index + 1);
    const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1p-53;  // (0, 1]
    const double u2 = static_cast<double>(b >> 11) * 0x1p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
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
