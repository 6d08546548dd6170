// A JSON value, parser and writer of our own for the GPU-only build (cmake/gpu_only.cmake) where
// nlohmann_json is not installed (scripts/gpu_check's machine: no -dev packages, no network;
// PyTorch's wheels do not ship nlohmann's header). Reached as <nlohmann/json.hpp> through
// common/fallback/json/nlohmann/json.hpp, which names these types nlohmann::json,
// nlohmann::ordered_json and nlohmann::detail::exception.
//
// Only what the GPU-only targets use of nlohmann's API, with its behaviour where they rely on it:
//   - values: null, boolean, number (int64, uint64, double), string, array, object (keys sorted
//     for json, in insertion order for ordered_json); built from scalars, strings, ranges and
//     initializer lists (a list of [string, value] pairs is an object, as nlohmann decides);
//   - reading: is_*, type_name, size, empty, find, contains, at, operator[], value, get<T>,
//     get_ref, begin/end (iterators with key() and value()), items() (structured bindings),
//     comparison (numbers across their kinds, as nlohmann compares them);
//   - writing: push_back, emplace_back, back, update, operator[] (inserts), dump (compact or
//     indented; strings escaped as nlohmann escapes them, invalid UTF-8 an error or U+FFFD with
//     error_handler_t::replace; doubles in their shortest round-trip form, NaN and inf as null);
//   - sax_parse: RFC 8259 JSON (no comments) through a SAX handler with nlohmann's callbacks, so
//     common/json_parse.h builds its bounded DOM on it unchanged. Non-negative integers are
//     unsigned, negative ones signed, others (and integers beyond 64 bits) double; a double
//     outside the finite range is error 406, as nlohmann reports it; lone surrogates, control
//     characters in strings and invalid UTF-8 are errors (101).
// Messages are ours, not nlohmann's. tests/common/json_subset_test.cpp checks parse and dump
// against nlohmann's on the same texts (in the full build, where both are present).
// The exceptions, and the text underneath dump and sax_parse (the writer's number and string
// formatting, the SAX parser), are in json_subset_text.h, which this header includes.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/fallback/json_subset_text.h"

namespace ltm::json_subset {

enum class value_t : uint8_t {
  null, object, array, string, boolean, number_integer, number_unsigned, number_float, binary,
  discarded
};

// An object that keeps its keys in insertion order (ordered_json). A deque: references to
// members stay valid as members are added (the SAX builder holds them).
template <class V>
class ordered_map {
 public:
  using key_type = std::string;
  using value_type = std::pair<const std::string, V>;
  using storage = std::deque<value_type>;
  using iterator = typename storage::iterator;
  using const_iterator = typename storage::const_iterator;

  iterator begin() { return d_.begin(); }
  iterator end() { return d_.end(); }
  const_iterator begin() const { return d_.begin(); }
  const_iterator end() const { return d_.end(); }
  size_t size() const { return d_.size(); }
  bool empty() const { return d_.empty(); }
  iterator find(std::string_view k) {
    for (auto it = d_.begin(); it != d_.end(); ++it)
      if (it->first == k) return it;
    return d_.end();
  }
  const_iterator find(std::string_view k) const {
    for (auto it = d_.begin(); it != d_.end(); ++it)
      if (it->first == k) return it;
    return d_.end();
  }
  template <class T>
  std::pair<iterator, bool> emplace(std::string k, T&& v) {
    auto it = find(k);
    if (it != d_.end()) return {it, false};
    d_.emplace_back(std::move(k), V(std::forward<T>(v)));
    return {std::prev(d_.end()), true};
  }

 private:
  storage d_;
};

template <bool Ordered>
class basic_json;

template <bool Ordered>
struct object_of {
  using type = std::map<std::string, basic_json<Ordered>, std::less<>>;
};
template <>
struct object_of<true> {
  using type = ordered_map<basic_json<true>>;
};

namespace detail {
template <class T, class = void>
struct is_range : std::false_type {};
template <class T>
struct is_range<T, std::void_t<decltype(std::begin(std::declval<const T&>())),
                               decltype(std::end(std::declval<const T&>()))>> : std::true_type {};
}  // namespace detail

template <bool Ordered>
class basic_json {
 public:
  using value_t = json_subset::value_t;
  using error_handler_t = json_subset::error_handler_t;
  using exception = json_subset::exception;
  using parse_error = json_subset::parse_error;
  using type_error = json_subset::type_error;
  using out_of_range = json_subset::out_of_range;
  using string_t = std::string;
  using number_integer_t = int64_t;
  using number_unsigned_t = uint64_t;
  using number_float_t = double;
  using binary_t = std::vector<uint8_t>;
  using object_t = typename object_of<Ordered>::type;
  using array_t = std::vector<basic_json>;
  using size_type = size_t;

