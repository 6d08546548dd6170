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
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace ltm::json_subset {

enum class value_t : uint8_t {
  null, object, array, string, boolean, number_integer, number_unsigned, number_float, binary,
  discarded
};
enum class error_handler_t { strict, replace, ignore };

class exception : public std::exception {
 public:
  const int id;
  const char* what() const noexcept override { return message_.c_str(); }

 protected:
  exception(int id_, const std::string& kind, const std::string& what)
      : id(id_), message_("[json." + kind + "." + std::to_string(id_) + "] " + what) {}

 private:
  std::string message_;
};
class parse_error : public exception {
 public:
  parse_error(int id_, const std::string& what) : exception(id_, "parse_error", what) {}
};
class type_error : public exception {
 public:
  type_error(int id_, const std::string& what) : exception(id_, "type_error", what) {}
};
class out_of_range : public exception {
 public:
  out_of_range(int id_, const std::string& what) : exception(id_, "out_of_range", what) {}
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
    return Parser<Sax>(b, b + std::distance(first, last), sax, strict).run();
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

  // The shortest decimal digits that read back as v, laid out as nlohmann lays them out: plain
  // decimals while the point falls within 15 digits of the first (or 4 zeros after "0."), with
  // ".0" on whole numbers; else d.ddde+XX.
  static void write_double(std::string& out, double v) {
    if (!std::isfinite(v)) {
      out += "null";
      return;
    }
    if (v == 0.0) {
      out += std::signbit(v) ? "-0.0" : "0.0";
      return;
    }
    char buf[40];
    for (int precision = 1; precision <= 17; ++precision) {
      std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, v);
      if (std::strtod(buf, nullptr) == v) break;
    }
    std::string text(buf);
    if (text[0] == '-') {
      out += '-';
      text.erase(0, 1);
    }
    const size_t e = text.find('e');
    const int exponent = std::atoi(text.c_str() + e + 1);
    std::string digits = text.substr(0, e);
    if (digits.size() > 1) digits.erase(1, 1);  // the point
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    const int len = static_cast<int>(digits.size()), n = exponent + 1;
    if (len <= n && n <= 15) {
      out += digits + std::string(static_cast<size_t>(n - len), '0') + ".0";
    } else if (0 < n && n <= 15) {
      out += digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
    } else if (-4 < n && n <= 0) {
      out += "0." + std::string(static_cast<size_t>(-n), '0') + digits;
    } else {
      out += digits.substr(0, 1);
      if (len > 1) out += "." + digits.substr(1);
      std::snprintf(buf, sizeof(buf), "e%c%02d", n - 1 < 0 ? '-' : '+', std::abs(n - 1));
      out += buf;
    }
  }

  // The length of the valid UTF-8 sequence at s[i], or 0.
  static size_t utf8_length(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return 0;
    }
    if (i + n > s.size()) return 0;
    if (b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (size_t k = 2; k < n; ++k)
      if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
    return n;
  }

  static void write_string(std::string& out, std::string_view s, bool ensure_ascii,
                           error_handler_t handler) {
    out += '"';
    for (size_t i = 0; i < s.size();) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      char buf[16];
      switch (c) {
        case '"': out += "\\\""; ++i; continue;
        case '\\': out += "\\\\"; ++i; continue;
        case '\b': out += "\\b"; ++i; continue;
        case '\f': out += "\\f"; ++i; continue;
        case '\n': out += "\\n"; ++i; continue;
        case '\r': out += "\\r"; ++i; continue;
        case '\t': out += "\\t"; ++i; continue;
        default: break;
      }
      if (c < 0x20 || (c == 0x7F && ensure_ascii)) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
        ++i;
        continue;
      }
      const size_t n = utf8_length(s, i);
      if (n == 0) {
        if (handler == error_handler_t::strict) {
          std::snprintf(buf, sizeof(buf), "%02X", c);
          throw type_error(316, std::string("invalid UTF-8 byte at index ") + std::to_string(i) +
                                    ": 0x" + buf);
        }
        if (handler == error_handler_t::replace) out += ensure_ascii ? "\\ufffd" : "\xEF\xBF\xBD";
        ++i;
        continue;
      }
      if (!ensure_ascii || n == 1) {
        out.append(s.data() + i, n);
      } else {
        uint32_t cp = static_cast<unsigned char>(s[i]) & (0xFF >> (n + 1));
        for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
        if (cp >= 0x10000) {
          cp -= 0x10000;
          std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else {
          std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
        }
        out += buf;
      }
      i += n;
    }
    out += '"';
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
      case value_t::number_float: write_double(out, float_); return;
      case value_t::string: write_string(out, *string_, ensure_ascii, handler); return;
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
          write_string(out, k, ensure_ascii, handler);
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

  // A recursive-descent reader calling nlohmann's SAX callbacks. Depth is the handler's to bound
  // (json_parse.h refuses nesting deeper than 64 at start_object/start_array, so the recursion
  // here is bounded by it; a handler that never refuses nests as deep as the text does).
  template <class Sax>
  class Parser {
   public:
    Parser(const char* b, const char* e, Sax* sax, bool strict) : p_(b), b_(b), e_(e), sax_(sax), strict_(strict) {}

    bool run() {
      skip_ws();
      if (!value()) return false;
      skip_ws();
      if (strict_ && p_ != e_) return error(101, token_at(p_, 1), "expected end of input");
      return true;
    }

   private:
    void skip_ws() {
      while (p_ != e_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
    }
    static std::string token_at(const char* p, size_t n) { return std::string(p, n); }
    bool error(int id, const std::string& last_token, const std::string& why) {
      const size_t at = static_cast<size_t>(p_ - b_);
      std::string what = "parse error at byte " + std::to_string(at) + ": " + why;
      if (!last_token.empty()) what += "; last read: '" + last_token + "'";
      if (id == 406) {
        const out_of_range ex(406, what);
        return sax_->parse_error(at, last_token, ex);
      }
      const parse_error ex(id, what);
      return sax_->parse_error(at, last_token, ex);
    }
    bool end_of_input() { return error(101, "", "unexpected end of input"); }

    bool literal(const char* word, size_t n) {
      if (static_cast<size_t>(e_ - p_) < n || std::string_view(p_, n) != std::string_view(word, n)) {
        size_t k = 0;
        while (k < n && p_ + k != e_ && p_[k] == word[k]) ++k;
        const std::string got = token_at(p_, p_ + k == e_ ? k : k + 1);
        return error(101, got, "invalid literal");
      }
      p_ += n;
      return true;
    }

    bool value() {
      if (p_ == e_) return end_of_input();
      switch (*p_) {
        case '{': return object();
        case '[': return array();
        case '"': {
          std::string s;
          if (!string(&s)) return false;
          return sax_->string(s);
        }
        case 't': return literal("true", 4) && sax_->boolean(true);
        case 'f': return literal("false", 5) && sax_->boolean(false);
        case 'n': return literal("null", 4) && sax_->null();
        default:
          if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number();
          return error(101, token_at(p_, 1), "unexpected character, expected a value");
      }
    }

    bool object() {
      ++p_;
      if (!sax_->start_object(static_cast<size_t>(-1))) return false;
      skip_ws();
      if (p_ != e_ && *p_ == '}') {
        ++p_;
        return sax_->end_object();
      }
      for (;;) {
        skip_ws();
        if (p_ == e_) return end_of_input();
        if (*p_ != '"') return error(101, token_at(p_, 1), "expected a string key");
        std::string key;
        if (!string(&key)) return false;
        if (!sax_->key(key)) return false;
        skip_ws();
        if (p_ == e_) return end_of_input();
        if (*p_ != ':') return error(101, token_at(p_, 1), "expected ':'");
        ++p_;
        skip_ws();
        if (!value()) return false;
        skip_ws();
        if (p_ == e_) return end_of_input();
        if (*p_ == ',') {
          ++p_;
          continue;
        }
        if (*p_ == '}') {
          ++p_;
          return sax_->end_object();
        }
        return error(101, token_at(p_, 1), "expected ',' or '}'");
      }
    }

    bool array() {
      ++p_;
      if (!sax_->start_array(static_cast<size_t>(-1))) return false;
      skip_ws();
      if (p_ != e_ && *p_ == ']') {
        ++p_;
        return sax_->end_array();
      }
      for (;;) {
        skip_ws();
        if (!value()) return false;
        skip_ws();
        if (p_ == e_) return end_of_input();
        if (*p_ == ',') {
          ++p_;
          continue;
        }
        if (*p_ == ']') {
          ++p_;
          return sax_->end_array();
        }
        return error(101, token_at(p_, 1), "expected ',' or ']'");
      }
    }

    bool hex4(uint32_t* out) {
      if (e_ - p_ < 4) return error(101, token_at(p_, static_cast<size_t>(e_ - p_)), "\\u needs 4 hex digits");
      uint32_t v = 0;
      for (int k = 0; k < 4; ++k) {
        const char c = p_[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
        else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
        else return error(101, token_at(p_, k + 1), "\\u needs 4 hex digits");
      }
      p_ += 4;
      *out = v;
      return true;
    }

    static void append_utf8(std::string* s, uint32_t cp) {
      if (cp < 0x80) {
        *s += static_cast<char>(cp);
      } else if (cp < 0x800) {
        *s += static_cast<char>(0xC0 | (cp >> 6));
        *s += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        *s += static_cast<char>(0xE0 | (cp >> 12));
        *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *s += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        *s += static_cast<char>(0xF0 | (cp >> 18));
        *s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *s += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }

    bool string(std::string* out) {
      const char* start = p_;
      ++p_;
      for (;;) {
        if (p_ == e_) return error(101, token_at(start, static_cast<size_t>(p_ - start)), "missing closing quote");
        const unsigned char c = static_cast<unsigned char>(*p_);
        if (c == '"') {
          ++p_;
          return true;
        }
        if (c < 0x20)
          return error(101, token_at(start, static_cast<size_t>(p_ - start) + 1),
                       "control character in a string must be escaped");
        if (c == '\\') {
          ++p_;
          if (p_ == e_) return error(101, token_at(start, static_cast<size_t>(p_ - start)), "missing closing quote");
          const char x = *p_++;
          switch (x) {
            case '"': *out += '"'; break;
            case '\\': *out += '\\'; break;
            case '/': *out += '/'; break;
            case 'b': *out += '\b'; break;
            case 'f': *out += '\f'; break;
            case 'n': *out += '\n'; break;
            case 'r': *out += '\r'; break;
            case 't': *out += '\t'; break;
            case 'u': {
              uint32_t cp;
              if (!hex4(&cp)) return false;
              if (cp >= 0xDC00 && cp <= 0xDFFF)
                return error(101, token_at(start, static_cast<size_t>(p_ - start)), "lone low surrogate");
              if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (e_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u')
                  return error(101, token_at(start, static_cast<size_t>(p_ - start)), "high surrogate without a low one");
                p_ += 2;
                if (!hex4(&lo)) return false;
                if (lo < 0xDC00 || lo > 0xDFFF)
                  return error(101, token_at(start, static_cast<size_t>(p_ - start)), "high surrogate without a low one");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              }
              append_utf8(out, cp);
              break;
            }
            default:
              return error(101, token_at(start, static_cast<size_t>(p_ - start)), "invalid escape");
          }
          continue;
        }
        const size_t n = utf8_length(std::string_view(p_, static_cast<size_t>(e_ - p_)), 0);
        if (n == 0) return error(101, token_at(start, static_cast<size_t>(p_ - start) + 1), "invalid UTF-8");
        out->append(p_, n);
        p_ += n;
      }
    }

    bool number() {
      const char* start = p_;
      const auto digit = [&] { return p_ != e_ && *p_ >= '0' && *p_ <= '9'; };
      const auto bad = [&] {
        return error(101, token_at(start, static_cast<size_t>(p_ - start) + (p_ != e_)), "invalid number");
      };
      bool negative = false, integer = true;
      if (*p_ == '-') {
        negative = true;
        ++p_;
      }
      if (!digit()) return bad();
      if (*p_ == '0') {
        ++p_;
      } else {
        while (digit()) ++p_;
      }
      if (p_ != e_ && *p_ == '.') {
        integer = false;
        ++p_;
        if (!digit()) return bad();
        while (digit()) ++p_;
      }
      if (p_ != e_ && (*p_ == 'e' || *p_ == 'E')) {
        integer = false;
        ++p_;
        if (p_ != e_ && (*p_ == '+' || *p_ == '-')) ++p_;
        if (!digit()) return bad();
        while (digit()) ++p_;
      }
      const std::string text(start, p_);
      if (integer) {
        errno = 0;
        char* end = nullptr;
        if (negative) {
          const long long v = std::strtoll(text.c_str(), &end, 10);
          if (errno == 0) return sax_->number_integer(static_cast<int64_t>(v));
        } else {
          const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
          if (errno == 0) return sax_->number_unsigned(static_cast<uint64_t>(v));
        }
      }
      const double d = std::strtod(text.c_str(), nullptr);
      if (!std::isfinite(d)) return error(406, text, "number overflow parsing '" + text + "'");
      return sax_->number_float(d, text);
    }

    const char* p_;
    const char* b_;
    const char* e_;
    Sax* sax_;
    bool strict_;
  };

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
