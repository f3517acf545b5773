// The dispatch table and its fixed-order helpers: every supported level has a
// complete table that reports its level, the lane combination order is the
// documented one, and the FP-environment guard sets and restores MXCSR.
#include "cpu/kernels.h"

#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <cstring>

#include "cpu_test_util.h"

namespace zinf::cpu {
namespace {

class KernelTableTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override { ZINF_SKIP_IF_LEVEL_UNSUPPORTED(GetParam()); }
};

TEST_P(KernelTableTest, TableIsCompleteAndReportsItsLevel) {
  const KernelTable& t = Kernels(GetParam());
#if defined(__x86_64__)
  EXPECT_EQ(t.level, GetParam());
#endif
  for (int g = 0; g < 3; ++g) {
    for (int c = 0; c < 4; ++c) EXPECT_NE(t.adam[g][c], nullptr) << g << "," << c;
    EXPECT_NE(t.sum_squares[g], nullptr) << g;
    for (int d = 0; d < 3; ++d) EXPECT_EQ(t.cast[g][d] == nullptr, g == d) << g << "," << d;
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, KernelTableTest, ::testing::ValuesIn(test::AllSimdLevels()),
                         test::SimdLevelParamName);

TEST(KernelsTest, CombineNormLanesUsesTheFixedPairwiseOrder) {
  double lanes[math::kNormLanes];
  for (int i = 0; i < math::kNormLanes; ++i) lanes[i] = 1.0 + i * 0x1p-40;
  lanes[3] = 1e16;
  lanes[11] = -1e16;
  double s[8];
  for (int i = 0; i < 8; ++i) s[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) s[i] += s[i + 4];
  for (int i = 0; i < 2; ++i) s[i] += s[i + 2];
  const double want = s[0] + s[1];
  const double got = math::CombineNormLanes(lanes);
  EXPECT_EQ(std::memcmp(&want, &got, sizeof(double)), 0);
  double sequential = 0;  // a different order gives a different double here
  for (double l : lanes) sequential += l;
  EXPECT_NE(sequential, got);
}

#if defined(__x86_64__)
TEST(KernelsTest, DefaultFpEnvironmentSetsAndRestoresMxcsr) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr((saved & ~0x6000u) | 0x8040u | 0x2000u);  // FTZ, DAZ, round down
  {
    DefaultFpEnvironment env;
    EXPECT_EQ(_mm_getcsr() & ~0x3fu, 0x1f80u);
    volatile float tiny = 1e-39f;
    EXPECT_NE(tiny * 0.5f, 0.0f);  // a subnormal result survives inside
  }
  EXPECT_EQ(_mm_getcsr() & 0xe040u, 0xa040u);
  _mm_setcsr(saved);
}
#endif

}  // namespace
}  // namespace zinf::cpu
