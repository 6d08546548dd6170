// The part of Boost.Program_options that ltm's command lines use (launcher/cli_parse.h,
// worker_options.cpp, bench_main.cpp), for the GPU-only build (-DLTM_GPU_ONLY=ON,
// cmake/gpu_only.cmake), which has no Boost; every other build uses Boost itself.
//
// The code lives in ltm::fallback::program_options; common/fallback/include/boost/
// program_options.hpp makes boost::program_options an alias of it. Supported, with Boost's
// meaning: options_description with captions and add(), add_options()("name[,c]", semantic,
// "help") and ("name", "help"), value<T>() / value(&x) with default_value() and composing(),
// bool_switch(&b), command_line_parser(argc, argv).options(d).run(), store, notify,
// variables_map::count / operator[] / as<T>(), printing a description. Accepted on the command
// line: --name VALUE, --name=VALUE, -c VALUE, -cVALUE, switches without a value; a value is read
// as Boost's lexical_cast reads it (the whole text must be consumed). Not supported: positional
// options, option prefixes (Boost's allow_guessing), config files, environment variables.
// Errors are std::exception-derived `error`s with Boost's wording.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace ltm::fallback::program_options {

class error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// What a stored option holds: the parsed texts, and a typed copy for as<T>().
class variable_value {
 public:
  variable_value() = default;
  variable_value(std::shared_ptr<void> value, bool defaulted)
      : value_(std::move(value)), defaulted_(defaulted) {}
  template <class T>
  const T& as() const {
    if (!value_) throw error("option has no value");
    return *static_cast<const T*>(value_.get());
  }
  bool empty() const { return !value_; }
  bool defaulted() const { return defaulted_; }

 private:
  std::shared_ptr<void> value_;
  bool defaulted_ = false;
};

class value_semantic {
 public:
  virtual ~value_semantic() = default;
  virtual bool takes_value() const = 0;
  virtual bool repeatable() const = 0;
  // Parses `texts` (each occurrence's text) into a new typed value; throws `error`.
  virtual std::shared_ptr<void> parse(const std::string& option,
                                      const std::vector<std::string>& texts) const = 0;
  virtual std::shared_ptr<void> default_value_or_null() const = 0;
  virtual std::string default_text() const = 0;
  virtual void notify(const variable_value& v) const = 0;
};

namespace detail {

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

template <class T>
T read_one(const std::string& option, const std::string& text) {
  if constexpr (std::is_same_v<T, std::string>) {
    return text;
  } else {
    std::istringstream in(text);
    T v{};
    in >> v;
    if (text.empty() || in.fail() || in.peek() != std::char_traits<char>::eof())
      throw error("the argument ('" + text + "') for option '--" + option + "' is invalid");
    return v;
  }
}

template <class T>
std::string show(const T& v) {
  if constexpr (is_vector<T>::value) {
    return "";
  } else {
    std::ostringstream out;
    out << v;
    return out.str();
  }
}

}  // namespace detail

template <class T>
class typed_value final : public value_semantic {
 public:
  explicit typed_value(T* store, bool is_switch = false) : store_(store), switch_(is_switch) {}
  typed_value* default_value(const T& v) {
    default_ = std::make_shared<T>(v);
    return this;
  }
  template <class U, class = std::enable_if_t<!std::is_same_v<std::decay_t<U>, T> &&
                                              std::is_constructible_v<T, U>>>
  typed_value* default_value(const U& v) {
    return default_value(T(v));
  }
  typed_value* composing() {
    composing_ = true;
    return this;
  }
  typed_value* multitoken() { return this; }

  bool takes_value() const override { return !switch_; }
  bool repeatable() const override { return composing_ || detail::is_vector<T>::value; }
  std::shared_ptr<void> parse(const std::string& option,
                              const std::vector<std::string>& texts) const override {
    if constexpr (std::is_same_v<T, bool>) {
      if (switch_) return std::make_shared<bool>(true);
    }
    if constexpr (detail::is_vector<T>::value) {
      auto v = std::make_shared<T>();
      for (const std::string& t : texts)
        v->push_back(detail::read_one<typename T::value_type>(option, t));
      return v;
    } else {
      return std::make_shared<T>(detail::read_one<T>(option, texts.back()));
    }
  }
  std::shared_ptr<void> default_value_or_null() const override {
    if (switch_) return std::make_shared<T>();
    return default_;
  }
  std::string default_text() const override {
    return default_ && !switch_ ? detail::show(*default_) : std::string();
  }
  void notify(const variable_value& v) const override {
    if (store_ != nullptr && !v.empty()) *store_ = v.as<T>();
  }

 private:
  T* store_;
  bool switch_;
  bool composing_ = false;
  std::shared_ptr<T> default_;
};

template <class T>
typed_value<T>* value(T* store = nullptr) {
  return new typed_value<T>(store);
}
inline typed_value<bool>* bool_switch(bool* store = nullptr) {
  return new typed_value<bool>(store, true);
}

struct option_description {
  std::string long_name;
  char short_name = 0;
  std::shared_ptr<const value_semantic> semantic;  // null: a flag without a value ("help")
  std::string help;
};

class options_description;

class options_description_easy_init {
 public:
  explicit options_description_easy_init(options_description* owner) : owner_(owner) {}
  options_description_easy_init& operator()(const char* name, const char* help);
  options_description_easy_init& operator()(const char* name, const value_semantic* semantic,
                                           const char* help);

 private:
  options_description* owner_;
};

