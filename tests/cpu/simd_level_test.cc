#include "cpu/simd_level.h"

#include <gtest/gtest.h>

namespace zinf::cpu {
namespace {

TEST(SimdLevelTest, NamesRoundTrip) {
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    auto parsed = ParseSimdLevel(SimdLevelName(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
  EXPECT_FALSE(ParseSimdLevel("avx3").ok());
}

TEST(SimdLevelTest, ActiveNeverExceedsDetected) {
  EXPECT_LE(static_cast<int>(ActiveSimdLevel()), static_cast<int>(DetectedSimdLevel()));
#if defined(__x86_64__)
  EXPECT_GE(DetectedSimdLevel(), SimdLevel::kSse2);  // every x86-64 CPU has SSE2
#endif
}

}  // namespace
}  // namespace zinf::cpu
