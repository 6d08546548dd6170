#include "runtime/model/load_progress.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"

namespace ltm {

std::string human_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return absl::StrFormat("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%.0f B", bytes);
}

namespace {

using Clock = std::chrono::steady_clock;

class Progress final : public ProgressSource {
 public:
  Progress(std::unique_ptr<WeightSource> inner, uint64_t total, int element_bytes, bool terminal)
      : inner_(std::move(inner)), total_(std::max<uint64_t>(total, 1)),
        element_bytes_(element_bytes), terminal_(terminal), start_(Clock::now()),
        last_draw_(start_ - std::chrono::seconds(1)) {}  // the first read draws at once
  // A load that failed part-way ends the status line without claiming the weights loaded.
  ~Progress() override {
    if (!finished_ && terminal_ && drawn_) {
      std::fprintf(stderr, "\r\033[K");
      set_status_line_drawn(false);
    }
  }

  const ModelConfig& config() const override { return inner_->config(); }
  const float* f32_in_place(std::string_view name) const override {
    return inner_->f32_in_place(name);
  }
  void read_f32(std::string_view name, const SliceSpec& s, float* out) const override {
    inner_->read_f32(name, s, out);
    const uint64_t n = static_cast<uint64_t>((s.row_end - s.row_begin) * (s.col_end - s.col_begin));
    const uint64_t done = done_.fetch_add(n, std::memory_order_relaxed) + n;
    if (terminal_) draw(done, false);
  }
  uint64_t bytes_read() const override { return inner_->bytes_read(); }
  std::string describe() const override { return inner_->describe(); }

  void finish() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    const double s = seconds();
    const double bytes = static_cast<double>(done_.load()) * element_bytes_;
    if (terminal_ && drawn_) {
      std::fprintf(stderr, "\r\033[K");
      set_status_line_drawn(false);
    }
    spdlog::info("loaded weights: {} in {:.2f} s ({}/s) from {}", human_bytes(bytes), s,
                 human_bytes(s > 0 ? bytes / s : 0), inner_->describe());
  }

 private:
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void draw(uint64_t done, bool force) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    const Clock::time_point now = Clock::now();
    if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    drawn_ = true;
    const double s = seconds();
    const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
    const double bytes = static_cast<double>(done) * element_bytes_;
    const double rate = s > 0 ? bytes / s : 0;
    const double left = frac > 0 ? s * (1 - frac) / frac : 0;
    std::fprintf(stderr, "\rloading weights: %s / %s (%.0f%%), %s/s, %.1f s left\033[K",
                 human_bytes(std::min(bytes, double(total_) * element_bytes_)).c_str(),
                 human_bytes(static_cast<double>(total_) * element_bytes_).c_str(), 100 * frac,
                 human_bytes(rate).c_str(), left);
    std::fflush(stderr);
    set_status_line_drawn(true);
  }

  std::unique_ptr<WeightSource> inner_;
  const uint64_t total_;
  const int element_bytes_;
  const bool terminal_;
  const Clock::time_point start_;
  mutable std::mutex mu_;
  mutable Clock::time_point last_draw_;
  mutable bool drawn_ = false;
  bool finished_ = false;
  mutable std::atomic<uint64_t> done_{0};
};

}  // namespace

std::unique_ptr<ProgressSource> make_progress_source(std::unique_ptr<WeightSource> inner,
                                                     uint64_t total_elements, int element_bytes,
                                                     bool terminal) {
  return std::make_unique<Progress>(std::move(inner), total_elements, element_bytes, terminal);
}

}  // namespace ltm
