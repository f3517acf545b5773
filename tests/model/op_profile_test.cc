// The op profiles of `zinf bench model --breakdown` (model/op_profile.h,
// exec/op_profile.h). The event profile, which the CUDA model uses, is
// device-generic: here it times tasks on a HostDevice stream between its
// marks, as it times kernels on a CUDA stream.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "cpu/host_device.h"
#include "exec/op_profile.h"
#include "model/op_profile.h"

namespace zinf::model {
namespace {

void Sleep(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

TEST(OpProfileTest, TheHostClockGivesEachOpTheTimeToTheNextMark) {
  HostOpProfile p;
  p.Mark("a");
  Sleep(0.02);
  p.Mark("b");
  Sleep(0.01);
  p.Mark("a");  // ops of one name add up
  Sleep(0.01);
  p.End();
  Sleep(0.12);  // after the end: nobody's
  int lost = -1;
  const auto ops = p.Take(&lost);
  EXPECT_EQ(lost, 0);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_GE(ops.at("a"), 0.03);
  EXPECT_LT(ops.at("a"), 0.12);  // not the time after End
  EXPECT_GE(ops.at("b"), 0.01);
  EXPECT_LT(ops.at("b"), 0.03 + 0.05);  // not a's second stretch (a loaded machine oversleeps)
  EXPECT_TRUE(p.Take().empty());  // taken once
}

TEST(OpProfileTest, StreamEventsTimeTheWorkEnqueuedBetweenMarks) {
  auto device = CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 1 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::unique_ptr<OpProfile> p = CreateOpProfile(**device, **stream);
  ASSERT_NE(dynamic_cast<HostOpProfile*>(p.get()), nullptr);  // the CPU model runs its ops inside a task
  EventOpProfile events(**device, **stream);
  auto task = [](double seconds) {
    return [seconds](const StreamContext&) {
      Sleep(seconds);
      return Status::Ok();
    };
  };
  // The marks return at once; the ops run later on the stream.
  const auto t0 = std::chrono::steady_clock::now();
  events.Mark("matmul");
  ASSERT_TRUE((*stream)->Enqueue(task(0.03)).ok());
  events.Mark("norm");
  ASSERT_TRUE((*stream)->Enqueue(task(0.01)).ok());
  events.End();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.03);
  ASSERT_TRUE((*stream)->Synchronize().ok());
  int lost = -1;
  const auto ops = events.Take(&lost);
  EXPECT_EQ(lost, 0);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_GE(ops.at("matmul"), 0.029);
  EXPECT_LT(ops.at("matmul"), 0.03 + 0.1);
  EXPECT_GE(ops.at("norm"), 0.009);
  EXPECT_LT(ops.at("norm"), 0.01 + 0.1);
  // An op never ended is not timed, and says so.
  events.Mark("attention");
  ASSERT_TRUE((*stream)->Enqueue(task(0.001)).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  const auto open = events.Take(&lost);
  EXPECT_TRUE(open.empty());
  EXPECT_EQ(lost, 1);
}

}  // namespace
}  // namespace zinf::model
