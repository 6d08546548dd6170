// Stop strings for streamed generation: decides how much decoded text is safe to send and when a
// stop string ends the output.
//
// Contract: for any split of a text into push() calls followed by flush(), the concatenation of
// every Result::emit and flush() equals the text truncated before the first occurrence (lowest
// start offset) of any stop string, or the whole text when none occurs. Text pushed after a stop
// does not change that: the first occurrence is final when it is reported.
//
// How: text that cannot be the start of a stop string is released at once; a tail that is a
// proper prefix of some stop string is held back until it completes or fails. A complete match is
// reported only when no stop string starting earlier is still pending (stops "abcd" and "bc" on
// "abc": wait; then "d" ends the output before "abcd", anything else before "bc"). So a
// stop is reported at most (longest stop - 1) bytes after it appears.
// Emitted text never ends inside an incomplete UTF-8 sequence: up to 3 trailing bytes of a
// character split across pushes are held until the character completes (or until flush()).
// Matching is bytewise; stop strings are expected to be valid UTF-8 (request validation checks).
//
// Not thread-safe: one StopMatcher per sequence, used by one thread at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ltm {

class StopMatcher {
 public:
  // Empty stop strings are ignored (they would match before any text).
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string emit;      // text now safe to send
    bool stopped = false;  // a stop string matched: `emit` is the last text; nothing follows
  };
  // Feeds newly decoded text. After a stop (from push or flush) it returns {"", true} and
  // ignores the text. Must not be called after flush().
  Result push(std::string_view text);

  // The end of the stream (EOS, length limit, cancel): returns the held-back text, cut before a
  // stop string that had matched while an earlier-starting one was pending (then stopped()
  // becomes true). Further flush() calls return "".
  std::string flush();

  // Whether a stop string ended the output.
  bool stopped() const { return stopped_; }

 private:
  // Earliest start of a complete stop string in pending_, or npos.
  size_t first_match() const;
  // Earliest start of a tail of pending_ that is a proper prefix of a stop string, or npos.
  size_t first_pending_prefix() const;

  std::vector<std::string> stops_;
  std::string pending_;  // received, not yet emitted
  bool stopped_ = false;
  bool flushed_ = false;
};

}  // namespace ltm
