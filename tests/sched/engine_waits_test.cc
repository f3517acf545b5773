// The engine in steady state never makes the host wait for the device: a
// training loop of Fetch, GradsReady, Release, loss_scale and Step blocks on
// nothing after its first step, in every stage and tier, with clipping or
// without. HostDevice in checking mode counts every host wait exactly
// (Device::wait_stats); the loop's results must equal a loop that
// synchronizes after every step. And the next forward's first Fetch waits
// only for its own unit's update. Both hold with the tasks of all streams
// serialized, as CUDA may run host functions.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/float16.h"
#include "cpu/host_device.h"
#include "sched/engine_test_util.h"
#include "test_util.h"
#include "sched/engine_testing.h"
#include "zinf/engine.h"

namespace zinf::sched {
namespace {

using test::Must;
using test::MustOk;
using test::Uniform;

// Units whose gradients are a fixed pattern of (micro-step, unit), written
// by a task on the client's stream as a backward kernel would.
constexpr int64_t kSizes[] = {75'250, 200, 140'000, 9'000};
constexpr int kUnits = 4;

struct Case {
  std::string name;
  Config config;
};

Config BaseConfig(int stage) {
  Config c;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 2 * 65536;
  c.gradient_accumulation_steps = 2;
  c.train_micro_batch_size_per_gpu = 1;
  c.optimizer.lr = 1e-2;
  c.zinf.optimizer_threads = 1;
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"stage 0", BaseConfig(0)});
  Config c1 = BaseConfig(1);
  c1.zero.offload_optimizer.device = OffloadDevice::kCpu;
  c1.gradient_clipping = 0.05;  // a global decision, made where the norms are
  cases.push_back({"stage 1, optimizer on cpu, clipping", c1});
  Config c2 = BaseConfig(2);
  c2.bf16.enabled = true;
  c2.zero.offload_optimizer.device = OffloadDevice::kCpu;
  cases.push_back({"stage 2, bf16, optimizer on cpu", c2});
  Config c3 = BaseConfig(3);
  c3.zero.stage3_param_persistence_threshold = 0;
  c3.zero.offload_param.device = OffloadDevice::kCpu;
  c3.zero.offload_optimizer.device = OffloadDevice::kNvme;
  c3.zero.offload_optimizer.nvme_path = {test::TestDir()};
  c3.zero.offload_optimizer.buffer_count = 2;
  c3.zero.sub_group_size = 2 * 65536;
  c3.gradient_clipping = 0.05;
  cases.push_back({"stage 3, parameters on cpu, optimizer on nvme, clipping", c3});
  return cases;
}

struct TrainRun {
  std::vector<std::vector<float>> masters;
  std::vector<StepStats> stats;
  uint64_t steady_blocking = 0, steady_draining = 0;
  bool first_fetch_passed_while_held = false;  // hold_last_update: what the hook saw
};

struct RunOptions {
  bool sync_each_step = false;
  // HostDevice runs the tasks of all streams one at a time, as CUDA may run
  // host functions.
  bool serialize_tasks = false;
  // The last unit's update at boundary 2 is held until the caller's stream
  // has passed the first Fetch of the next forward (10 s at most).
  bool hold_last_update = false;
};

constexpr int64_t kHeldBoundary = 2;

// `steps` optimizer steps; with `sync_each_step` the loop synchronizes and
// reads the step's metrics after every step, else it never waits and reads
// them all at the end.
TrainRun Train(const Config& config, int steps, const RunOptions& opt) {
  auto device = Must(cpu::CreateHostDevice(DeviceOptions{
      .spec = "cpu", .memory_budget = 128 << 20, .checking = true, .serialize_tasks = opt.serialize_tasks, .seed = 5}));
  auto stream = Must(device->CreateStream());
  auto engine = Must(Engine::Create(config, *device));
  // The hold: the hook polls an event the loop records on its stream right
  // after the next forward's first Fetch (never before it is armed).
  auto first_fetch_passed = Must(device->CreateEvent());
  std::atomic<bool> armed{false}, passed{false};
  if (opt.hold_last_update) {
    sched::testing::SetHostUpdateHook([&](int unit, int64_t boundary) {
      if (unit != kUnits - 1 || boundary != kHeldBoundary) return;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < until) {
        if (armed.load() && *first_fetch_passed->Query()) {
          passed = true;
          return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  for (int u = 0; u < kUnits; ++u) {
    std::vector<float> w(kSizes[u]);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * Uniform(5, u, i);
    (void)Must(engine->AddUnit("unit" + std::to_string(u), {{"w", {kSizes[u]}, DType::kFloat32, w.data()}}));
  }
  TrainRun run;
  DeviceWaitStats steady_start{};
  for (int step = 0; step < steps; ++step) {
    if (step == 1) steady_start = device->wait_stats();  // the first step sets up; steady state follows
    for (int k = 0; k < 2; ++k) {
      const uint64_t g = static_cast<uint64_t>(step) * 2 + k;
      for (int u = 0; u < kUnits; ++u) {
        (void)Must(engine->Fetch(u, *stream));
        if (opt.hold_last_update && step == kHeldBoundary && k == 0 && u == 0) {
          MustOk(first_fetch_passed->Record(*stream));
          armed = true;
        }
        MustOk(engine->Release(u, *stream));
      }
      const float scale = Must(engine->loss_scale());
      for (int u = kUnits - 1; u >= 0; --u) {
        (void)Must(engine->Fetch(u, *stream));
        const UnitPointers gp = Must(engine->GradBuffers(u));
        MustOk(stream->Enqueue([g, u, gp, scale](const StreamContext& ctx) {
          void* p = ctx.Host(gp.data);
          for (int64_t i = 0; i < gp.num_elems; ++i) {
            const float v = scale * 0.01f * Uniform(31, g * 16 + u, i);
            if (gp.dtype == DType::kFloat32)
              static_cast<float*>(p)[i] = v;
            else
              static_cast<uint16_t*>(p)[i] = FloatToBf16Bits(v);
          }
          return Status::Ok();
        }));
        MustOk(engine->GradsReady(u, *stream));
        MustOk(engine->Release(u, *stream));
      }
      EXPECT_EQ(Must(engine->Step()), k == 1);
    }
    if (opt.sync_each_step) {
      MustOk(engine->Synchronize());
      run.stats.push_back(Must(engine->Stats()));
      EXPECT_EQ(run.stats.back().behind, 0);
    }
  }
  const DeviceWaitStats steady_end = device->wait_stats();
  run.steady_blocking = steady_end.blocking - steady_start.blocking;
  run.steady_draining = steady_end.draining - steady_start.draining;
  if (!opt.sync_each_step) {
    const StepStats latest = Must(engine->Stats());  // no wait needed to ask
    EXPECT_LE(latest.boundary, steps);
    EXPECT_EQ(latest.behind, steps - latest.boundary);
    for (int b = 1; b <= steps; ++b) run.stats.push_back(Must(engine->Stats(b)));
  }
  MustOk(stream->Synchronize());
  MustOk(engine->Synchronize());
  if (opt.hold_last_update) sched::testing::SetHostUpdateHook({});
  run.first_fetch_passed_while_held = passed.load();
  for (int u = 0; u < kUnits; ++u) {
    std::vector<float> m(kSizes[u]);
    MustOk(engine->ReadState(u, StateKind::kMaster, m.data()));
    run.masters.push_back(std::move(m));
  }
  return run;
}

// Also with the tasks of all streams run one at a time, as CUDA may run host
// functions: no schedule here may need two tasks at once.
class EngineWaitsTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Tasks, EngineWaitsTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Serialized" : "Concurrent"; });

TEST_P(EngineWaitsTest, SteadyStateStepsNeverWaitOnTheDevice) {
  constexpr int kSteps = 5;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const TrainRun free_running = Train(c.config, kSteps, {.serialize_tasks = GetParam()});
    EXPECT_EQ(free_running.steady_blocking, 0u) << "host waits in steps 2-" << kSteps;
    EXPECT_EQ(free_running.steady_draining, 0u);
    const TrainRun synced = Train(c.config, kSteps, {.sync_each_step = true, .serialize_tasks = GetParam()});
    EXPECT_GE(synced.steady_draining, 1u) << "the counter must see a loop that does wait";
    ASSERT_EQ(free_running.stats.size(), synced.stats.size());
    for (size_t i = 0; i < synced.stats.size(); ++i) {
      EXPECT_EQ(free_running.stats[i].boundary, static_cast<int64_t>(i) + 1);
      EXPECT_EQ(free_running.stats[i].boundary, synced.stats[i].boundary);
      EXPECT_EQ(free_running.stats[i].grad_norm, synced.stats[i].grad_norm) << "boundary " << i + 1;
      EXPECT_EQ(free_running.stats[i].clip_coef, synced.stats[i].clip_coef);
    }
    for (int u = 0; u < kUnits; ++u) {
      EXPECT_EQ(std::memcmp(free_running.masters[u].data(), synced.masters[u].data(), kSizes[u] * 4), 0)
          << "unit " << u;
    }
  }
}

// The next forward's first Fetch waits only for its own unit's update: with
// the last unit's update held back, the caller's stream still gets past the
// first unit's Fetch (no host code of the engine sits on the caller's stream
// to queue behind the held update, even with the tasks serialized). Had the
// Fetch waited for the whole step, the hook would time out after 10 s. The
// results equal a run without the hold.
TEST_P(EngineWaitsTest, TheNextForwardsFirstFetchWaitsOnlyForItsOwnUnitsUpdate) {
  constexpr int kSteps = 4;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const TrainRun held = Train(c.config, kSteps, {.serialize_tasks = GetParam(), .hold_last_update = true});
    EXPECT_TRUE(held.first_fetch_passed_while_held);
    const TrainRun plain = Train(c.config, kSteps, {.serialize_tasks = GetParam()});
    for (int u = 0; u < kUnits; ++u) {
      EXPECT_EQ(std::memcmp(held.masters[u].data(), plain.masters[u].data(), kSizes[u] * 4), 0) << "unit " << u;
    }
  }
}

// Stats(boundary) refuses what it cannot have, and Stats() before any step.
TEST(EngineStatsTest, StatsOfABoundaryNotKeptOrNotYetEnqueuedIsOutOfRange) {
  auto device =
      Must(cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 64 << 20, .checking = true, .seed = 6}));
  auto stream = Must(device->CreateStream());
  auto engine = Must(Engine::Create(BaseConfig(0), *device));
  std::vector<float> w(1000, 0.5f);
  (void)Must(engine->AddUnit("u", {{"w", {1000}, DType::kFloat32, w.data()}}));
  EXPECT_EQ(engine->Stats().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->Stats(1).status().code(), StatusCode::kOutOfRange);
  for (int k = 0; k < 2; ++k) {
    (void)Must(engine->Fetch(0, *stream));
    (void)Must(engine->GradBuffers(0));
    MustOk(engine->GradsReady(0, *stream));
    MustOk(engine->Release(0, *stream));
    (void)Must(engine->Step());
  }
  EXPECT_EQ(Must(engine->Stats()).boundary, 1);  // waits for the first step only
  EXPECT_EQ(Must(engine->Stats(1)).boundary, 1);
  EXPECT_EQ(engine->Stats(2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(engine->Stats(0).status().code(), StatusCode::kOutOfRange);
  MustOk(stream->Synchronize());
}

}  // namespace
}  // namespace zinf::sched
