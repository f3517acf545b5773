#include "common/check.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(CheckDeathTest, FailedCheckAbortsWithLocation) {
  int x = 1;
  EXPECT_DEATH(ZINF_CHECK(x == 2), "check failed at .*check_test.cc:[0-9]+: x == 2");
  EXPECT_DEATH(ZINF_CHECK_MSG(x < 0, "x must be negative"), "x < 0: x must be negative");
}

TEST(CheckTest, PassingCheckDoesNothing) {
  int evaluated = 0;
  ZINF_CHECK(++evaluated == 1);
  EXPECT_EQ(evaluated, 1);  // evaluated exactly once
}

}  // namespace
}  // namespace zinf
