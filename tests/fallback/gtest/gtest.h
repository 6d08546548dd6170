// The part of GoogleTest that ltm's gpu tests use, for the GPU-only build (-DLTM_GPU_ONLY=ON,
// cmake/gpu_only.cmake) on a machine without GoogleTest (scripts/gpu_check's: no Debian -dev
// packages). Where GoogleTest is installed, that build and every other use it instead.
//
// Supported, with GoogleTest's meaning: TEST, TEST_F, TEST_P with INSTANTIATE_TEST_SUITE_P
// (Values, ValuesIn, Bool, Combine, a name generator taking TestParamInfo), fixtures with SetUp /
// TearDown, EXPECT_ and ASSERT_ EQ, NE, LT, LE, GT, GE, TRUE, FALSE, NEAR, FLOAT_EQ, DOUBLE_EQ,
// STREQ (each takes `<< message`), GTEST_SKIP, SCOPED_TRACE, EXPECT_EXIT / EXPECT_DEATH /
// ASSERT_EXIT / ASSERT_DEATH (always the "threadsafe" style: the binary runs again with the one
// test and the one statement, so a process holding a CUDA context is never forked),
// ExitedWithCode, KilledBySignal, --gtest_filter (':'-separated patterns with * and ?, '-' before
// negative ones), --gtest_list_tests. The output has GoogleTest's line shapes ("[ RUN      ]",
// "[       OK ]", "[  SKIPPED ]", "[  FAILED  ]", and "[  PASSED  ] N tests." at the end, which
// scripts/gpu_check reads). The runner is tests/fallback/gtest_subset.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace testing {

class Message {
 public:
  template <class T>
  Message& operator<<(const T& v) {
    s_ << v;
    return *this;
  }
  std::string str() const { return s_.str(); }

 private:
  std::ostringstream s_;
};

class Test {
 public:
  virtual ~Test() = default;
  virtual void SetUp() {}
  virtual void TearDown() {}
  virtual void TestBody() = 0;
  static void SetUpTestSuite() {}
  static void TearDownTestSuite() {}
};

namespace internal {

// The parameter of the TEST_P now running (set by the runner).
inline const void*& current_param() {
  static const void* p = nullptr;
  return p;
}

struct TestEntry {
  std::string suite, name;
  std::function<Test*()> make;
  std::shared_ptr<void> param;  // keeps a TEST_P's parameter alive
};
std::vector<TestEntry>& registry();
// TEST_P patterns and instantiations are matched when the tests run (any order of definition).
struct ParamPattern {
  std::string fixture, name;
  std::function<Test*()> make;
};
std::vector<ParamPattern>& param_patterns();
struct ParamInstantiation {
  std::string prefix, fixture;
  // Appends one entry per parameter for each pattern of the fixture.
  std::function<void(const std::vector<ParamPattern>&, std::vector<TestEntry>*)> expand;
};
std::vector<ParamInstantiation>& param_instantiations();

inline int register_test(const char* suite, const char* name, std::function<Test*()> make) {
  registry().push_back({suite, name, std::move(make), nullptr});
  return 0;
}
inline int register_pattern(const char* fixture, const char* name, std::function<Test*()> make) {
  param_patterns().push_back({fixture, name, std::move(make)});
  return 0;
}

// Failure reporting: records the failure of the running test and prints it.
void report(const char* file, int line, const std::string& what, const std::string& message,
            bool fatal);
void mark_skipped(const std::string& message);
void push_trace(const char* file, int line, const std::string& message);
void pop_trace();
void set_flag(const char* name, const char* value);

struct Result {
  bool ok;
  std::string what;
  explicit operator bool() const { return ok; }
};

template <class T, class = void>
struct printable : std::false_type {};
template <class T>
struct printable<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const T&>())>>
    : std::true_type {};
template <class T, class = void>
struct iterable : std::false_type {};
template <class T>
struct iterable<T, std::void_t<decltype(std::begin(std::declval<const T&>()))>> : std::true_type {};

template <class T>
std::string show(const T& v) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, std::nullptr_t>) {
    s << "nullptr";
  } else if constexpr (std::is_same_v<T, bool>) {
    s << (v ? "true" : "false");
  } else if constexpr (std::is_enum_v<T> && !printable<T>::value) {
    s << static_cast<long long>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    s.precision(9);
    s << v;
  } else if constexpr (printable<T>::value) {
    s << v;
  } else if constexpr (iterable<T>::value) {
    s << "{ ";
    size_t n = 0;
    for (const auto& e : v) {
      if (n++ == 32) {
        s << "...";
        break;
      }
      s << show(e) << " ";
    }
    s << "}";
  } else {
    s << "<" << sizeof(T) << "-byte object>";
  }
  return s.str();
}

