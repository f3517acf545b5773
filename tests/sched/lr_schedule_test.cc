#include "sched/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace zinf::sched {
namespace {

SchedulerConfig Config(SchedulerType type, WarmupType warmup, int64_t warmup_steps, int64_t total_steps = 0) {
  SchedulerConfig c;
  c.type = type;
  c.warmup_type = warmup;
  c.warmup_num_steps = warmup_steps;
  c.total_num_steps = total_steps;
  return c;
}

LrSchedule Make(const SchedulerConfig& c, double lr = 0.01) {
  auto s = LrSchedule::Create(c, lr);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

void ExpectInvalid(const SchedulerConfig& c, double lr, const std::string& key) {
  auto s = LrSchedule::Create(c, lr);
  ASSERT_FALSE(s.ok()) << key;
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find(key), std::string::npos) << s.status().message();
}

TEST(LrScheduleTest, NoneIsTheOptimizerLr) {
  auto s = Make(SchedulerConfig{}, 0.003);
  EXPECT_EQ(s.LrAt(0), 0.003);
  EXPECT_EQ(s.LrAt(1'000'000'000), 0.003);
  EXPECT_EQ(s.Describe(), "constant lr 0.003");
}

// The index is DeepSpeed's engine's: step c + 1 (after c completed steps)
// runs at last_batch_iteration c - 1, the first at the constructor's lr.
// log warmup over 1000 steps: log(s + 1) / log(1000); log(10) / log(1000) = 1/3.
TEST(LrScheduleTest, WarmupLrLog) {
  auto s = Make(Config(SchedulerType::kWarmupLR, WarmupType::kLog, 1000));
  EXPECT_EQ(s.LrAt(0), 0.0);  // the constructor's: warmup_min_lr
  EXPECT_EQ(s.LrAt(1), 0.0);  // index 0
  EXPECT_NEAR(s.LrAt(10), 0.001 / 3, 1e-15);
  EXPECT_NEAR(s.LrAt(100), 0.002 / 3, 1e-15);
  EXPECT_NEAR(s.LrAt(1000), 0.001, 1e-15);  // index 999, the last warmup step, reaches max
  EXPECT_EQ(s.LrAt(1001), 0.001);
  EXPECT_EQ(s.LrAt(50'000), 0.001);
  EXPECT_EQ(s.Describe(), "WarmupLR log 0 -> 0.001 over 1000 steps");
}

TEST(LrScheduleTest, WarmupLrLinearFromNonZeroMin) {
  auto c = Config(SchedulerType::kWarmupLR, WarmupType::kLinear, 10);
  c.warmup_min_lr = 0.0002;
  auto s = Make(c);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.0002);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.0002);
  EXPECT_DOUBLE_EQ(s.LrAt(6), 0.0006);    // 0.0002 + 0.0008 * 5/10
  EXPECT_DOUBLE_EQ(s.LrAt(10), 0.00092);  // linear warmup stops one step short of max
  EXPECT_DOUBLE_EQ(s.LrAt(11), 0.001);
  EXPECT_DOUBLE_EQ(s.LrAt(12), 0.001);
}

// DeepSpeed clamps warmup_num_steps to 2.
TEST(LrScheduleTest, WarmupShorterThanTwoStepsIsTwo) {
  auto log = Make(Config(SchedulerType::kWarmupLR, WarmupType::kLog, 0));
  EXPECT_EQ(log.LrAt(1), 0.0);
  EXPECT_DOUBLE_EQ(log.LrAt(2), 0.001);  // log(2) / log(2)
  auto linear = Make(Config(SchedulerType::kWarmupLR, WarmupType::kLinear, 1));
  EXPECT_DOUBLE_EQ(linear.LrAt(2), 0.0005);  // 1/2
  EXPECT_DOUBLE_EQ(linear.LrAt(3), 0.001);
  EXPECT_EQ(linear.Describe(), "WarmupLR linear 0 -> 0.001 over 2 steps");
}

// W = 100, T = 1100: decay (T - s) / (T - W) = (1100 - s) / 1000 after warmup.
TEST(LrScheduleTest, WarmupDecayLr) {
  auto c = Config(SchedulerType::kWarmupDecayLR, WarmupType::kLinear, 100, 1100);
  c.warmup_min_lr = 0.0001;
  auto s = Make(c);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.0001);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.0001);
  EXPECT_DOUBLE_EQ(s.LrAt(51), 0.00055);      // 0.0001 + 0.0009 * 0.5
  EXPECT_DOUBLE_EQ(s.LrAt(101), 0.001);       // warmup end: gamma 1000/1000
  EXPECT_DOUBLE_EQ(s.LrAt(601), 0.00055);     // mid-decay: gamma 0.5
  EXPECT_DOUBLE_EQ(s.LrAt(1100), 0.0001009);  // gamma 1/1000
  EXPECT_DOUBLE_EQ(s.LrAt(1101), 0.0001);
  EXPECT_DOUBLE_EQ(s.LrAt(5000), 0.0001);  // clamped at gamma 0
  EXPECT_EQ(s.Describe(), "WarmupDecayLR linear 0.0001 -> 0.001 over 100 steps, linear decay to 0.0001 at step 1100");
}

// lr 0.01, warmup_min_ratio 0.1, W = 10, T = 110, cos_min_ratio 1e-4: after
// warmup p = min(1, (s - 9) / 100) and ratio = 1e-4 + 0.9999 * (1 + cos(pi p)) / 2.
TEST(LrScheduleTest, WarmupCosineLr) {
  auto c = Config(SchedulerType::kWarmupCosineLR, WarmupType::kLinear, 10, 110);
  c.warmup_min_ratio = 0.1;
  auto s = Make(c, 0.01);
  EXPECT_EQ(s.LrAt(0), 0.0);             // the constructor's: ratio 0
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.001);    // 0.01 * 0.1
  EXPECT_DOUBLE_EQ(s.LrAt(6), 0.0055);   // ratio 0.1 + 0.9 * 0.5
  EXPECT_DOUBLE_EQ(s.LrAt(10), 0.0091);  // ratio 0.1 + 0.9 * 0.9
  const double pi = 3.14159265358979323846;
  EXPECT_DOUBLE_EQ(s.LrAt(11), 0.01 * (1e-4 + 0.9999 * (1 + std::cos(pi / 100)) / 2));  // already one step in
  EXPECT_NEAR(s.LrAt(60), 0.0050005, 1e-15);  // p = 1/2: ratio 1e-4 + 0.9999 / 2
  EXPECT_NEAR(s.LrAt(110), 1e-6, 1e-15);      // p = 1: ratio cos_min_ratio
  EXPECT_NEAR(s.LrAt(111), 1e-6, 1e-15);      // and there it stays, as in DeepSpeed
  EXPECT_NEAR(s.LrAt(300), 1e-6, 1e-15);
  EXPECT_EQ(s.Describe(), "WarmupCosineLR lr 0.01 x ratio linear 0.1 -> 1 over 10 steps, cosine to 0.0001 at step 110");
}

