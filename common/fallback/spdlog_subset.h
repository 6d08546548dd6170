// The part of spdlog (and of fmt's "{}" formatting) that ltm logs with, for the GPU-only build
// (-DLTM_GPU_ONLY=ON, cmake/gpu_only.cmake) on a machine without spdlog; where spdlog is installed
// every build uses it. Reached as "spdlog/spdlog.h" through common/fallback/spdlog/.
//
// spdlog::info / warn / error / debug / trace / critical (format, args...), spdlog::log(level,
// ...) and spdlog::set_level. The format takes "{}" and "{:spec}" with fmt's spec shape
// ([[fill]align][sign][#][0][width][.precision][type], e.g. {:.2f}, {:>8}); "{{" and "}}" are
// braces. Doubles under "{}" print in the shortest form that reads back the same, as fmt's.
// Each line goes to stderr through common/logging.cpp (log_line), with the same prefix as the
// spdlog build: [time] [host rank (req id)] [level] message.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#define LTM_SPDLOG_SUBSET 1

namespace ltm::fallback::spdlog_subset {

namespace level {
enum level_enum : int { trace = 0, debug = 1, info = 2, warn = 3, err = 4, critical = 5, off = 6 };
}  // namespace level

inline std::atomic<int>& current_level() {
  static std::atomic<int> l{level::info};
  return l;
}
inline void set_level(level::level_enum l) { current_level().store(l); }
inline bool should_log(level::level_enum l) { return l >= current_level().load() && l != level::off; }

// Writes one formatted line (common/logging.cpp).
void log_line(level::level_enum l, const std::string& message);

namespace detail {

struct Arg {
  enum Kind { kSigned, kUnsigned, kDouble, kString, kBool, kChar, kPointer } kind = kSigned;
  long long i = 0;
  unsigned long long u = 0;
  double d = 0;
  std::string_view s;
  const void* p = nullptr;
};

template <class T>
Arg make_arg(const T& v) {
  using D = std::decay_t<T>;
  Arg a;
  if constexpr (std::is_same_v<D, bool>) {
    a.kind = Arg::kBool;
    a.i = v;
  } else if constexpr (std::is_same_v<D, char>) {
    a.kind = Arg::kChar;
    a.i = v;
  } else if constexpr (std::is_integral_v<D> && std::is_signed_v<D>) {
    a.i = v;
  } else if constexpr (std::is_integral_v<D>) {
    a.kind = Arg::kUnsigned;
    a.u = v;
  } else if constexpr (std::is_floating_point_v<D>) {
    a.kind = Arg::kDouble;
    a.d = static_cast<double>(v);
  } else if constexpr (std::is_pointer_v<D> && !std::is_convertible_v<D, std::string_view>) {
    a.kind = Arg::kPointer;
    a.p = static_cast<const void*>(v);
  } else {
    a.kind = Arg::kString;
    a.s = std::string_view(v);
  }
  return a;
}

inline std::string shortest(double d) {
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

// One "{...}" replacement: `spec` is what follows the ':' (may be empty).
inline void format_one(std::string* out, std::string_view spec, const Arg& a) {
  // [[fill]align][sign][#][0][width][.precision][type] -> a printf conversion.
  std::string flags, width, precision;
  char type = 0, align = 0;
  size_t i = 0;
  if (spec.size() >= 2 && std::strchr("<>^", spec[1]) != nullptr) {
    align = spec[1];
    i = 2;
  } else if (!spec.empty() && std::strchr("<>^", spec[0]) != nullptr) {
    align = spec[0];
    i = 1;
  }
  if (i < spec.size() && std::strchr("+- ", spec[i]) != nullptr) flags += spec[i++];
  if (i < spec.size() && spec[i] == '#') flags += spec[i++];
  if (i < spec.size() && spec[i] == '0') flags += spec[i++];
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') width += spec[i++];
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') precision += spec[i++];
  }
  if (i < spec.size()) type = spec[i];
  if (align == '<') flags += '-';
  std::string text;
  char buf[64];
  const std::string head = "%" + flags + (precision.empty() ? "" : "." + precision);
  switch (a.kind) {
    case Arg::kDouble:
      if (type == 0 && precision.empty()) {
        text = shortest(a.d);
      } else {
        std::snprintf(buf, sizeof(buf), (head + (type ? std::string(1, type) : "g")).c_str(), a.d);
        text = buf;
      }
      break;
    case Arg::kSigned:
      std::snprintf(buf, sizeof(buf), (head + "ll" + (type && type != 'd' ? type : 'd')).c_str(),
                    a.i);
      text = buf;
      break;
    case Arg::kUnsigned:
      std::snprintf(buf, sizeof(buf), (head + "ll" + (type && type != 'd' ? type : 'u')).c_str(),
                    a.u);
      text = buf;
      break;
    case Arg::kBool: text = a.i ? "true" : "false"; break;
    case Arg::kChar: text.assign(1, static_cast<char>(a.i)); break;
    case Arg::kPointer:
      std::snprintf(buf, sizeof(buf), "%p", a.p);
      text = buf;
      break;
    case Arg::kString:
      text.assign(a.s.data(), a.s.size());
      if (!precision.empty()) text = text.substr(0, std::strtoul(precision.c_str(), nullptr, 10));
      break;
  }
  const size_t w = width.empty() ? 0 : std::strtoul(width.c_str(), nullptr, 10);
  if (text.size() < w) {
    const bool left = align == '<' || (align == 0 && a.kind == Arg::kString);
    const std::string pad(w - text.size(), ' ');
    text = left ? text + pad : pad + text;
  }
  out->append(text);
}

inline std::string format(std::string_view f, const Arg* args, size_t count) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if ((c == '{' || c == '}') && i + 1 < f.size() && f[i + 1] == c) {
      out.push_back(c);
      ++i;
    } else if (c == '{') {
      const size_t close = f.find('}', i);
      if (close == std::string_view::npos) {
        out.append(f.substr(i));
        break;
      }
      std::string_view inside = f.substr(i + 1, close - i - 1);
      const size_t colon = inside.find(':');
      const std::string_view spec =
          colon == std::string_view::npos ? std::string_view() : inside.substr(colon + 1);
      if (next < count) format_one(&out, spec, args[next++]);
      else out.append("{?}");  // more replacements than arguments
      i = close;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace detail

template <class... Args>
std::string format(std::string_view f, const Args&... args) {
  const detail::Arg a[] = {detail::make_arg(args)..., detail::Arg{}};
  return detail::format(f, a, sizeof...(Args));
}

template <class... Args>
void log(level::level_enum l, std::string_view f, const Args&... args) {
  if (should_log(l)) log_line(l, format(f, args...));
}
template <class... Args>
void trace(std::string_view f, const Args&... args) { log(level::trace, f, args...); }
template <class... Args>
void debug(std::string_view f, const Args&... args) { log(level::debug, f, args...); }
template <class... Args>
void info(std::string_view f, const Args&... args) { log(level::info, f, args...); }
template <class... Args>
void warn(std::string_view f, const Args&... args) { log(level::warn, f, args...); }
template <class... Args>
void error(std::string_view f, const Args&... args) { log(level::err, f, args...); }
template <class... Args>
void critical(std::string_view f, const Args&... args) { log(level::critical, f, args...); }

}  // namespace ltm::fallback::spdlog_subset

namespace spdlog = ::ltm::fallback::spdlog_subset;