  // ---- construction ----
  basic_json(std::nullptr_t = nullptr) {}
  basic_json(value_t t) : type_(t) {
    if (t == value_t::object) object_ = std::make_unique<object_t>();
    if (t == value_t::array) array_ = std::make_unique<array_t>();
    if (t == value_t::string) string_ = std::make_unique<string_t>();
  }
  basic_json(bool b) : type_(value_t::boolean), bool_(b) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                          !std::is_same_v<T, char>, int> = 0>
  basic_json(T v) {
    if constexpr (std::is_signed_v<T>) {
      type_ = value_t::number_integer;
      int_ = v;
    } else {
      type_ = value_t::number_unsigned;
      uint_ = v;
    }
  }
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  basic_json(T v) : type_(value_t::number_float), float_(static_cast<double>(v)) {}
  basic_json(const char* s) : basic_json(std::string(s)) {}
  basic_json(std::string_view s) : basic_json(std::string(s)) {}
  basic_json(std::string s) : type_(value_t::string), string_(std::make_unique<string_t>(std::move(s))) {}
  // Any other range (vectors of numbers, strings, values): an array of its elements.
  template <class R, std::enable_if_t<detail::is_range<R>::value &&
                                          !std::is_convertible_v<const R&, std::string_view> &&
                                          !std::is_same_v<R, basic_json> &&
                                          !std::is_same_v<R, object_t>, int> = 0>
  basic_json(const R& range) : basic_json(value_t::array) {
    for (const auto& x : range) array_->emplace_back(x);
  }
  // nlohmann's rule: a list whose every element is a 2-element array starting with a string is
  // an object; anything else an array.
  basic_json(std::initializer_list<basic_json> list) {
    bool is_object = true;
    for (const basic_json& e : list)
      if (!e.is_array() || e.size() != 2 || !(*e.array_)[0].is_string()) is_object = false;
    if (is_object) {
      *this = basic_json(value_t::object);
      for (const basic_json& e : list)
        object_->emplace(*(*e.array_)[0].string_, (*e.array_)[1]);
    } else {
      *this = basic_json(value_t::array);
      array_->assign(list.begin(), list.end());
    }
  }
  basic_json(const basic_json& o) { copy_from(o); }
  basic_json(basic_json&& o) noexcept { move_from(std::move(o)); }
  basic_json& operator=(const basic_json& o) {
    if (this != &o) {
      basic_json copy(o);
      *this = std::move(copy);
    }
    return *this;
  }
  basic_json& operator=(basic_json&& o) noexcept {
    if (this != &o) {
      clear_value();
      move_from(std::move(o));
    }
    return *this;
  }
  ~basic_json() = default;

  static basic_json array() { return basic_json(value_t::array); }
  static basic_json object() { return basic_json(value_t::object); }

  // ---- type ----
  value_t type() const { return type_; }
  bool is_null() const { return type_ == value_t::null; }
  bool is_boolean() const { return type_ == value_t::boolean; }
  bool is_number_integer() const {
    return type_ == value_t::number_integer || type_ == value_t::number_unsigned;
  }
  bool is_number_unsigned() const { return type_ == value_t::number_unsigned; }
  bool is_number_float() const { return type_ == value_t::number_float; }
  bool is_number() const { return is_number_integer() || is_number_float(); }
  bool is_string() const { return type_ == value_t::string; }
  bool is_array() const { return type_ == value_t::array; }
  bool is_object() const { return type_ == value_t::object; }
  bool is_primitive() const { return !is_array() && !is_object(); }
  bool is_structured() const { return is_array() || is_object(); }
  const char* type_name() const {
    switch (type_) {
      case value_t::null: return "null";
      case value_t::object: return "object";
      case value_t::array: return "array";
      case value_t::string: return "string";
      case value_t::boolean: return "boolean";
      case value_t::binary: return "binary";
      case value_t::discarded: return "discarded";
      default: return "number";
    }
  }

  // ---- size and members ----
  size_type size() const {
    if (is_null()) return 0;
    if (is_array()) return array_->size();
    if (is_object()) return object_->size();
    return 1;
  }
  bool empty() const { return size() == 0; }

  // ---- iterators ----
  template <bool Const>
  class iter {
   public:
    using Json = std::conditional_t<Const, const basic_json, basic_json>;
    using ObjIt = std::conditional_t<Const, typename object_t::const_iterator,
                                     typename object_t::iterator>;
    using ArrIt = std::conditional_t<Const, typename array_t::const_iterator,
                                     typename array_t::iterator>;
    using iterator_category = std::forward_iterator_tag;
    using value_type = basic_json;
    using difference_type = std::ptrdiff_t;
    using pointer = Json*;
    using reference = Json&;