TEST(LrScheduleTest, WarmupCosineLrLogWarmup) {
  auto c = Config(SchedulerType::kWarmupCosineLR, WarmupType::kLog, 100, 1000);
  auto s = Make(c, 0.02);
  EXPECT_EQ(s.LrAt(1), 0.0);
  EXPECT_NEAR(s.LrAt(10), 0.01, 1e-15);  // log(10) / log(100) = 1/2
}

TEST(LrScheduleTest, RejectsValuesTheScheduleCannotUse) {
  const std::string p = "scheduler.params.";
  ExpectInvalid(SchedulerConfig{}, -1, "optimizer.params.lr");
  ExpectInvalid(SchedulerConfig{}, std::numeric_limits<double>::quiet_NaN(), "optimizer.params.lr");
  ExpectInvalid(Config(SchedulerType::kWarmupLR, WarmupType::kLog, -1), 0.01, p + "warmup_num_steps");
  auto c = Config(SchedulerType::kWarmupLR, WarmupType::kLog, 10);
  c.warmup_min_lr = -1e-4;
  ExpectInvalid(c, 0.01, p + "warmup_min_lr");
  c = Config(SchedulerType::kWarmupDecayLR, WarmupType::kLog, 10, 100);
  c.warmup_max_lr = -0.001;
  ExpectInvalid(c, 0.01, p + "warmup_max_lr");
  c.warmup_max_lr = std::numeric_limits<double>::infinity();
  ExpectInvalid(c, 0.01, p + "warmup_max_lr");
  for (auto type : {SchedulerType::kWarmupDecayLR, SchedulerType::kWarmupCosineLR}) {
    ExpectInvalid(Config(type, WarmupType::kLog, 1000), 0.01, p + "total_num_steps");  // default total 0
    ExpectInvalid(Config(type, WarmupType::kLog, 1000, 1000), 0.01, p + "total_num_steps");
    ExpectInvalid(Config(type, WarmupType::kLog, 0, 2), 0.01, p + "total_num_steps");  // warmup clamped to 2
    EXPECT_TRUE(LrSchedule::Create(Config(type, WarmupType::kLog, 1000, 1001), 0.01).ok());
    EXPECT_TRUE(LrSchedule::Create(Config(type, WarmupType::kLog, 0, 3), 0.01).ok());
  }
  c = Config(SchedulerType::kWarmupCosineLR, WarmupType::kLog, 10, 100);
  c.warmup_min_ratio = 1.5;
  ExpectInvalid(c, 0.01, p + "warmup_min_ratio");
  c.warmup_min_ratio = 0;
  c.cos_min_ratio = -0.1;
  ExpectInvalid(c, 0.01, p + "cos_min_ratio");
}

}  // namespace
}  // namespace zinf::sched
