// The part of abseil's API that ltm's GPU-only build compiles against (-DLTM_GPU_ONLY=ON,
// cmake/gpu_only.cmake): Status and StatusOr, StrCat / StrAppend / StrJoin / StrSplit /
// StrFormat, SimpleAtoi, StartsWith, FunctionRef, flat_hash_map, Cord. Written for that build,
// where no abseil is installed (a GPU machine with nvcc and PyTorch's wheels, no Debian -dev
// packages); every other build uses the real abseil and never sees this file.
//
// The code lives in ltm::fallback::absl_subset; common/fallback/include/absl/... (the header
// paths ltm includes) make `absl` an alias of it, so no symbol of the build is named absl::.
// Only what ltm calls is here, with abseil's meaning where ltm relies on it:
//   - StatusCode values are gRPC's (kInvalidArgument = 3, ...); ToString() is "CODE: message".
//   - StrCat formats a float or double as %g with 6 significant digits, integers in decimal.
//   - StrFormat takes any integer for %d/%i/%u/%x/%o/%c and any number for %f/%g/%e (converted
//     as abseil converts them), strings for %s; a bad pairing of conversion and argument aborts
//     here at run time (abseil refuses it when compiling, so the full build catches it first).
//   - StatusOr::value() on an error prints the status and aborts (abseil throws or aborts).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace ltm::fallback::absl_subset {

using string_view = std::string_view;

// ---- Strings -----------------------------------------------------------------------------------

namespace detail {

inline void append_number(std::string* out, long long v) { out->append(std::to_string(v)); }
inline void append_number(std::string* out, unsigned long long v) {
  out->append(std::to_string(v));
}
inline void append_number(std::string* out, double v) {
  char buf[32];
  const int n = std::snprintf(buf, sizeof(buf), "%.6g", v);
  out->append(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

// One StrCat argument appended to `out`.
template <class T>
void append_piece(std::string* out, const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, char>) {
    static_assert(!std::is_same_v<D, char>, "StrCat takes no char (as abseil): use a string");
  } else if constexpr (std::is_same_v<D, bool>) {
    out->append(v ? "1" : "0");
  } else if constexpr (std::is_integral_v<D> && std::is_signed_v<D>) {
    append_number(out, static_cast<long long>(v));
  } else if constexpr (std::is_integral_v<D>) {
    append_number(out, static_cast<unsigned long long>(v));
  } else if constexpr (std::is_floating_point_v<D>) {
    append_number(out, static_cast<double>(v));
  } else if constexpr (std::is_enum_v<D>) {
    append_number(out, static_cast<long long>(v));
  } else {
    const std::string_view s(v);
    out->append(s.data(), s.size());
  }
}

}  // namespace detail

template <class... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (detail::append_piece(&out, args), ...);
  return out;
}

template <class... Args>
void StrAppend(std::string* out, const Args&... args) {
  (detail::append_piece(out, args), ...);
}

template <class Range>
std::string StrJoin(const Range& range, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const auto& v : range) {
    if (!first) out.append(separator.data(), separator.size());
    first = false;
    detail::append_piece(&out, v);
  }
  return out;
}

template <class T>
std::string StrJoin(std::initializer_list<T> range, std::string_view separator) {
  return StrJoin(std::vector<T>(range), separator);
}

inline bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}
inline bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
inline bool StrContains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

inline std::string_view StripAsciiWhitespace(std::string_view s) {
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// Integers in decimal with an optional sign, surrounding ASCII whitespace allowed (as abseil);
// false when empty, not a number or out of the type's range.
template <class Int>
bool SimpleAtoi(std::string_view text, Int* out) {
  static_assert(std::is_integral_v<Int> && !std::is_same_v<Int, bool>);
  const std::string s(StripAsciiWhitespace(text));
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  if constexpr (std::is_signed_v<Int>) {
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || end != s.c_str() + s.size()) return false;
    if (v < static_cast<long long>(std::numeric_limits<Int>::min()) ||
        v > static_cast<long long>(std::numeric_limits<Int>::max()))
      return false;
    *out = static_cast<Int>(v);
  } else {
    if (s[0] == '-') return false;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (errno != 0 || end != s.c_str() + s.size()) return false;
    if (v > static_cast<unsigned long long>(std::numeric_limits<Int>::max())) return false;
    *out = static_cast<Int>(v);
  }
  return true;
}

