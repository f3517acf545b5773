#include "sched/state_bytes.h"

#include <gtest/gtest.h>

namespace zinf::sched {
namespace {

constexpr OffloadDevice kNone = OffloadDevice::kNone, kCpu = OffloadDevice::kCpu, kNvme = OffloadDevice::kNvme;

// DESIGN.md: stage 0 16P; stage 1 4P + 12P/N; stage 2 2P + 14P/N; stage 3 16P/N.
TEST(StateBytesTest, DeviceBytesMatchTheZeroFormulas) {
  const int64_t p = 1'000'000;
  for (int64_t n : {1, 2, 4, 64}) {
    double P = static_cast<double>(p), N = static_cast<double>(n);
    EXPECT_DOUBLE_EQ(ModelStateBytes(p, n, 0, kNone, kNone).device, 16 * P);
    EXPECT_DOUBLE_EQ(ModelStateBytes(p, n, 1, kNone, kNone).device, 4 * P + 12 * P / N);
    EXPECT_DOUBLE_EQ(ModelStateBytes(p, n, 2, kNone, kNone).device, 2 * P + 14 * P / N);
    EXPECT_DOUBLE_EQ(ModelStateBytes(p, n, 3, kNone, kNone).device, 16 * P / N);
    for (int stage = 0; stage <= 3; ++stage) {
      auto s = ModelStateBytes(p, n, stage, kNone, kNone);
      EXPECT_EQ(s.host, 0);
      EXPECT_EQ(s.nvme, 0);
    }
  }
}

TEST(StateBytesTest, OptimizerOffloadMovesTwelveBytesAndAddsTheFp32GradShard) {
  auto cpu = ModelStateBytes(1000, 4, 2, kCpu, kNone);
  EXPECT_DOUBLE_EQ(cpu.device, 2 * 1000 + 2 * 1000 / 4.0);  // 16-bit params + 16-bit grad shard
  EXPECT_DOUBLE_EQ(cpu.host, 12 * 1000 / 4.0 + 4 * 1000 / 4.0);
  auto nvme = ModelStateBytes(1000, 4, 2, kNvme, kNone);
  EXPECT_DOUBLE_EQ(nvme.nvme, 12 * 1000 / 4.0);
  EXPECT_DOUBLE_EQ(nvme.host, 4 * 1000 / 4.0);
}

TEST(StateBytesTest, Stage3ParamOffloadLeavesOnlyGradShardOnDevice) {
  auto s = ModelStateBytes(1000, 2, 3, kNvme, kNvme);
  EXPECT_DOUBLE_EQ(s.device, 2 * 1000 / 2.0);
  EXPECT_DOUBLE_EQ(s.nvme, (2 + 12) * 1000 / 2.0);
  // Total state is 20 B/param (16-bit param, 16-bit grad, fp32 grad, 12 B optimizer), divided by N.
  EXPECT_DOUBLE_EQ(s.total(), 20 * 1000 / 2.0);
}

TEST(StateBytesTest, ParamOffloadIsIgnoredBelowStage3) {
  // Below stage 3 parameters are replicated on the device (the config loader
  // rejects offload_param there; the formula simply does not move them).
  EXPECT_DOUBLE_EQ(ModelStateBytes(100, 1, 2, kNone, kCpu).host, 0);
}

}  // namespace
}  // namespace zinf::sched