class options_description {
 public:
  explicit options_description(std::string caption = "") : caption_(std::move(caption)) {}
  options_description_easy_init add_options() { return options_description_easy_init(this); }
  options_description& add(const options_description& group) {
    groups_.push_back(group);
    return *this;
  }
  void add_option(const char* name, const value_semantic* semantic, const char* help) {
    option_description d;
    d.long_name = name;
    if (const size_t comma = d.long_name.find(','); comma != std::string::npos) {
      d.short_name = comma + 1 < d.long_name.size() ? d.long_name[comma + 1] : 0;
      d.long_name.resize(comma);
    }
    d.semantic.reset(semantic);
    d.help = help;
    options_.push_back(std::move(d));
  }
  // Every option of this description and the groups added to it.
  void collect(std::vector<const option_description*>* out) const {
    for (const option_description& d : options_) out->push_back(&d);
    for (const options_description& g : groups_) g.collect(out);
  }
  void print(std::ostream& os) const {
    if (!caption_.empty()) os << caption_ << ":\n";
    for (const option_description& d : options_) {
      std::string left = "  ";
      left += d.short_name != 0 ? std::string("-") + d.short_name + " [ --" + d.long_name + " ]"
                                : "--" + d.long_name;
      if (d.semantic && d.semantic->takes_value()) {
        left += " arg";
        if (const std::string def = d.semantic->default_text(); !def.empty())
          left += " (=" + def + ")";
      }
      os << left;
      if (left.size() < 40) os << std::string(40 - left.size(), ' ');
      else os << "\n" << std::string(40, ' ');
      os << d.help << "\n";
    }
    for (const options_description& g : groups_) {
      os << "\n";
      g.print(os);
    }
  }

 private:
  std::string caption_;
  std::vector<option_description> options_;
  std::vector<options_description> groups_;  // copies share the options' semantics
};

inline std::ostream& operator<<(std::ostream& os, const options_description& d) {
  d.print(os);
  return os;
}

inline options_description_easy_init& options_description_easy_init::operator()(
    const char* name, const char* help) {
  owner_->add_option(name, nullptr, help);
  return *this;
}
inline options_description_easy_init& options_description_easy_init::operator()(
    const char* name, const value_semantic* semantic, const char* help) {
  owner_->add_option(name, semantic, help);
  return *this;
}

class variables_map : public std::map<std::string, variable_value> {
 public:
  const variable_value& operator[](const std::string& name) const {
    static const variable_value kEmpty;
    const auto it = find(name);
    return it == end() ? kEmpty : it->second;
  }
  // Filled by store(): the semantic of each stored option, for notify().
  std::map<std::string, std::shared_ptr<const value_semantic>> semantics;
};

// The command line, matched against a description.
struct parsed_options {
  std::vector<const option_description*> all;
  std::map<std::string, std::vector<std::string>> texts;  // long name -> each occurrence's text
};

class command_line_parser {
 public:
  command_line_parser(int argc, char** argv) : args_(argv + (argc > 0 ? 1 : 0), argv + argc) {}
  command_line_parser& options(const options_description& d) {
    desc_ = &d;
    return *this;
  }
  parsed_options run() const {
    parsed_options p;
    if (desc_ != nullptr) desc_->collect(&p.all);
    for (size_t i = 0; i < args_.size(); ++i) {
      const std::string& arg = args_[i];
      const option_description* d = nullptr;
      std::string inline_value;
      bool has_inline = false;
      if (arg.size() > 2 && arg.compare(0, 2, "--") == 0) {
        std::string name = arg.substr(2);
        if (const size_t eq = name.find('='); eq != std::string::npos) {
          inline_value = name.substr(eq + 1);
          has_inline = true;
          name.resize(eq);
        }
        for (const option_description* o : p.all)
          if (o->long_name == name) d = o;
      } else if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') {
        for (const option_description* o : p.all)
          if (o->short_name == arg[1]) d = o;
        if (arg.size() > 2) {
          inline_value = arg.substr(2);
          has_inline = true;
        }
      } else {
        throw error("unrecognised option '" + arg + "' (no positional arguments are taken)");
      }
      if (d == nullptr) throw error("unrecognised option '" + arg + "'");
      std::vector<std::string>& texts = p.texts[d->long_name];
      const bool takes = d->semantic && d->semantic->takes_value();
      if (!takes) {
        if (has_inline)
          throw error("option '--" + d->long_name + "' does not take any arguments");
        texts.emplace_back();
      } else if (has_inline) {
        texts.push_back(inline_value);
      } else if (i + 1 < args_.size()) {
        texts.push_back(args_[++i]);
      } else {
        throw error("the required argument for option '--" + d->long_name + "' is missing");
      }
      if (texts.size() > 1 && !(d->semantic && d->semantic->repeatable()))
        throw error("option '--" + d->long_name + "' cannot be specified more than once");
    }
    return p;
  }

 private:
  std::vector<std::string> args_;
  const options_description* desc_ = nullptr;
};

inline void store(const parsed_options& p, variables_map& vm) {
  for (const option_description* d : p.all) {
    const auto it = p.texts.find(d->long_name);
    if (d->semantic) vm.semantics[d->long_name] = d->semantic;
    if (it != p.texts.end()) {
      std::shared_ptr<void> v =
          d->semantic ? d->semantic->parse(d->long_name, it->second) : std::make_shared<bool>(true);
      vm.insert_or_assign(d->long_name, variable_value(std::move(v), false));
    } else if (d->semantic) {
      if (std::shared_ptr<void> def = d->semantic->default_value_or_null())
        vm.emplace(d->long_name, variable_value(std::move(def), true));
    }
  }
}

inline void notify(variables_map& vm) {
  for (const auto& [name, semantic] : vm.semantics) {
    const auto it = vm.find(name);
    if (it != vm.end()) semantic->notify(it->second);
  }
}

}  // namespace ltm::fallback::program_options

namespace boost {
namespace program_options = ::ltm::fallback::program_options;
}  // namespace boost
