// The op profiles of `zinf bench model --breakdown` (model/op_profile.h,
// exec/op_profile.h). The event profile, which the CUDA model uses, is
// device-generic: here it times tasks on a HostDevice stream between its
// marks, as it times kernels on a CUDA stream.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "cpu/host_device.h"
#include "exec/op_profile.h"
#include "model/op_profile.h"

namespace zinf::model {
namespace {

using exec::CreateOpProfile;
using exec::EventOpProfile;

void Sleep(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

TEST(OpProfileTest, TheHostClockGivesEachOpTheTimeToTheNextMark) {
  // Each op's time lies between the clock readings taken just outside its
  // two marks, however long a loaded machine oversleeps.
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  HostOpProfile p;
  Clock::time_point before[4], after[4];
  auto mark = [&](int i, const char* name) {
    before[i] = Clock::now();
    if (name != nullptr) {
      p.Mark(name);
    } else {
      p.End();
    }
    after[i] = Clock::now();
  };
  mark(0, "a");
  Sleep(0.02);
  mark(1, "b");
  Sleep(0.01);
  mark(2, "a");  // ops of one name add up
  Sleep(0.01);
  mark(3, nullptr);
  Sleep(0.05);  // after the end: nobody's
  int lost = -1;
  const auto ops = p.Take(&lost);
  EXPECT_EQ(lost, 0);
  ASSERT_EQ(ops.size(), 2u);
  const double a_min = seconds(after[0], before[1]) + seconds(after[2], before[3]);
  const double a_max = seconds(before[0], after[1]) + seconds(before[2], after[3]);
  EXPECT_GE(ops.at("a"), a_min);
  EXPECT_LE(ops.at("a"), a_max);  // neither b's stretch nor the time after End
  EXPECT_GE(ops.at("a"), 0.03);
  EXPECT_GE(ops.at("b"), seconds(after[1], before[2]));
  EXPECT_LE(ops.at("b"), seconds(before[1], after[2]));  // not a's second stretch
  EXPECT_GE(ops.at("b"), 0.01);
  EXPECT_TRUE(p.Take().empty());  // taken once
}

TEST(OpProfileTest, StreamEventsTimeTheWorkEnqueuedBetweenMarks) {
  auto device = cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 1 << 20});
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
  // The marks return at once; the ops run later on the stream. The stream
  // is held at a gate until everything is marked: marks that waited for
  // the stream would find the gate shut (and it opens by itself after 10 s).
  std::promise<void> open_gate;
  std::shared_future<void> gate = open_gate.get_future().share();
  std::atomic<bool> gate_timed_out{false};
  ASSERT_TRUE((*stream)
                  ->Enqueue([gate, &gate_timed_out](const StreamContext&) {
                    if (gate.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
                      gate_timed_out = true;
                    }
                    return Status::Ok();
                  })
                  .ok());
  events.Mark("matmul");
  ASSERT_TRUE((*stream)->Enqueue(task(0.03)).ok());
  events.Mark("norm");
  ASSERT_TRUE((*stream)->Enqueue(task(0.01)).ok());
  events.End();
  const auto released = std::chrono::steady_clock::now();
  open_gate.set_value();
  ASSERT_TRUE((*stream)->Synchronize().ok());
  const double whole = std::chrono::duration<double>(std::chrono::steady_clock::now() - released).count();
  EXPECT_FALSE(gate_timed_out) << "the marks waited for the stream's work";
  int lost = -1;
  const auto ops = events.Take(&lost);
  EXPECT_EQ(lost, 0);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_GE(ops.at("matmul"), 0.029);
  EXPECT_GE(ops.at("norm"), 0.009);
  EXPECT_LE(ops.at("matmul") + ops.at("norm"), whole);  // each op's own stretch, no more
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
