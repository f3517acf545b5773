#include "sched/step_decision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace zinf::sched {
namespace {

StepDecision Make(double clipping, int world, int64_t accumulation, Fp16Config fp16 = {}, double lr = 1e-3) {
  SchedulerConfig none;
  auto schedule = LrSchedule::Create(none, lr);
  EXPECT_TRUE(schedule.ok()) << schedule.status().ToString();
  auto scaler = LossScaler::Create(fp16);
  EXPECT_TRUE(scaler.ok()) << scaler.status().ToString();
  cpu::AdamOptions adam;
  adam.lr = lr;
  return StepDecision(*schedule, *scaler, adam, clipping, world, accumulation);
}

TEST(StepDecisionTest, NormIsTheRootOfTheSumOverTheMeanAndScale) {
  // Two ranks, two micro-steps: the summed gradients' squares total 144, so
  // the norm of the mean gradient is sqrt(144) / (2 * 2) = 3.
  StepDecision decision = Make(/*clipping=*/0, /*world=*/2, /*accumulation=*/2);
  const Decision d = decision.Decide(144.0);
  EXPECT_FALSE(d.skip);
  EXPECT_DOUBLE_EQ(d.grad_norm, 3.0);
  EXPECT_DOUBLE_EQ(d.clip_coef, 1.0);
  EXPECT_DOUBLE_EQ(d.grad_scale, 1.0 / 4.0);
  EXPECT_DOUBLE_EQ(d.lr, 1e-3);
  EXPECT_DOUBLE_EQ(d.adam.lr, 1e-3);
  EXPECT_EQ(decision.steps_applied(), 1);
}

TEST(StepDecisionTest, ClippingScalesDownOnlyAboveTheLimit) {
  // Norm 3 (sum 9, one rank, one micro-step) against a limit of 1.5:
  // coefficient 1.5 / (3 + 1e-6).
  StepDecision clipped = Make(1.5, 1, 1);
  const Decision d = clipped.Decide(9.0);
  EXPECT_DOUBLE_EQ(d.grad_norm, 3.0);
  EXPECT_DOUBLE_EQ(d.clip_coef, 1.5 / (3.0 + 1e-6));
  EXPECT_DOUBLE_EQ(d.grad_scale, d.clip_coef);
  // Below the limit the gradients stay as they are.
  StepDecision loose = Make(10.0, 1, 1);
  EXPECT_DOUBLE_EQ(loose.Decide(9.0).clip_coef, 1.0);
}

TEST(StepDecisionTest, AnOverflowSkipsTheStepAndHalvesTheDynamicScale) {
  Fp16Config fp16;
  fp16.enabled = true;
  fp16.loss_scale = 0;  // dynamic
  fp16.initial_scale_power = 4;
  fp16.hysteresis = 1;
  StepDecision decision = Make(1.0, 1, 1, fp16);
  const Decision over = decision.Decide(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(over.skip);
  EXPECT_DOUBLE_EQ(over.loss_scale, 16.0);
  EXPECT_DOUBLE_EQ(over.next_loss_scale, 8.0);
  EXPECT_EQ(decision.steps_applied(), 0);
  // NaN too; then a finite step applies at the new scale: the scaled squares
  // sum to (8 * 2)^2, the norm of the unscaled gradient is 2.
  EXPECT_TRUE(decision.Decide(std::nan("")).skip);
  const Decision next = decision.Decide(16.0 * 16.0 / 4.0);
  EXPECT_FALSE(next.skip);
  EXPECT_DOUBLE_EQ(next.loss_scale, 4.0);
  EXPECT_DOUBLE_EQ(next.grad_norm, 2.0);
  EXPECT_DOUBLE_EQ(next.grad_scale, (1.0 / (2.0 + 1e-6)) / 4.0);
  EXPECT_EQ(decision.steps_applied(), 1);
}

TEST(StepDecisionTest, TheLearningRateFollowsTheAppliedSteps) {
  SchedulerConfig warmup;
  warmup.type = SchedulerType::kWarmupLR;
  warmup.warmup_min_lr = 0;
  warmup.warmup_max_lr = 1.0;
  warmup.warmup_num_steps = 4;
  warmup.warmup_type = WarmupType::kLinear;
  auto schedule = LrSchedule::Create(warmup, 1.0);
  ASSERT_TRUE(schedule.ok()) << schedule.status().ToString();
  auto scaler = LossScaler::Create(Fp16Config{});
  ASSERT_TRUE(scaler.ok());
  StepDecision decision(*schedule, *scaler, cpu::AdamOptions{}, 0, 1, 1);
  for (int64_t k = 0; k < 3; ++k) {
    const Decision d = decision.Decide(1.0);
    EXPECT_DOUBLE_EQ(d.lr, schedule->LrAt(k)) << "step " << k;
  }
  // A checkpoint's count resumes the schedule where it was.
  decision.set_steps_applied(1);
  EXPECT_DOUBLE_EQ(decision.Decide(1.0).lr, schedule->LrAt(1));
}

TEST(StepDecisionTest, PartialsSumInTheUnshardedUnitsOrder) {
  // Two ranks, two units: unit 0 owns 1 block per rank, unit 1 owns 2. The
  // regions are rank-major: [r0: u0 b0 | u1 b0 b1][r1: u0 b0 | u1 b0 b1].
  NormPartialsLayout layout;
  layout.regions = 2;
  layout.blocks_per_rank = 3;
  layout.unit_block_offset = {0, 1};
  layout.unit_blocks = {1, 2};
  // Values whose sum depends on the order: the global order is unit 0's
  // blocks of rank 0 then rank 1, then unit 1's: 1e16, -1e16, 1, 1, 1, 1.
  const std::vector<double> p = {1e16, 1, 1, -1e16, 1, 1};
  double expected = 0;
  for (double v : {1e16, -1e16, 1.0, 1.0, 1.0, 1.0}) expected += v;
  EXPECT_EQ(SumNormPartials(p.data(), layout), expected);
  EXPECT_EQ(expected, 4.0);
  // A rank-major walk would lose the ones next to 1e16.
  double rank_major = 0;
  for (double v : p) rank_major += v;
  EXPECT_NE(rank_major, expected);
}

}  // namespace
}  // namespace zinf::sched
