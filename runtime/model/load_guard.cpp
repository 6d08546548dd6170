#include "runtime/model/load_guard.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "parallel/partition.h"

namespace ltm {
namespace {

class Guarded final : public GuardedSource {
 public:
  Guarded(std::unique_ptr<WeightSource> inner, bool check_finite)
      : inner_(std::move(inner)), check_finite_(check_finite) {}
  const ModelConfig& config() const override { return inner_->config(); }
  const float* f32_in_place(std::string_view) const override { return nullptr; }
  void read_f32(std::string_view name, const SliceSpec& slice, float* out) const override {
    inner_->read_f32(name, slice, out);
    if (!check_finite_) return;
    const int64_t cols = slice.col_end - slice.col_begin;
    const int64_t n = (slice.row_end - slice.row_begin) * cols;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isfinite(out[i])) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (status_.ok())
        status_ = absl::DataLossError(absl::StrFormat(
            "%s: weight %s [%d, %d] is %g (--check-weights refuses NaN and Inf)",
            inner_->describe(), std::string(name), slice.row_begin + i / cols,
            slice.col_begin + i % cols, out[i]));
      return;
    }
  }
  uint64_t bytes_read() const override { return inner_->bytes_read(); }
  std::string describe() const override { return inner_->describe(); }
  absl::Status status() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::unique_ptr<WeightSource> inner_;
  bool check_finite_;
  mutable std::mutex mu_;
  mutable absl::Status status_;
};

std::string gib(int64_t bytes) { return absl::StrFormat("%.2f GiB", bytes / 1073741824.0); }

}  // namespace

std::unique_ptr<GuardedSource> make_guarded_source(std::unique_ptr<WeightSource> inner,
                                                   bool check_finite) {
  return std::make_unique<Guarded>(std::move(inner), check_finite);
}

std::vector<FileStamp> stamp_checkpoint_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<FileStamp> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".safetensors") continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0) continue;
    out.push_back({e.path().string(), static_cast<int64_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  return out;
}

absl::Status verify_unchanged(const std::vector<FileStamp>& stamps) {
  for (const FileStamp& f : stamps) {
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0)
      return absl::DataLossError(absl::StrCat(f.path, ": removed while the weights were loaded"));
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (static_cast<int64_t>(st.st_size) != f.size || mtime != f.mtime_ns)
      return absl::DataLossError(absl::StrCat(
          f.path, ": changed while the weights were loaded (", f.size, " bytes before, ",
          static_cast<int64_t>(st.st_size), " after); the loaded weights may be a mix: restart "
          "once the file is complete"));
  }
  return absl::OkStatus();
}

int64_t weight_bytes_per_rank(const ModelConfig& c, const ShardSpec& s, Precision weights) {
  const int64_t d = c.n_embd, ff = c.n_inner, tp = s.tp;
  const int64_t layers =
      parallel::stage_layers(c.n_layer, c.vocab_size, c.n_embd, s.pp, s.pp_rank).size();
  const int64_t vocab_rows = parallel::padded_vocab(c.vocab_size, s.tp) / tp;
  if (c.is_llama()) {  // model_llama.cpp's layout
    const int64_t q = c.q_width() / tp;
    const int64_t kv = parallel::kv_head_range(c.kv_heads(), s.tp, s.tp_rank).size() * c.head_dim();
    const int64_t matrix_per_layer = d * (q + 2 * kv) + q * d + 3 * d * (ff / tp);
    const int64_t vector_per_layer = 2 * d + (c.qkv_bias ? q + 2 * kv : 0) + (c.o_bias ? d : 0);
    int64_t matrix = layers * matrix_per_layer, vector = layers * vector_per_layer;
    if (s.is_first_stage() || (s.is_last_stage() && c.tied_lm_head)) matrix += vocab_rows * d;
    if (s.is_last_stage() && !c.tied_lm_head) matrix += vocab_rows * d;
    if (s.is_last_stage()) vector += d;
    return matrix * static_cast<int64_t>(precision_size(weights)) +
           vector * static_cast<int64_t>(sizeof(float));
  }
  // Matrix elements (held in `weights`) and fp32 vectors, per layer.
  const int64_t matrix_per_layer = (d * 3 * d) / tp + (d * d) / tp + (d * ff) / tp + (ff * d) / tp;
  const int64_t vector_per_layer = (3 * d) / tp + d + ff / tp + d + 4 * d;
  int64_t matrix = layers * matrix_per_layer, vector = layers * vector_per_layer;
  if (s.is_first_stage() || s.is_last_stage())
    matrix += parallel::padded_vocab(c.vocab_size, s.tp) / tp * d;
  if (s.is_first_stage() && c.position_embedding == PositionEmbedding::kLearned)
    vector += c.n_positions * d;
  if (s.is_last_stage()) vector += 2 * d;
  return static_cast<int64_t>(static_cast<double>(matrix) * weight_element_bytes(weights)) +
         vector * static_cast<int64_t>(sizeof(float));
}

int64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

namespace {
// ResourceExhausted "<what_needs> X per rank (N bytes) x R rank(s) on this host = Y, but only Z
// ... is available (MemAvailable)<where>; <advice>" when R x bytes_per_rank exceeds `available`.
// what_needs: the subject with its verb ("the model's weights need").
absl::Status check_ranks_fit(const std::string& what_needs, int64_t bytes_per_rank,
                             int ranks_on_host, int64_t available, const std::string& where,
                             const std::string& advice) {
  if (available < 0) return absl::OkStatus();
  const int64_t need = bytes_per_rank * std::max(1, ranks_on_host);
  if (need <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what_needs, " ", gib(bytes_per_rank), " per rank (", bytes_per_rank, " bytes) x ",
      ranks_on_host, " rank(s) on this host = ", gib(need), ", but only ", gib(available),
      " of memory is available (MemAvailable)", where, "; ", advice));
}
}  // namespace

absl::Status check_host_memory(int64_t bytes_per_rank, int ranks_on_host, int64_t available) {
  return check_ranks_fit("the model's weights need", bytes_per_rank, ranks_on_host, available, "",
                         "use more ranks (--tp, --pp) on more hosts or a smaller model");
}

absl::Status check_resident_kv_memory(int64_t kv_bytes_per_rank, int ranks_on_host,
                                      int64_t available) {
  return check_ranks_fit("--kv-resident: the KV cache needs", kv_bytes_per_rank, ranks_on_host,
                         available, " after the weights",
                         "lower --kv-memory-mb, run fewer ranks on this host, or leave "
                         "--kv-resident off (the cache then becomes resident as it fills)");
}

}  // namespace ltm
