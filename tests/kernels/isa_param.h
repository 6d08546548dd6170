// Runs a test once per CPU kernel path this machine supports (kernels/cpu/cpu_isa.h):
//   class MyTest : public IsaTest {};
//   TEST_P(MyTest, Case) { ... }           // the path GetParam() is in force
//   LTM_INSTANTIATE_ISA_TESTS(MyTest);
// At the end the binary prints which paths ran. With LTM_TEST_REQUIRE_ISAS=avx512,avx2,portable
// (CI: what the runner's CPU must cover) it fails unless each listed path ran, so a test cannot
// pass silently on a path that was never exercised.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <set>
#include <sstream>
#include <string>

#include "kernels/cpu/cpu_isa.h"

namespace ltm::kernels::cpu {

inline void PrintTo(Isa i, std::ostream* os) { *os << isa_name(i); }  // gtest's names

inline std::set<Isa>& isas_run() {
  static std::set<Isa> s;
  return s;
}

class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    saved_ = isa();
    ASSERT_TRUE(set_isa(GetParam())) << isa_name(GetParam());
    ASSERT_EQ(isa(), GetParam());
    isas_run().insert(GetParam());
    // These tests check the path with fp32 activations; AMX (which rounds them for bf16
    // weights, cpu_isa.h) has its own test, amx_test.
    set_amx(false);
  }
  void TearDown() override {
    set_isa(saved_);
    set_amx(true);
  }

 private:
  Isa saved_ = Isa::kPortable;
};

class IsaReport : public ::testing::Environment {
 public:
  void TearDown() override {
    std::string ran, supported;
    for (Isa i : supported_isas()) {
      supported += std::string(supported.empty() ? "" : " ") + isa_name(i);
      if (isas_run().count(i)) ran += std::string(ran.empty() ? "" : " ") + isa_name(i);
    }
    std::printf("[ ISA paths ] ran: %s (this CPU supports: %s)\n",
                ran.empty() ? "none" : ran.c_str(), supported.c_str());
    const char* required = std::getenv("LTM_TEST_REQUIRE_ISAS");
    if (required == nullptr) return;
    std::stringstream list(required);
    std::string name;
    while (std::getline(list, name, ',')) {
      if (name.empty()) continue;
      const auto want = parse_isa(name);
      EXPECT_TRUE(want.has_value()) << "LTM_TEST_REQUIRE_ISAS: unknown path " << name;
      if (want) {
        EXPECT_TRUE(isas_run().count(*want)) << "required path " << name << " did not run";
      }
    }
  }
};

inline ::testing::Environment* const kIsaReportEnv =
    ::testing::AddGlobalTestEnvironment(new IsaReport);

}  // namespace ltm::kernels::cpu

#define LTM_INSTANTIATE_ISA_TESTS(suite)                                                         \
  INSTANTIATE_TEST_SUITE_P(Isa, suite, ::testing::ValuesIn(::ltm::kernels::cpu::supported_isas()), \
                           [](const ::testing::TestParamInfo<::ltm::kernels::cpu::Isa>& info) {   \
                             return std::string(::ltm::kernels::cpu::isa_name(info.param));      \
                           })