template <class A, class B, class Op>
Result compare(const char* op_text, const char* a_text, const char* b_text, const A& a,
               const B& b, Op op) {
  if (op(a, b)) return {true, ""};
  return {false, std::string("Expected: (") + a_text + ") " + op_text + " (" + b_text +
                     "), actual: " + show(a) + " vs " + show(b)};
}

inline Result check_bool(bool v, const char* text, bool expected) {
  if (v == expected) return {true, ""};
  return {false, std::string("Value of: ") + text + "\n  Actual: " + (v ? "true" : "false") +
                     "\nExpected: " + (expected ? "true" : "false")};
}

inline Result near(const char* a_text, const char* b_text, const char* t_text, double a,
                   double b, double tol) {
  if (std::fabs(a - b) <= tol) return {true, ""};
  return {false, std::string("The difference between ") + a_text + " and " + b_text + " is " +
                     show(std::fabs(a - b)) + ", which exceeds " + t_text + ", where " + a_text +
                     " = " + show(a) + ", " + b_text + " = " + show(b) + ", " + t_text + " = " +
                     show(tol)};
}

// Equal within 4 units in the last place, as GoogleTest's FLOAT_EQ / DOUBLE_EQ.
template <class F>
Result ulp_eq(const char* a_text, const char* b_text, F a, F b) {
  using Bits = std::conditional_t<sizeof(F) == 4, int32_t, int64_t>;
  auto biased = [](F f) {
    Bits i;
    std::memcpy(&i, &f, sizeof(f));
    return i < 0 ? static_cast<Bits>(~i + 1) ^ (Bits{1} << (sizeof(F) * 8 - 1)) : i;
  };
  bool ok = !(std::isnan(a) || std::isnan(b));
  if (ok) {
    const Bits x = biased(a), y = biased(b);
    ok = (x > y ? static_cast<uint64_t>(x) - static_cast<uint64_t>(y)
                : static_cast<uint64_t>(y) - static_cast<uint64_t>(x)) <= 4;
  }
  if (ok) return {true, ""};
  return {false, std::string("Expected equality (4 ULPs) of ") + a_text + " and " + b_text +
                     ": " + show(a) + " vs " + show(b)};
}

inline Result str_eq(const char* a_text, const char* b_text, const char* a, const char* b) {
  const bool ok = (a == nullptr || b == nullptr) ? a == b : std::strcmp(a, b) == 0;
  if (ok) return {true, ""};
  return {false, std::string("Expected equality of ") + a_text + " and " + b_text + ": \"" +
                     (a ? a : "(null)") + "\" vs \"" + (b ? b : "(null)") + "\""};
}

// `helper = Message() << ...` reports when the message is complete; operator= returns void, so
// an ASSERT can `return` it from a void test body.
class Reporter {
 public:
  Reporter(const char* file, int line, std::string what, bool fatal)
      : file_(file), line_(line), what_(std::move(what)), fatal_(fatal) {}
  void operator=(const Message& m) const { report(file_, line_, what_, m.str(), fatal_); }

 private:
  const char* file_;
  int line_;
  std::string what_;
  bool fatal_;
};
class Skipper {
 public:
  void operator=(const Message& m) const { mark_skipped(m.str()); }
};

struct ScopedTrace {
  ScopedTrace(const char* file, int line, const std::string& m) { push_trace(file, line, m); }
  template <class T>
  ScopedTrace(const char* file, int line, const T& m) {
    push_trace(file, line, (Message() << m).str());
  }
  ~ScopedTrace() { pop_trace(); }
};

// Death tests. In the parent: runs this binary again for the one test and the statement at
// file:line, and checks its exit status and stderr. In that child: whether this is the statement
// to run (then it runs it and exits "did not die" if it returns), else false (skipped).
struct DeathOutcome {
  bool ok;
  std::string what;
};
bool in_death_child();
bool is_death_statement(const char* file, int line);
[[noreturn]] void death_statement_returned();
DeathOutcome run_death_test(const char* file, int line, const std::function<bool(int)>& predicate,
                            const char* regex, const char* statement_text);