    iter() = default;
    template <bool C = Const, std::enable_if_t<C, int> = 0>
    iter(const iter<false>& o) : j_(o.j_), oit_(o.oit_), ait_(o.ait_), prim_(o.prim_) {}

    static iter make(Json* j, bool begin) {
      iter it;
      it.j_ = j;
      if (j->is_object()) it.oit_ = begin ? j->object_->begin() : j->object_->end();
      else if (j->is_array()) it.ait_ = begin ? j->array_->begin() : j->array_->end();
      else it.prim_ = begin && !j->is_null() ? 0 : 1;
      return it;
    }
    reference operator*() const {
      if (j_->is_object()) return oit_->second;
      if (j_->is_array()) return *ait_;
      return *j_;
    }
    pointer operator->() const { return &**this; }
    reference value() const { return **this; }
    const std::string& key() const {
      if (!j_->is_object()) throw exception_key();
      return oit_->first;
    }
    iter& operator++() {
      if (j_->is_object()) ++oit_;
      else if (j_->is_array()) ++ait_;
      else ++prim_;
      return *this;
    }
    iter operator++(int) {
      iter t = *this;
      ++*this;
      return t;
    }
    friend bool operator==(const iter& a, const iter& b) {
      if (a.j_ != b.j_) return false;
      if (a.j_ == nullptr) return true;
      if (a.j_->is_object()) return a.oit_ == b.oit_;
      if (a.j_->is_array()) return a.ait_ == b.ait_;
      return a.prim_ == b.prim_;
    }
    friend bool operator!=(const iter& a, const iter& b) { return !(a == b); }

   private:
    friend class basic_json;
    template <bool>
    friend class iter;
    static json_subset::type_error exception_key() {
      return json_subset::type_error(207, "cannot use key() for non-object iterators");
    }
    Json* j_ = nullptr;
    ObjIt oit_{};
    ArrIt ait_{};
    int prim_ = 1;
  };
  using iterator = iter<false>;
  using const_iterator = iter<true>;

  iterator begin() { return iterator::make(this, true); }
  iterator end() { return iterator::make(this, false); }
  const_iterator begin() const { return const_iterator::make(this, true); }
  const_iterator end() const { return const_iterator::make(this, false); }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }

  iterator find(std::string_view key) {
    if (!is_object()) return end();
    iterator it = end();
    it.oit_ = object_->find(key);
    return it;
  }
  const_iterator find(std::string_view key) const {
    if (!is_object()) return end();
    const_iterator it = end();
    it.oit_ = object_->find(key);
    return it;
  }
  bool contains(std::string_view key) const {
    return is_object() && object_->find(key) != object_->end();
  }

  basic_json& at(std::string_view key) { return const_cast<basic_json&>(std::as_const(*this).at(key)); }
  const basic_json& at(std::string_view key) const {
    if (!is_object())
      throw type_error(304, std::string("cannot use at() with ") + type_name());
    auto it = object_->find(key);
    if (it == object_->end()) throw out_of_range(403, "key '" + std::string(key) + "' not found");
    return it->second;
  }
  basic_json& at(size_type i) { return const_cast<basic_json&>(std::as_const(*this).at(i)); }
  const basic_json& at(size_type i) const {
    if (!is_array()) throw type_error(304, std::string("cannot use at() with ") + type_name());
    if (i >= array_->size())
      throw out_of_range(401, "array index " + std::to_string(i) + " is out of range");
    return (*array_)[i];
  }

  // Non-const: a null becomes an object (an array), a missing key is inserted as null.
  basic_json& operator[](const std::string& key) {
    if (is_null()) *this = object();
    if (!is_object())
      throw type_error(305, std::string("cannot use operator[] with a string argument with ") +
                                type_name());
    return object_->emplace(key, nullptr).first->second;
  }
  template <class T>
  basic_json& operator[](T* key) {
    return (*this)[std::string(key)];
  }
  // Const: a missing key (or a value that is no object) reads as null.
  const basic_json& operator[](std::string_view key) const {
    static const basic_json kNull;
    if (!is_object()) return kNull;
    auto it = object_->find(key);
    return it == object_->end() ? kNull : it->second;
  }
  template <class T>
  const basic_json& operator[](T* key) const {
    return (*this)[std::string_view(key)];
  }
  basic_json& operator[](size_type i) {
    if (is_null()) *this = array();
    if (!is_array())
      throw type_error(305, std::string("cannot use operator[] with a numeric argument with ") +
                                type_name());
    if (i >= array_->size()) array_->resize(i + 1);
    return (*array_)[i];
  }
  const basic_json& operator[](size_type i) const {
    static const basic_json kNull;
    if (!is_array() || i >= array_->size()) return kNull;
    return (*array_)[i];
  }