inline bool SimpleAtod(std::string_view text, double* out) {
  const std::string s(StripAsciiWhitespace(text));
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

// StrSplit's predicates.
struct AllowEmpty {
  bool operator()(std::string_view) const { return true; }
};
struct SkipEmpty {
  bool operator()(std::string_view s) const { return !s.empty(); }
};
struct SkipWhitespace {
  bool operator()(std::string_view s) const { return !StripAsciiWhitespace(s).empty(); }
};

// The pieces, as string_views into `text` (which must outlive them), or as strings.
class SplitPieces : public std::vector<std::string_view> {
 public:
  operator std::vector<std::string>() const { return {begin(), end()}; }
};

template <class Keep = AllowEmpty>
SplitPieces StrSplit(std::string_view text, std::string_view delimiter, Keep keep = Keep()) {
  SplitPieces out;
  size_t start = 0;
  while (true) {
    const size_t at = delimiter.empty() ? std::string_view::npos : text.find(delimiter, start);
    const std::string_view piece =
        text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start);
    if (keep(piece)) out.push_back(piece);
    if (at == std::string_view::npos) break;
    start = at + delimiter.size();
  }
  return out;
}

template <class Keep = AllowEmpty>
SplitPieces StrSplit(std::string_view text, char delimiter, Keep keep = Keep()) {
  return StrSplit(text, std::string_view(&delimiter, 1), keep);
}

// ---- StrFormat ---------------------------------------------------------------------------------

namespace detail {

// One StrFormat argument, kept by kind.
struct FormatArg {
  enum Kind { kSigned, kUnsigned, kDouble, kString, kPointer } kind = kSigned;
  long long i = 0;
  unsigned long long u = 0;
  double d = 0;
  std::string_view s;
  const void* p = nullptr;
};

template <class T>
FormatArg make_format_arg(const T& v) {
  using D = std::decay_t<T>;
  FormatArg a;
  if constexpr (std::is_same_v<D, bool>) {
    a.i = v ? 1 : 0;
  } else if constexpr (std::is_integral_v<D> && std::is_signed_v<D>) {
    a.i = v;
  } else if constexpr (std::is_integral_v<D>) {
    a.kind = FormatArg::kUnsigned;
    a.u = v;
  } else if constexpr (std::is_enum_v<D>) {
    a.i = static_cast<long long>(v);
  } else if constexpr (std::is_floating_point_v<D>) {
    a.kind = FormatArg::kDouble;
    a.d = static_cast<double>(v);
  } else if constexpr (std::is_pointer_v<D> && !std::is_convertible_v<D, std::string_view>) {
    a.kind = FormatArg::kPointer;
    a.p = static_cast<const void*>(v);
  } else {
    a.kind = FormatArg::kString;
    a.s = std::string_view(v);
  }
  return a;
}

[[noreturn]] inline void format_fail(std::string_view format, const char* why) {
  std::fprintf(stderr, "ltm: StrFormat(\"%.*s\"): %s\n", static_cast<int>(format.size()),
               format.data(), why);
  std::abort();
}

template <class... V>
void snprintf_append(std::string* out, const std::string& spec, V... values) {
  const int n = std::snprintf(nullptr, 0, spec.c_str(), values...);
  if (n <= 0) return;
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(n) + 1);
  std::snprintf(out->data() + at, static_cast<size_t>(n) + 1, spec.c_str(), values...);
  out->resize(at + static_cast<size_t>(n));
}

