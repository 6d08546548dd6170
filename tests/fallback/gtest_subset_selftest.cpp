// The GoogleTest stand-in (tests/fallback/gtest/gtest.h) checked on tests whose outcome is known:
// tests/tools/check_gpu_only_build.sh runs this and compares its report with the outcomes named
// in the test names (Pass*, Fail*, Skip*). Built only where the stand-in is.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

namespace {

TEST(Pass, Comparisons) {
  EXPECT_EQ(2 + 2, 4);
  EXPECT_NE(1, 2);
  EXPECT_LT(1, 2);
  EXPECT_LE(2, 2);
  EXPECT_GT(3, 2);
  EXPECT_GE(3, 3);
  EXPECT_TRUE(true);
  EXPECT_FALSE(false);
  EXPECT_NEAR(1.0, 1.05, 0.1);
  EXPECT_FLOAT_EQ(0.1f + 0.2f, 0.3f);
  EXPECT_STREQ("ab", "ab");
  EXPECT_EQ(std::vector<int>({1, 2}), std::vector<int>({1, 2}));
  ASSERT_EQ(std::string("x"), "x");
}

TEST(Pass, ExitedWithTheExpectedCodeAndMessage) {
  EXPECT_EXIT(
      {
        std::fprintf(stderr, "going down: code 3\n");
        std::exit(3);
      },
      ::testing::ExitedWithCode(3), "going down: code [0-9]");
}

class Fixture : public ::testing::Test {
 protected:
  void SetUp() override { value_ = 7; }
  int value_ = 0;
};

TEST_F(Fixture, PassSetUpRan) { EXPECT_EQ(value_, 7); }

class Params : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(Params, PassEachParameter) {
  EXPECT_GE(std::get<0>(GetParam()), 1);
  EXPECT_FALSE(std::get<1>(GetParam()).empty());
}

INSTANTIATE_TEST_SUITE_P(Grid, Params,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values(std::string("a"), std::string("b"))),
                         [](const ::testing::TestParamInfo<std::tuple<int, std::string>>& info) {
                           return std::get<1>(info.param) + std::to_string(std::get<0>(info.param));
                         });

TEST(Fail, ExpectKeepsGoing) {
  EXPECT_EQ(1, 2) << "one is not two";
  std::printf("after a failed EXPECT: reached\n");
}

TEST(Fail, AssertStops) {
  ASSERT_TRUE(false) << "stop here";
  std::printf("after a failed ASSERT: REACHED (wrong)\n");
}

TEST(Fail, NearOutsideTolerance) { EXPECT_NEAR(1.0, 2.0, 0.5); }

TEST(Fail, ExitedWithAnotherCode) {
  EXPECT_EXIT(std::exit(4), ::testing::ExitedWithCode(3), "");
}

TEST(Fail, DidNotDie) { EXPECT_EXIT({}, ::testing::ExitedWithCode(0), ""); }

TEST(Skip, SkipsItself) {
  GTEST_SKIP() << "skipped on purpose";
  ADD_FAILURE() << "after GTEST_SKIP: reached (wrong)";
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