  template <class T>
  T value(std::string_view key, const T& fallback) const {
    auto it = is_object() ? object_->find(key) : typename object_t::const_iterator{};
    if (!is_object() || it == object_->end()) return fallback;
    return it->second.template get<T>();
  }
  std::string value(std::string_view key, const char* fallback) const {
    return value<std::string>(key, std::string(fallback));
  }

  basic_json& back() { return is_array() ? array_->back() : *this; }
  const basic_json& back() const { return is_array() ? array_->back() : *this; }

  void push_back(basic_json v) {
    if (is_null()) *this = array();
    if (!is_array()) throw type_error(308, std::string("cannot use push_back() with ") + type_name());
    array_->push_back(std::move(v));
  }
  template <class... Args>
  basic_json& emplace_back(Args&&... args) {
    if (is_null()) *this = array();
    if (!is_array())
      throw type_error(311, std::string("cannot use emplace_back() with ") + type_name());
    return array_->emplace_back(std::forward<Args>(args)...);
  }
  // Every member of `o` (an object) set here.
  void update(const basic_json& o) {
    if (is_null()) *this = object();
    if (!is_object() || !o.is_object())
      throw type_error(312, std::string("cannot use update() with ") + type_name());
    for (const auto& [k, v] : *o.object_) (*this)[k] = v;
  }

  // The members, for structured bindings: `for (const auto& [key, value] : j.items())`.
  const object_t& items() const {
    static const object_t kEmpty;
    return is_object() ? *object_ : kEmpty;
  }