// Parameter generators: converted to std::vector<T> for the fixture's parameter type T.
template <class... V>
class ValueList {
 public:
  explicit ValueList(V... v) : v_(std::move(v)...) {}
  template <class T>
  operator std::vector<T>() const {
    return std::apply([](const V&... v) { return std::vector<T>{static_cast<T>(v)...}; }, v_);
  }

 private:
  std::tuple<V...> v_;
};
template <class T>
class ValueVector {
 public:
  explicit ValueVector(std::vector<T> v) : v_(std::move(v)) {}
  template <class U>
  operator std::vector<U>() const {
    return std::vector<U>(v_.begin(), v_.end());
  }

 private:
  std::vector<T> v_;
};
template <class... G>
class Product {
 public:
  explicit Product(G... g) : g_(std::move(g)...) {}
  template <class... T>
  operator std::vector<std::tuple<T...>>() const {
    static_assert(sizeof...(T) == sizeof...(G), "Combine: one generator per tuple element");
    std::tuple<std::vector<T>...> lists = std::apply(
        [](const G&... g) { return std::tuple<std::vector<T>...>(static_cast<std::vector<T>>(g)...); },
        g_);
    std::vector<std::tuple<T...>> out;
    cross<0>(lists, std::tuple<T...>(), &out);
    return out;
  }

 private:
  template <size_t I, class Lists, class Tup>
  static void cross(const Lists& lists, Tup partial, std::vector<Tup>* out) {
    if constexpr (I == std::tuple_size_v<Tup>) {
      out->push_back(partial);
    } else {
      for (const auto& v : std::get<I>(lists)) {
        std::get<I>(partial) = v;
        cross<I + 1>(lists, partial, out);
      }
    }
  }
  std::tuple<G...> g_;
};

}  // namespace internal

template <class T>
struct TestParamInfo {
  TestParamInfo(const T& p, size_t i) : param(p), index(i) {}
  T param;
  size_t index;
};

template <class T>
class WithParamInterface {
 public:
  using ParamType = T;
  virtual ~WithParamInterface() = default;
  static const T& GetParam() { return *static_cast<const T*>(internal::current_param()); }
};
template <class T>
class TestWithParam : public Test, public WithParamInterface<T> {};

template <class... V>
internal::ValueList<V...> Values(V... v) {
  return internal::ValueList<V...>(std::move(v)...);
}
template <class C>
auto ValuesIn(const C& c) {
  using T = std::decay_t<decltype(*std::begin(c))>;
  return internal::ValueVector<T>(std::vector<T>(std::begin(c), std::end(c)));
}
inline internal::ValueList<bool, bool> Bool() { return internal::ValueList<bool, bool>(false, true); }
template <class... G>
internal::Product<G...> Combine(G... g) {
  return internal::Product<G...>(std::move(g)...);
}

namespace internal {
template <class Fixture, class Gen, class NameGen>
int register_instantiation(const char* prefix, const char* fixture, Gen gen, NameGen name_gen) {
  using T = typename Fixture::ParamType;
  auto values = std::make_shared<std::vector<T>>(static_cast<std::vector<T>>(gen));
  param_instantiations().push_back(
      {prefix, fixture,
       [values, name_gen, prefix = std::string(prefix), fixture = std::string(fixture)](
           const std::vector<ParamPattern>& patterns, std::vector<TestEntry>* out) {
         for (const ParamPattern& p : patterns) {
           if (p.fixture != fixture) continue;
           for (size_t i = 0; i < values->size(); ++i) {
             std::string name;
             if constexpr (std::is_same_v<NameGen, std::nullptr_t>) {
               name = std::to_string(i);
             } else {
               name = name_gen(TestParamInfo<T>((*values)[i], i));
             }
             auto param = std::make_shared<T>((*values)[i]);
             out->push_back({prefix.empty() ? fixture : prefix + "/" + fixture,
                             p.name + "/" + name, p.make, param});
           }
         }
       }});
  return 0;
}
}  // namespace internal

inline std::function<bool(int)> ExitedWithCode(int code);
inline std::function<bool(int)> KilledBySignal(int signal);

void InitGoogleTest(int* argc, char** argv);
int RunAllTests();

}  // namespace testing

#include <sys/wait.h>