inline void format_into(std::string* out, std::string_view format, const FormatArg* args,
                        size_t count) {
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out->push_back(format[i]);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '%') {
      out->push_back('%');
      ++i;
      continue;
    }
    // %[flags][width][.precision][length]conversion; the length is dropped (any integer fits).
    std::string spec = "%";
    size_t j = i + 1;
    while (j < format.size() && std::strchr("-+ #0", format[j]) != nullptr) spec += format[j++];
    while (j < format.size() && (std::isdigit(static_cast<unsigned char>(format[j])) ||
                                 format[j] == '.'))
      spec += format[j++];
    while (j < format.size() && std::strchr("hlLqjzt", format[j]) != nullptr) ++j;
    if (j >= format.size()) format_fail(format, "a conversion is cut off");
    const char conv = format[j];
    i = j;
    if (next >= count) format_fail(format, "fewer arguments than conversions");
    const FormatArg& a = args[next++];
    switch (conv) {
      case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': case 'c':
        if (a.kind == FormatArg::kSigned && conv != 'c' && conv != 'd' && conv != 'i')
          snprintf_append(out, spec + "ll" + conv, static_cast<unsigned long long>(a.i));
        else if (a.kind == FormatArg::kSigned)
          snprintf_append(out, spec + (conv == 'c' ? "" : "ll") + conv,
                          conv == 'c' ? static_cast<long long>(static_cast<int>(a.i)) : a.i);
        else if (a.kind == FormatArg::kUnsigned)
          snprintf_append(out, spec + "ll" + (conv == 'd' || conv == 'i' ? 'u' : conv), a.u);
        else
          format_fail(format, "an integer conversion given a non-integer");
        break;
      case 'f': case 'F': case 'g': case 'G': case 'e': case 'E': case 'a': case 'A': {
        double d = a.d;
        if (a.kind == FormatArg::kSigned) d = static_cast<double>(a.i);
        else if (a.kind == FormatArg::kUnsigned) d = static_cast<double>(a.u);
        else if (a.kind != FormatArg::kDouble)
          format_fail(format, "a floating-point conversion given a non-number");
        snprintf_append(out, spec + conv, d);
        break;
      }
      case 's': {
        std::string text;
        if (a.kind == FormatArg::kString) text.assign(a.s.data(), a.s.size());
        else if (a.kind == FormatArg::kSigned) text = std::to_string(a.i);
        else if (a.kind == FormatArg::kUnsigned) text = std::to_string(a.u);
        else if (a.kind == FormatArg::kDouble) append_number(&text, a.d);
        else format_fail(format, "%s given a pointer");
        snprintf_append(out, spec + 's', text.c_str());
        break;
      }
      case 'p':
        snprintf_append(out, spec + 'p', a.p);
        break;
      default:
        format_fail(format, "unknown conversion");
    }
  }
  if (next != count) format_fail(format, "more arguments than conversions");
}

}  // namespace detail

template <class... Args>
std::string StrFormat(std::string_view format, const Args&... args) {
  std::string out;
  const detail::FormatArg a[] = {detail::make_format_arg(args)..., detail::FormatArg{}};
  detail::format_into(&out, format, a, sizeof...(Args));
  return out;
}

template <class... Args>
std::string& StrAppendFormat(std::string* out, std::string_view format, const Args&... args) {
  const detail::FormatArg a[] = {detail::make_format_arg(args)..., detail::FormatArg{}};
  detail::format_into(out, format, a, sizeof...(Args));
  return *out;
}

// ---- Cord (a status payload only) --------------------------------------------------------------

class Cord {
 public:
  Cord() = default;
  explicit Cord(std::string_view s) : s_(s) {}
  explicit operator std::string() const { return s_; }
  bool empty() const { return s_.empty(); }
  size_t size() const { return s_.size(); }
  bool operator==(const Cord& o) const { return s_ == o.s_; }

 private:
  std::string s_;
};

// ---- Status ------------------------------------------------------------------------------------

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

inline std::string StatusCodeToString(StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int c = static_cast<int>(code);
  return c >= 0 && c <= 16 ? kNames[c] : "UNKNOWN";
}

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string_view message)
      : code_(code), message_(code == StatusCode::kOk ? std::string_view() : message) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  int raw_code() const { return static_cast<int>(code_); }
  std::string_view message() const { return message_; }
  std::string ToString() const {
    return ok() ? std::string("OK") : StatusCodeToString(code_) + ": " + message_;
  }
  void Update(const Status& other) {
    if (ok()) *this = other;
  }
  void IgnoreError() const {}

  void SetPayload(std::string_view url, Cord payload) {
    if (ok()) return;  // as abseil: an OK status carries no payload
    for (auto& [u, p] : payloads_)
      if (u == url) {
        p = std::move(payload);
        return;
      }
    payloads_.emplace_back(std::string(url), std::move(payload));
  }
  std::optional<Cord> GetPayload(std::string_view url) const {
    for (const auto& [u, p] : payloads_)
      if (u == url) return p;
    return std::nullopt;
  }
  bool ErasePayload(std::string_view url) {
    for (auto it = payloads_.begin(); it != payloads_.end(); ++it)
      if (it->first == url) {
        payloads_.erase(it);
        return true;
      }
    return false;
  }

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }
  friend bool operator!=(const Status& a, const Status& b) { return !(a == b); }
  friend std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::vector<std::pair<std::string, Cord>> payloads_;
};

