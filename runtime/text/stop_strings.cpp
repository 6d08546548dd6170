// Stop strings: see stop_strings.h. pending_ holds at most (longest stop - 1) bytes, plus up to 3
// bytes of an incomplete UTF-8 character, between calls, so each push costs
// O((pending + new text) * number of stops).
#include "runtime/text/stop_strings.h"

#include <algorithm>

#include "common/check.h"

namespace ltm {
namespace {

// How many trailing bytes of `s` form a UTF-8 sequence that has begun but is not complete
// (0 when the text ends on a character boundary, or when the tail is not valid UTF-8 anyway).
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t k = 1; k <= std::min<size_t>(3, s.size()); ++k) {
    const auto c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3
                        : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    return need > k ? k : 0;
  }
  return 0;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

size_t StopMatcher::first_match() const {
  size_t best = std::string::npos;
  for (const std::string& s : stops_) best = std::min(best, pending_.find(s));
  return best;
}

size_t StopMatcher::first_pending_prefix() const {
  const size_t n = pending_.size();
  size_t longest = 0;
  for (const std::string& s : stops_) longest = std::max(longest, s.size());
  // Only tails shorter than the longest stop can be proper prefixes of one.
  for (size_t i = n - std::min(n, longest > 0 ? longest - 1 : 0); i < n; ++i) {
    const std::string_view tail = std::string_view(pending_).substr(i);
    for (const std::string& s : stops_)
      if (s.size() > tail.size() && std::string_view(s).substr(0, tail.size()) == tail) return i;
  }
  return std::string::npos;
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  LTM_ASSERT(!flushed_, "StopMatcher::push after flush");
  if (stopped_) return {"", true};
  pending_.append(text);

  const size_t match = first_match();
  const size_t prefix = first_pending_prefix();
  Result r;
  if (match != std::string::npos && (prefix == std::string::npos || prefix > match)) {
    // Nothing that starts earlier can still complete: this match is the first occurrence.
    r.emit = pending_.substr(0, match);
    r.stopped = stopped_ = true;
    pending_.clear();
    return r;
  }
  size_t cut = prefix;  // hold from the earliest tail that may still become a stop
  if (cut == std::string::npos) cut = pending_.size() - incomplete_utf8_tail(pending_);
  r.emit = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return r;
}

std::string StopMatcher::flush() {
  if (flushed_ || stopped_) {
    flushed_ = true;
    return "";
  }
  flushed_ = true;
  std::string out;
  const size_t match = first_match();
  if (match != std::string::npos) {
    out = pending_.substr(0, match);
    stopped_ = true;
  } else {
    out = std::move(pending_);
  }
  pending_.clear();
  return out;
}

}  // namespace ltm