  // ---- values ----
  template <class T>
  T get() const {
    if constexpr (std::is_same_v<T, basic_json>) {
      return *this;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!is_boolean()) throw type_error(302, std::string("type must be boolean, but is ") + type_name());
      return bool_;
    } else if constexpr (std::is_arithmetic_v<T>) {
      switch (type_) {
        case value_t::number_integer: return static_cast<T>(int_);
        case value_t::number_unsigned: return static_cast<T>(uint_);
        case value_t::number_float: return static_cast<T>(float_);
        default: throw type_error(302, std::string("type must be number, but is ") + type_name());
      }
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!is_string()) throw type_error(302, std::string("type must be string, but is ") + type_name());
      return *string_;
    } else {
      static_assert(detail::is_range<T>::value, "get<T>: a type the JSON subset does not convert");
      if (!is_array()) throw type_error(302, std::string("type must be array, but is ") + type_name());
      T out;
      for (const basic_json& e : *array_)
        out.push_back(e.template get<typename T::value_type>());
      return out;
    }
  }
  template <class Ref>
  Ref get_ref() const {
    using T = std::remove_cv_t<std::remove_reference_t<Ref>>;
    if constexpr (std::is_same_v<T, string_t>) {
      if (!is_string()) throw type_error(303, std::string("incompatible ReferenceType for get_ref, actual type is ") + type_name());
      return *string_;
    } else if constexpr (std::is_same_v<T, object_t>) {
      if (!is_object()) throw type_error(303, std::string("incompatible ReferenceType for get_ref, actual type is ") + type_name());
      return *object_;
    } else {
      static_assert(std::is_same_v<T, array_t>, "get_ref<T>: string_t, object_t or array_t");
      if (!is_array()) throw type_error(303, std::string("incompatible ReferenceType for get_ref, actual type is ") + type_name());
      return *array_;
    }
  }
  template <class Ref>
  Ref get_ref() {
    return const_cast<Ref>(std::as_const(*this).template get_ref<const std::remove_reference_t<Ref>&>());
  }

  friend bool operator==(const basic_json& a, const basic_json& b) {
    if (a.is_number() && b.is_number() && a.type_ != b.type_) {
      if (a.is_number_float() || b.is_number_float())
        return a.template get<double>() == b.template get<double>();
      const basic_json& s = a.type_ == value_t::number_integer ? a : b;
      const basic_json& u = a.type_ == value_t::number_integer ? b : a;
      return s.int_ >= 0 && static_cast<uint64_t>(s.int_) == u.uint_;
    }
    if (a.type_ != b.type_) return false;
    switch (a.type_) {
      case value_t::null: return true;
      case value_t::boolean: return a.bool_ == b.bool_;
      case value_t::number_integer: return a.int_ == b.int_;
      case value_t::number_unsigned: return a.uint_ == b.uint_;
      case value_t::number_float: return a.float_ == b.float_;
      case value_t::string: return *a.string_ == *b.string_;
      case value_t::array: return *a.array_ == *b.array_;
      case value_t::object: {
        if (a.object_->size() != b.object_->size()) return false;
        for (const auto& [k, v] : *a.object_) {
          auto it = b.object_->find(k);
          if (it == b.object_->end() || !(it->second == v)) return false;
        }
        return true;
      }
      default: return false;
    }
  }
  friend bool operator!=(const basic_json& a, const basic_json& b) { return !(a == b); }

  // ---- writing ----
  std::string dump(int indent = -1, char indent_char = ' ', bool ensure_ascii = false,
                   error_handler_t handler = error_handler_t::strict) const {
    std::string out;
    write(out, indent, indent_char, ensure_ascii, handler, 0);
    return out;
  }

  // ---- reading (SAX) ----
  template <class It, class Sax>
  static bool sax_parse(It first, It last, Sax* sax, int /*format*/ = 0, bool strict = true,
                        bool /*ignore_comments*/ = false) {
    const char* b = &*first;
    return detail::Parser<Sax>(b, b + std::distance(first, last), sax, strict).run();
  }
  template <class Sax>
  static bool sax_parse(std::string_view text, Sax* sax, int format = 0, bool strict = true,
                        bool ignore_comments = false) {
    return sax_parse(text.data(), text.data() + text.size(), sax, format, strict, ignore_comments);
  }

 private:
  void clear_value() {
    object_.reset();
    array_.reset();
    string_.reset();
    type_ = value_t::null;
  }
  void copy_from(const basic_json& o) {
    type_ = o.type_;
    bool_ = o.bool_;
    int_ = o.int_;
    uint_ = o.uint_;
    float_ = o.float_;
    if (o.object_) object_ = std::make_unique<object_t>(*o.object_);
    if (o.array_) array_ = std::make_unique<array_t>(*o.array_);
    if (o.string_) string_ = std::make_unique<string_t>(*o.string_);
  }
  void move_from(basic_json&& o) {
    type_ = o.type_;
    bool_ = o.bool_;
    int_ = o.int_;
    uint_ = o.uint_;
    float_ = o.float_;
    object_ = std::move(o.object_);
    array_ = std::move(o.array_);
    string_ = std::move(o.string_);
    o.type_ = value_t::null;
  }

  void write(std::string& out, int indent, char indent_char, bool ensure_ascii,
             error_handler_t handler, int level) const {
    const bool pretty = indent >= 0;
    const auto newline = [&](int l) {
      if (!pretty) return;
      out += '\n';
      out.append(static_cast<size_t>(indent) * l, indent_char);
    };
    switch (type_) {
      case value_t::null: out += "null"; return;
      case value_t::boolean: out += bool_ ? "true" : "false"; return;
      case value_t::number_integer: out += std::to_string(int_); return;
      case value_t::number_unsigned: out += std::to_string(uint_); return;
      case value_t::number_float: detail::write_double(out, float_); return;
      case value_t::string: detail::write_string(out, *string_, ensure_ascii, handler); return;
      case value_t::array: {
        if (array_->empty()) {
          out += "[]";
          return;
        }
        out += '[';
        bool first = true;
        for (const basic_json& e : *array_) {
          if (!first) out += ',';
          first = false;
          newline(level + 1);
          e.write(out, indent, indent_char, ensure_ascii, handler, level + 1);
        }
        newline(level);
        out += ']';
        return;
      }
      case value_t::object: {
        if (object_->empty()) {
          out += "{}";
          return;
        }
        out += '{';
        bool first = true;
        for (const auto& [k, v] : *object_) {
          if (!first) out += ',';
          first = false;
          newline(level + 1);
          detail::write_string(out, k, ensure_ascii, handler);
          out += pretty ? ": " : ":";
          v.write(out, indent, indent_char, ensure_ascii, handler, level + 1);
        }
        newline(level);
        out += '}';
        return;
      }
      default: out += "null"; return;
    }
  }

  value_t type_ = value_t::null;
  bool bool_ = false;
  int64_t int_ = 0;
  uint64_t uint_ = 0;
  double float_ = 0.0;
  std::unique_ptr<object_t> object_;
  std::unique_ptr<array_t> array_;
  std::unique_ptr<string_t> string_;
};

using json = basic_json<false>;
using ordered_json = basic_json<true>;

}  // namespace ltm::json_subset