inline Status OkStatus() { return Status(); }

#define LTM_FALLBACK_STATUS_KIND_(Name)                                                      \
  inline Status Name##Error(std::string_view message) {                                     \
    return Status(StatusCode::k##Name, message);                                            \
  }                                                                                          \
  inline bool Is##Name(const Status& s) { return s.code() == StatusCode::k##Name; }
LTM_FALLBACK_STATUS_KIND_(Aborted)
LTM_FALLBACK_STATUS_KIND_(AlreadyExists)
LTM_FALLBACK_STATUS_KIND_(Cancelled)
LTM_FALLBACK_STATUS_KIND_(DataLoss)
LTM_FALLBACK_STATUS_KIND_(DeadlineExceeded)
LTM_FALLBACK_STATUS_KIND_(FailedPrecondition)
LTM_FALLBACK_STATUS_KIND_(Internal)
LTM_FALLBACK_STATUS_KIND_(InvalidArgument)
LTM_FALLBACK_STATUS_KIND_(NotFound)
LTM_FALLBACK_STATUS_KIND_(OutOfRange)
LTM_FALLBACK_STATUS_KIND_(PermissionDenied)
LTM_FALLBACK_STATUS_KIND_(ResourceExhausted)
LTM_FALLBACK_STATUS_KIND_(Unauthenticated)
LTM_FALLBACK_STATUS_KIND_(Unavailable)
LTM_FALLBACK_STATUS_KIND_(Unimplemented)
LTM_FALLBACK_STATUS_KIND_(Unknown)
#undef LTM_FALLBACK_STATUS_KIND_

inline StatusCode ErrnoToStatusCode(int error_number) {
  switch (error_number) {
    case 0: return StatusCode::kOk;
    case EINVAL: case ENAMETOOLONG: case E2BIG: case EDESTADDRREQ: case EDOM: case EFAULT:
    case EILSEQ: case ENOPROTOOPT: case ENOTSOCK: case ENOTTY: case EPROTOTYPE: case ESPIPE:
      return StatusCode::kInvalidArgument;
    case ETIMEDOUT: return StatusCode::kDeadlineExceeded;
    case ENODEV: case ENOENT: case ENXIO: case ESRCH: return StatusCode::kNotFound;
    case EEXIST: case EADDRNOTAVAIL: case EALREADY: return StatusCode::kAlreadyExists;
    case EPERM: case EACCES: case EROFS: return StatusCode::kPermissionDenied;
    case ENOTEMPTY: case EISDIR: case ENOTDIR: case EADDRINUSE: case EBADF: case EBUSY:
    case ECHILD: case EISCONN: case ENOTCONN: case EPIPE: case ETXTBSY:
      return StatusCode::kFailedPrecondition;
    case ENOSPC: case EMFILE: case EMLINK: case ENFILE: case ENOBUFS: case ENOMEM: case EFBIG:
    case EUSERS:
      return StatusCode::kResourceExhausted;
    case EOVERFLOW: case ERANGE: return StatusCode::kOutOfRange;
    case ENOSYS: case ENOTSUP: case EAFNOSUPPORT: case EPROTONOSUPPORT: case EXDEV:
      return StatusCode::kUnimplemented;
    case EAGAIN: case ECONNREFUSED: case ECONNABORTED: case ECONNRESET: case EINTR:
    case EHOSTDOWN: case EHOSTUNREACH: case ENETDOWN: case ENETRESET: case ENETUNREACH:
    case ENOLCK: case ENOLINK: case EIO:
      return StatusCode::kUnavailable;
    case EDEADLK: case ESTALE: return StatusCode::kAborted;
    case ECANCELED: return StatusCode::kCancelled;
    default: return StatusCode::kUnknown;
  }
}

// ---- StatusOr ----------------------------------------------------------------------------------

