#include "sched/loss_scaler.h"

#include <gtest/gtest.h>

#include <limits>

namespace zinf::sched {
namespace {

Fp16Config Dynamic(int64_t power, int64_t window, int64_t hysteresis, bool consecutive = false) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  return c;
}

LossScaler Make(const Fp16Config& c) {
  auto s = LossScaler::Create(c);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

TEST(LossScalerTest, StaticScalesNeverChange) {
  Fp16Config off;  // fp16 disabled: scale 1, whatever the other fields say
  off.initial_scale_power = 99;
  auto none = Make(off);
  EXPECT_FALSE(none.dynamic());
  EXPECT_EQ(none.scale(), 1.0);
  Fp16Config fixed;
  fixed.enabled = true;
  fixed.loss_scale = 128;
  auto st = Make(fixed);
  EXPECT_FALSE(st.dynamic());
  for (bool overflow : {true, true, false, false, true}) {
    EXPECT_FALSE(none.Update(overflow));
    EXPECT_FALSE(st.Update(overflow));
  }
  EXPECT_EQ(none.scale(), 1.0);
  EXPECT_EQ(st.scale(), 128.0);
  EXPECT_EQ(st.overflows(), 3);
  EXPECT_EQ(st.Describe(), "static loss scale 128");
}

TEST(LossScalerTest, HysteresisTwoTakesTwoOverflowsToHalve) {
  auto s = Make(Dynamic(4, 1000, 2));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_FALSE(s.Update(true));  // spends the hysteresis
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_TRUE(s.Update(true));  // counter stays at 1 until restored
  EXPECT_EQ(s.scale(), 4.0);
  EXPECT_EQ(s.overflows(), 3);
}

TEST(LossScalerTest, GrowsEveryWindowCleanSteps) {
  auto s = Make(Dynamic(4, 3, 1));
  // last_overflow_iter starts at -1: the first doubling is on call 3 (iter 2).
  EXPECT_FALSE(s.Update(false));
  EXPECT_FALSE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 32.0);
  EXPECT_FALSE(s.Update(false));
  EXPECT_FALSE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 64.0);
  EXPECT_TRUE(s.Update(true));  // iter 6
  EXPECT_EQ(s.scale(), 32.0);
  EXPECT_FALSE(s.Update(false));  // iter 7, 1 after the overflow
  EXPECT_FALSE(s.Update(false));
  EXPECT_TRUE(s.Update(false));  // iter 9
  EXPECT_EQ(s.scale(), 64.0);
  EXPECT_EQ(s.overflows(), 1);
}

TEST(LossScalerTest, NeverHalvesBelowMinLossScale) {
  auto c = Dynamic(2, 2, 1);
  c.min_loss_scale = 3;
  auto s = Make(c);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 3.0);  // max(4 / 2, 3)
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 3.0);
  EXPECT_FALSE(s.Update(false));
  EXPECT_TRUE(s.Update(false));  // 2 after the last overflow
  EXPECT_EQ(s.scale(), 6.0);
}

TEST(LossScalerTest, ConsecutiveHysteresisRestoresOnAnyCleanStep) {
  auto s = Make(Dynamic(4, 100, 2, /*consecutive=*/true));
  EXPECT_FALSE(s.Update(true));
  EXPECT_FALSE(s.Update(false));  // restores the counter to 2
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_TRUE(s.Update(true));  // two in a row
  EXPECT_EQ(s.scale(), 8.0);

  auto plain = Make(Dynamic(4, 100, 2));
  EXPECT_FALSE(plain.Update(true));
  EXPECT_FALSE(plain.Update(false));  // no restore before the window
  EXPECT_TRUE(plain.Update(true));
  EXPECT_EQ(plain.scale(), 8.0);
}

TEST(LossScalerTest, WithoutConsecutiveHysteresisGrowthRestoresTheCounter) {
  auto s = Make(Dynamic(4, 2, 2));
  EXPECT_FALSE(s.Update(true));   // iter 0: counter 1
  EXPECT_FALSE(s.Update(false));  // iter 1
  EXPECT_TRUE(s.Update(false));   // iter 2: doubles, counter back to 2
  EXPECT_EQ(s.scale(), 32.0);
  EXPECT_FALSE(s.Update(true));  // spends it again
  EXPECT_EQ(s.scale(), 32.0);
}

TEST(LossScalerTest, DescribeAndExtremePowers) {
  EXPECT_EQ(Make(Dynamic(16, 1000, 2)).Describe(),
            "dynamic loss scale 65536 (initial 2^16), window 1000, hysteresis 2, min 1");
  EXPECT_EQ(Make(Dynamic(0, 1, 1, true)).Describe(),
            "dynamic loss scale 1 (initial 2^0), window 1, hysteresis 1 (consecutive), min 1");
  EXPECT_EQ(Make(Dynamic(64, 1, 1)).scale(), 18446744073709551616.0);
}

TEST(LossScalerTest, RejectsBadValuesNamingTheKey) {
  auto expect_invalid = [](const Fp16Config& c, const std::string& key) {
    auto s = LossScaler::Create(c);
    ASSERT_FALSE(s.ok()) << key;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(key), std::string::npos) << s.status().message();
  };
  auto c = Dynamic(16, 1000, 2);
  c.loss_scale = -1;
  expect_invalid(c, "fp16.loss_scale");
  c.loss_scale = std::numeric_limits<double>::infinity();
  expect_invalid(c, "fp16.loss_scale");
  expect_invalid(Dynamic(-1, 1000, 2), "fp16.initial_scale_power");
  expect_invalid(Dynamic(65, 1000, 2), "fp16.initial_scale_power");
  expect_invalid(Dynamic(16, 0, 2), "fp16.loss_scale_window");
  expect_invalid(Dynamic(16, 1000, 0), "fp16.hysteresis");
  c = Dynamic(16, 1000, 2);
  c.min_loss_scale = 0;
  expect_invalid(c, "fp16.min_loss_scale");
  c.min_loss_scale = -2;
  expect_invalid(c, "fp16.min_loss_scale");
  c.enabled = false;  // ignored when fp16 is off
  EXPECT_TRUE(LossScaler::Create(c).ok());
}

}  // namespace
}  // namespace zinf::sched