inline std::function<bool(int)> testing::ExitedWithCode(int code) {
  return [code](int status) { return WIFEXITED(status) && WEXITSTATUS(status) == code; };
}
inline std::function<bool(int)> testing::KilledBySignal(int signal) {
  return [signal](int status) { return WIFSIGNALED(status) && WTERMSIG(status) == signal; };
}

#define RUN_ALL_TESTS() ::testing::RunAllTests()

#define LTM_GT_CLASS_(suite, name) suite##_##name##_Test

#define TEST(suite, name)                                                                  \
  class LTM_GT_CLASS_(suite, name) : public ::testing::Test {                             \
    void TestBody() override;                                                              \
  };                                                                                       \
  [[maybe_unused]] static const int ltm_gt_reg_##suite##_##name =                         \
      ::testing::internal::register_test(#suite, #name,                                    \
                                         [] { return new LTM_GT_CLASS_(suite, name)(); }); \
  void LTM_GT_CLASS_(suite, name)::TestBody()

#define TEST_F(fixture, name)                                                              \
  class LTM_GT_CLASS_(fixture, name) : public fixture {                                   \
    void TestBody() override;                                                              \
  };                                                                                       \
  [[maybe_unused]] static const int ltm_gt_reg_##fixture##_##name =                       \
      ::testing::internal::register_test(#fixture, #name,                                  \
                                         [] { return new LTM_GT_CLASS_(fixture, name)(); }); \
  void LTM_GT_CLASS_(fixture, name)::TestBody()

#define TEST_P(fixture, name)                                                                \
  class LTM_GT_CLASS_(fixture, name) : public fixture {                                     \
    void TestBody() override;                                                                \
  };                                                                                         \
  [[maybe_unused]] static const int ltm_gt_reg_##fixture##_##name =                         \
      ::testing::internal::register_pattern(#fixture, #name,                                 \
                                            [] { return new LTM_GT_CLASS_(fixture, name)(); }); \
  void LTM_GT_CLASS_(fixture, name)::TestBody()