template <class T>
class StatusOr {
 public:
  StatusOr() : v_(Status(StatusCode::kUnknown, "")) {}
  StatusOr(const Status& s) : v_(s) { check_not_ok(); }
  StatusOr(Status&& s) : v_(std::move(s)) { check_not_ok(); }
  StatusOr(const T& v) : v_(std::in_place_index<1>, v) {}
  StatusOr(T&& v) : v_(std::in_place_index<1>, std::move(v)) {}
  template <class U, class = std::enable_if_t<
                         std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
                         !std::is_convertible_v<U&&, Status> &&
                         !std::is_same_v<std::decay_t<U>, StatusOr>>>
  StatusOr(U&& v) : v_(std::in_place_index<1>, std::forward<U>(v)) {}
  template <class U, class = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                              !std::is_same_v<U, T>>>
  StatusOr(StatusOr<U>&& other)
      : v_(other.ok() ? Variant(std::in_place_index<1>, std::move(*other))
                      : Variant(std::in_place_index<0>, other.status())) {}

  bool ok() const { return v_.index() == 1; }
  const Status& status() const& {
    static const Status kOk;
    return ok() ? kOk : std::get<0>(v_);
  }
  Status status() && { return ok() ? Status() : std::move(std::get<0>(v_)); }

  T& value() & { return check_ok(), std::get<1>(v_); }
  const T& value() const& { return check_ok(), std::get<1>(v_); }
  T&& value() && { return check_ok(), std::move(std::get<1>(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  template <class U>
  T value_or(U&& fallback) const& {
    return ok() ? std::get<1>(v_) : static_cast<T>(std::forward<U>(fallback));
  }
  template <class U>
  T value_or(U&& fallback) && {
    return ok() ? std::move(std::get<1>(v_)) : static_cast<T>(std::forward<U>(fallback));
  }
  template <class... Args>
  T& emplace(Args&&... args) {
    v_.template emplace<1>(std::forward<Args>(args)...);
    return std::get<1>(v_);
  }

 private:
  using Variant = std::variant<Status, T>;
  void check_not_ok() {
    if (std::get<0>(v_).ok()) v_ = Status(StatusCode::kInternal, "StatusOr made from an OK Status");
  }
  bool check_ok() const {
    if (!ok()) {
      std::fprintf(stderr, "ltm: StatusOr::value() of an error: %s\n",
                   std::get<0>(v_).ToString().c_str());
      std::abort();
    }
    return true;
  }
  Variant v_;
};

// ---- FunctionRef, flat_hash_map ----------------------------------------------------------------

template <class Signature>
class FunctionRef;

// A non-owning reference to a callable, valid while the callable lives (as abseil's).
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<std::is_invocable_r_v<R, F&, Args...> &&
                                              !std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f) {  // NOLINT: implicit, as abseil's
    if constexpr (std::is_pointer_v<std::decay_t<F>> &&
                  std::is_function_v<std::remove_pointer_t<std::decay_t<F>>>) {
      fn_ = reinterpret_cast<void (*)()>(f);
      call_ = [](const FunctionRef& self, Args... args) -> R {
        return reinterpret_cast<std::decay_t<F>>(self.fn_)(std::forward<Args>(args)...);
      };
    } else {
      obj_ = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
      call_ = [](const FunctionRef& self, Args... args) -> R {
        return (*static_cast<std::remove_reference_t<F>*>(self.obj_))(std::forward<Args>(args)...);
      };
    }
  }
  R operator()(Args... args) const { return call_(*this, std::forward<Args>(args)...); }

 private:
  void* obj_ = nullptr;
  void (*fn_)() = nullptr;
  R (*call_)(const FunctionRef&, Args...) = nullptr;
};

namespace detail {
// String keys are looked up by string_view too, as in abseil (C++20 heterogeneous lookup).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
template <class K>
struct DefaultHash {
  using Hash = std::hash<K>;
  using Eq = std::equal_to<K>;
};
template <>
struct DefaultHash<std::string> {
  using Hash = StringHash;
  using Eq = std::equal_to<>;
};
}  // namespace detail

template <class K, class V, class Hash = typename detail::DefaultHash<K>::Hash,
          class Eq = typename detail::DefaultHash<K>::Eq>
using flat_hash_map = std::unordered_map<K, V, Hash, Eq>;

}  // namespace ltm::fallback::absl_subset

namespace absl = ::ltm::fallback::absl_subset;
