#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#ifndef LTM_SPDLOG_SUBSET  // the GPU-only build's stand-in (common/fallback/spdlog_subset.h)
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#else
#include <chrono>
#include <ctime>
#include <mutex>
#endif

namespace ltm {
namespace {

std::atomic<int> g_rank{-1};
thread_local std::string t_request_id;
std::atomic<bool> g_status_line{false};

#ifndef LTM_SPDLOG_SUBSET

// %* in the pattern: "HOST rRANK" and " req ID" while a LogRequestScope is alive.
class ContextFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string& host = log_host();
    dest.append(host.data(), host.data() + host.size());
    int rank = g_rank.load(std::memory_order_relaxed);
    if (rank < 0) rank = launcher_rank();
    const std::string r = " r" + std::to_string(rank);
    dest.append(r.data(), r.data() + r.size());
    if (!t_request_id.empty()) {
      static constexpr char kReq[] = " req ";
      dest.append(kReq, kReq + sizeof(kReq) - 1);
      dest.append(t_request_id.data(), t_request_id.data() + t_request_id.size());
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<ContextFlag>();
  }
};

// stderr with colour or not; a log line first erases a status line drawn by a progress display.
class StderrSink final : public spdlog::sinks::ansicolor_stderr_sink_mt {
 public:
  using Base = spdlog::sinks::ansicolor_stderr_sink_mt;
  explicit StderrSink(spdlog::color_mode mode) : Base(mode) {}
  void log(const spdlog::details::log_msg& msg) override {
    if (g_status_line.exchange(false)) std::fputs("\r\033[K", stderr);
    Base::log(msg);
  }
};

#endif  // LTM_SPDLOG_SUBSET

}  // namespace

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return 0;
}

void set_status_line_drawn(bool drawn) { g_status_line.store(drawn); }

const std::string& log_host() {
  static const std::string host = [] {
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return std::string("unknown-host");
    return std::string(buf);
  }();
  return host;
}

bool stderr_is_terminal() {
  if (isatty(STDERR_FILENO) != 1) return false;
  if (const char* no = std::getenv("NO_COLOR"); no != nullptr && *no != '\0') return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

#ifdef LTM_SPDLOG_SUBSET
// Without spdlog: the same line shape, "[time] [host rank (req id)] [level] message", on stderr.
void log_to_stderr() {}
#else
void log_to_stderr() {
  if (spdlog::get("ltm") != nullptr) return;
  const auto mode = stderr_is_terminal() ? spdlog::color_mode::always : spdlog::color_mode::never;
  auto logger = std::make_shared<spdlog::logger>("ltm", std::make_shared<StderrSink>(mode));
  spdlog::register_logger(logger);
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<ContextFlag>('*').set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%*] [%^%l%$] %v");
  logger->set_formatter(std::move(formatter));
  spdlog::set_default_logger(std::move(logger));
}
#endif

void set_log_rank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

LogRequestScope::LogRequestScope(std::string_view request_id) : previous_(t_request_id) {
  // Ids come from clients: no control bytes (a newline would forge a log line), at most 64 bytes.
  constexpr size_t kMax = 64;
  t_request_id.assign(request_id.substr(0, kMax));
  for (char& c : t_request_id)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  if (request_id.size() > kMax) t_request_id += "...";
}

LogRequestScope::~LogRequestScope() { t_request_id = std::move(previous_); }

}  // namespace ltm

#ifdef LTM_SPDLOG_SUBSET
namespace ltm::fallback::spdlog_subset {

void log_line(level::level_enum l, const std::string& message) {
  static const char* const kNames[] = {"trace", "debug",    "info", "warning",
                                       "error", "critical", "off"};
  static const char* const kColours[] = {"\033[37m", "\033[36m", "\033[32m", "\033[33;1m",
                                         "\033[31;1m", "\033[1;41m", ""};
  static std::mutex mu;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
  int rank = ltm::g_rank.load(std::memory_order_relaxed);
  if (rank < 0) rank = ltm::launcher_rank();
  std::string context = ltm::log_host() + " r" + std::to_string(rank);
  if (!ltm::t_request_id.empty()) context += " req " + ltm::t_request_id;
  static const bool colour = ltm::stderr_is_terminal();
  const int li = static_cast<int>(l);
  std::lock_guard<std::mutex> lock(mu);
  if (ltm::g_status_line.exchange(false)) std::fputs("\r\033[K", stderr);
  std::fprintf(stderr, "[%s.%03d] [%s] [%s%s%s] %s\n", when, ms, context.c_str(),
               colour ? kColours[li] : "", kNames[li], colour ? "\033[0m" : "", message.c_str());
}

}  // namespace ltm::fallback::spdlog_subset
#endif