#define LTM_GT_INSTANTIATE_(prefix, fixture, gen, name_gen, ...)                       \
  [[maybe_unused]] static const int ltm_gt_inst_##prefix##_##fixture =                \
      ::testing::internal::register_instantiation<fixture>(#prefix, #fixture, gen, name_gen)
#define INSTANTIATE_TEST_SUITE_P(prefix, fixture, ...) \
  LTM_GT_INSTANTIATE_(prefix, fixture, __VA_ARGS__, nullptr, unused)

#define LTM_GT_BLOCKER_ \
  switch (0)            \
  case 0:               \
  default:  // NOLINT

#define LTM_GT_CHECK_(result_expr, fatal)                                                      \
  LTM_GT_BLOCKER_                                                                               \
  if (const ::testing::internal::Result ltm_gt_r = (result_expr)) {                           \
  } else                                                                                        \
    return_if_##fatal ::testing::internal::Reporter(__FILE__, __LINE__, ltm_gt_r.what, fatal) = \
        ::testing::Message()
#define return_if_true return
#define return_if_false

#define LTM_GT_CMP_(op, text, a, b, fatal)                                                   \
  LTM_GT_CHECK_(::testing::internal::compare(text, #a, #b, (a), (b),                         \
                                             [](const auto& x, const auto& y) { return x op y; }), \
                fatal)

#define EXPECT_EQ(a, b) LTM_GT_CMP_(==, "==", a, b, false)
#define EXPECT_NE(a, b) LTM_GT_CMP_(!=, "!=", a, b, false)
#define EXPECT_LT(a, b) LTM_GT_CMP_(<, "<", a, b, false)
#define EXPECT_LE(a, b) LTM_GT_CMP_(<=, "<=", a, b, false)
#define EXPECT_GT(a, b) LTM_GT_CMP_(>, ">", a, b, false)
#define EXPECT_GE(a, b) LTM_GT_CMP_(>=, ">=", a, b, false)
#define ASSERT_EQ(a, b) LTM_GT_CMP_(==, "==", a, b, true)
#define ASSERT_NE(a, b) LTM_GT_CMP_(!=, "!=", a, b, true)
#define ASSERT_LT(a, b) LTM_GT_CMP_(<, "<", a, b, true)
#define ASSERT_LE(a, b) LTM_GT_CMP_(<=, "<=", a, b, true)
#define ASSERT_GT(a, b) LTM_GT_CMP_(>, ">", a, b, true)
#define ASSERT_GE(a, b) LTM_GT_CMP_(>=, ">=", a, b, true)
#define EXPECT_TRUE(c) LTM_GT_CHECK_(::testing::internal::check_bool(static_cast<bool>(c), #c, true), false)
#define EXPECT_FALSE(c) LTM_GT_CHECK_(::testing::internal::check_bool(static_cast<bool>(c), #c, false), false)
#define ASSERT_TRUE(c) LTM_GT_CHECK_(::testing::internal::check_bool(static_cast<bool>(c), #c, true), true)
#define ASSERT_FALSE(c) LTM_GT_CHECK_(::testing::internal::check_bool(static_cast<bool>(c), #c, false), true)
#define EXPECT_NEAR(a, b, t) LTM_GT_CHECK_(::testing::internal::near(#a, #b, #t, (a), (b), (t)), false)
#define ASSERT_NEAR(a, b, t) LTM_GT_CHECK_(::testing::internal::near(#a, #b, #t, (a), (b), (t)), true)
#define EXPECT_FLOAT_EQ(a, b) LTM_GT_CHECK_(::testing::internal::ulp_eq<float>(#a, #b, (a), (b)), false)
#define ASSERT_FLOAT_EQ(a, b) LTM_GT_CHECK_(::testing::internal::ulp_eq<float>(#a, #b, (a), (b)), true)
#define EXPECT_DOUBLE_EQ(a, b) LTM_GT_CHECK_(::testing::internal::ulp_eq<double>(#a, #b, (a), (b)), false)
#define ASSERT_DOUBLE_EQ(a, b) LTM_GT_CHECK_(::testing::internal::ulp_eq<double>(#a, #b, (a), (b)), true)
#define EXPECT_STREQ(a, b) LTM_GT_CHECK_(::testing::internal::str_eq(#a, #b, (a), (b)), false)
#define ASSERT_STREQ(a, b) LTM_GT_CHECK_(::testing::internal::str_eq(#a, #b, (a), (b)), true)
#define ADD_FAILURE() LTM_GT_CHECK_((::testing::internal::Result{false, "Failed"}), false)
#define FAIL() LTM_GT_CHECK_((::testing::internal::Result{false, "Failed"}), true)
#define SUCCEED() LTM_GT_CHECK_((::testing::internal::Result{true, ""}), false)

#define GTEST_SKIP() \
  LTM_GT_BLOCKER_    \
  return ::testing::internal::Skipper() = ::testing::Message()

#define LTM_GT_CAT2_(a, b) a##b
#define LTM_GT_CAT_(a, b) LTM_GT_CAT2_(a, b)
#define SCOPED_TRACE(m) \
  ::testing::internal::ScopedTrace LTM_GT_CAT_(ltm_gt_trace_, __LINE__)(__FILE__, __LINE__, (m))

#define GTEST_FLAG_SET(name, value) ::testing::internal::set_flag(#name, value)

#define LTM_GT_DEATH_(statement, predicate, regex, fatal)                                       \
  LTM_GT_BLOCKER_                                                                               \
  if (::testing::internal::in_death_child()) {                                                  \
    if (::testing::internal::is_death_statement(__FILE__, __LINE__)) {                          \
      statement;                                                                                \
      ::testing::internal::death_statement_returned();                                          \
    }                                                                                           \
  } else if (const ::testing::internal::DeathOutcome ltm_gt_d =                                 \
                 ::testing::internal::run_death_test(__FILE__, __LINE__, (predicate), (regex),  \
                                                     #statement);                               \
             ltm_gt_d.ok) {                                                                     \
  } else                                                                                        \
    return_if_##fatal ::testing::internal::Reporter(__FILE__, __LINE__, ltm_gt_d.what, fatal) = \
        ::testing::Message()

#define EXPECT_EXIT(statement, predicate, regex) LTM_GT_DEATH_(statement, predicate, regex, false)
#define ASSERT_EXIT(statement, predicate, regex) LTM_GT_DEATH_(statement, predicate, regex, true)
#define EXPECT_DEATH(statement, regex)                                                     \
  LTM_GT_DEATH_(statement, [](int s) { return !(WIFEXITED(s) && WEXITSTATUS(s) == 0); }, \
                regex, false)
#define ASSERT_DEATH(statement, regex)                                                     \
  LTM_GT_DEATH_(statement, [](int s) { return !(WIFEXITED(s) && WEXITSTATUS(s) == 0); }, \
                regex, true)
