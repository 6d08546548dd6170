// Bounded JSON parsing, for every JSON text the server reads from outside: HTTP request bodies,
// config.json, adapter_config.json, vocab.json, safetensors headers and shard indexes.
//
// nlohmann's plain parse() leaves three holes for input from strangers: nlohmann::ordered_json
// finds each key by a linear scan (a 975 KB body of 75,000 keys took 31.8 s to parse); a
// duplicate key silently keeps the last value; and nothing bounds the nesting, while dump() and
// our own code walking the value recurse. parse_json builds the value through nlohmann's SAX
// interface into an nlohmann::json, whose objects are std::maps (a key costs O(log n)
// comparisons: the parse is O(n log n) in the number of keys, linear in everything else), and
// stops at the first of:
//   - a container nested deeper than `max_depth` (kMaxJsonDepth): refused when it opens, so a
//     body of a million '['s costs one pass over 64 of them;
//   - a key that appears twice in one object;
//   - a syntax error, invalid UTF-8, a lone surrogate escape (\ud800) or a number outside the
//     range of a double (1e400), as nlohmann's lexer reports them.
// The error is InvalidArgument with the place of the fault first: "temperature: number 1e400 is
// out of range", "stop[1]: duplicate key", "stream_options.include_usage: ..."; a fault outside
// any member has no place. Keys in the place are cut to 32 bytes, the place and the reason to
// 256 each, so an error about a megabyte key or token is still a short line. The caller adds
// which text it was reading.
//
// json_brief describes a value for an error message in bounded space (dump() copies all of it).
//
// Header-only (ltm_json: ltm_common + nlohmann_json). Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ltm {

// Deep enough for every format we read (HTTP bodies nest 3 levels, safetensors headers 3,
// tokenizer files 4), shallow enough that any recursion over the value is harmless.
inline constexpr int kMaxJsonDepth = 64;

// Where a parse failed, for callers that report the field (the HTTP API's `param`).
struct JsonFault {
  std::string path;   // "temperature", "stop[1]", "a.b"; empty: the top level
  std::string field;  // the top-level key the path starts with; empty when there is none
};

namespace json_detail {

inline constexpr size_t kMaxKeyInPath = 32;
inline constexpr size_t kMaxPath = 256;    // a path 64 levels deep is cut, its reason kept
inline constexpr size_t kMaxReason = 256;  // nlohmann's messages quote the last token read

// The first `n` bytes of `s`, not cutting a UTF-8 sequence, with "..." when cut.
inline std::string cut(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

// Builds the value as nlohmann's own DOM parser does (json_sax_dom_parser), with the checks
// above. Each open container is a frame; a frame's `key` is the member being read (objects),
// and `pending` says its value has not arrived yet.
template <class Json>
class BoundedSax {
 public:
  using string_t = typename Json::string_t;
  using object_t = typename Json::object_t;

  BoundedSax(Json& root, int max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(typename Json::number_integer_t v) { return value(v); }
  bool number_unsigned(typename Json::number_unsigned_t v) { return value(v); }
  bool number_float(typename Json::number_float_t v, const string_t&) { return value(v); }
  bool string(string_t& v) { return value(std::move(v)); }
  bool binary(typename Json::binary_t&) { return fail(here(), "binary values are not JSON"); }

  bool start_object(std::size_t) { return open(Json::value_t::object); }
  bool start_array(std::size_t) { return open(Json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    Frame& f = frames_.back();
    auto [it, inserted] = f.container->template get_ref<object_t&>().emplace(std::move(k), nullptr);
    f.key = &it->first;
    f.member = &it->second;
    f.pending = true;
    if (!inserted) return fail(here(), "duplicate key");
    return true;
  }

  bool parse_error(std::size_t, const std::string& last_token,
                   const typename Json::exception& ex) {
    // 406: the lexer read a number that is not finite as a double.
    if (ex.id == 406)
      return fail(here(), absl::StrCat("number ", cut(last_token, 32), " is out of range"));
    return fail(here(), ex.what());
  }

  const std::string& message() const { return message_; }
  const JsonFault& fault() const { return fault_; }

 private:
  struct Frame {
    Json* container = nullptr;
    const string_t* key = nullptr;  // objects: the member being read
    Json* member = nullptr;
    bool pending = false;
  };

  template <class V>
  bool value(V&& v) {
    place() = Json(std::forward<V>(v));
    return true;
  }

  // Where the next value goes; it ends the pending member of an object.
  Json& place() {
    if (frames_.empty()) return root_;
    Frame& f = frames_.back();
    if (f.container->is_array()) {
      f.container->emplace_back(nullptr);
      return f.container->back();
    }
    f.pending = false;
    return *f.member;
  }

  bool open(typename Json::value_t t) {
    if (static_cast<int>(frames_.size()) >= max_depth_)
      return fail(here(), absl::StrCat("nests deeper than ", max_depth_, " levels"));
    Json& c = place();
    c = Json(t);
    frames_.push_back(Frame{&c});
    return true;
  }

  bool close() {
    frames_.pop_back();
    return true;
  }

  // The place of the value being read: the path through the open containers, ending at the
  // pending member (objects) or the next element (arrays) of the innermost one.
  JsonFault here() const {
    JsonFault f;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& fr = frames_[i];
      const bool innermost = i + 1 == frames_.size();
      if (fr.container->is_array()) {
        const size_t n = fr.container->size();
        // An inner array's current element is its last; the innermost one's is the next.
        absl::StrAppend(&f.path, "[", innermost || n == 0 ? n : n - 1, "]");
      } else if (fr.key != nullptr && (!innermost || fr.pending)) {
        const std::string k = cut(*fr.key, kMaxKeyInPath);
        if (i == 0) f.field = k;
        absl::StrAppend(&f.path, f.path.empty() ? "" : ".", k);
      } else {
        break;  // between members: the place is the object itself
      }
    }
    return f;
  }

  bool fail(JsonFault where, const std::string& reason) {
    fault_ = std::move(where);
    message_ = fault_.path.empty()
                   ? cut(reason, kMaxReason)
                   : absl::StrCat(cut(fault_.path, kMaxPath), ": ", cut(reason, kMaxReason));
    return false;
  }

  Json& root_;
  const int max_depth_;
  std::vector<Frame> frames_;
  std::string message_;
  JsonFault fault_;
};

}  // namespace json_detail

// Parses `text` as one JSON value (nothing but whitespace after it). On failure returns
// InvalidArgument (the message as described above) and, when `fault` is given, sets it.
template <class Json = nlohmann::json>
absl::StatusOr<Json> parse_json(std::string_view text, JsonFault* fault = nullptr,
                                int max_depth = kMaxJsonDepth) {
  Json root;
  json_detail::BoundedSax<Json> sax(root, max_depth);
  const char* begin = text.data();
  if (!Json::sax_parse(begin, begin + text.size(), &sax)) {
    if (fault != nullptr) *fault = sax.fault();
    return absl::InvalidArgumentError(sax.message());
  }
  return root;
}

// A value for an error message, in bounded space: scalars as JSON (strings cut to 64 bytes),
// containers by their size ("a list of 3 elements", "an object of 2 keys").
template <class Json>
std::string json_brief(const Json& v) {
  if (v.is_array()) return absl::StrCat("a list of ", v.size(), " elements");
  if (v.is_object()) return absl::StrCat("an object of ", v.size(), " keys");
  if (v.is_string()) {
    const auto& s = v.template get_ref<const typename Json::string_t&>();
    return absl::StrCat("\"", json_detail::cut(s, 64), "\"");
  }
  return v.dump();
}

}  // namespace ltm
