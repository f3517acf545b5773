// The engine's per-step timeline (StepStats::timeline) and its readers
// (sched/timeline.h).
//
// The readers: a lane's busy time is the union of its spans within a
// period; a step's period is its stretch on the caller's stream; stalls are
// split by cause; the SVG has a bar per span.
//
// The engine on HostDevice: the caller's traced compute, the engine's
// updates, waits and copies land in the right step, each where it
// happened. Host-timed spans (updates) and event-timed spans (the caller's
// stall) share one clock: a stall on a held update ends when that update
// ends. With the optimizer on NVMe, the disk's busy stretches show.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "cpu/host_device.h"
#include "nvme/io_engine.h"
#include "sched/engine_testing.h"
#include "sched/timeline.h"
#include "sched/engine_test_util.h"
#include "test_util.h"
#include "zinf/engine.h"

namespace zinf::sched {
namespace {

using test::Must;
using test::MustOk;

using sched::LaneBusy;
using sched::StepTimeline;
using sched::SummarizeTimeline;

TimelineSpan S(const std::string& lane, const std::string& what, double a, double b) { return {lane, what, a, b}; }

TEST(TimelineReadTest, BusyIsTheUnionOfALanesSpansWithinThePeriod) {
  const std::vector<TimelineSpan> spans = {
      S("optimizer", "u0", 1.0, 2.0), S("optimizer", "u1", 1.5, 2.5),  // overlapping: 1.0-2.5
      S("optimizer", "u2", 3.0, 3.5),                                  // apart
      S("optimizer", "u3", 3.2, 3.3),                                  // inside the one before
      S("copy", "x", 0.0, 10.0),
  };
  std::map<std::string, double> busy = LaneBusy(spans, 0.0, 10.0);
  EXPECT_NEAR(busy["optimizer"], 1.5 + 0.5, 1e-12);
  EXPECT_NEAR(busy["copy"], 10.0, 1e-12);
  busy = LaneBusy(spans, 2.0, 3.25);  // clipped at both ends
  EXPECT_NEAR(busy["optimizer"], 0.5 + 0.25, 1e-12);
  EXPECT_NEAR(busy["copy"], 1.25, 1e-12);
  busy = LaneBusy(spans, 20.0, 30.0);
  EXPECT_EQ(busy["optimizer"], 0.0);
}

TEST(TimelineReadTest, AStepsPeriodIsItsStretchOnTheCallersStreamAndCountsOtherStepsSpans) {
  StepStats a, b;
  a.boundary = 1;
  a.timeline = {S("compute", "forward unit0", 0.0, 1.0), S("compute", "backward unit0", 1.0, 2.0),
                S("optimizer", "unit0", 2.0, 3.5)};  // runs into step 2's forward
  b.boundary = 2;
  b.timeline = {S("stall", "optimizer unit0", 2.1, 3.0), S("stall", "comm unit0", 3.0, 3.1),
                S("compute", "forward unit0", 3.1, 4.0), S("compute", "backward unit0", 4.0, 5.1),
                S("optimizer", "unit0", 5.1, 6.0)};
  const std::vector<StepTimeline> t = SummarizeTimeline({a, b});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].boundary, 1);
  EXPECT_DOUBLE_EQ(t[0].start, 0.0);
  EXPECT_DOUBLE_EQ(t[0].end, 2.0);
  EXPECT_NEAR(t[0].share("compute"), 1.0, 1e-12);
  EXPECT_EQ(t[0].share("optimizer"), 0.0);
  EXPECT_TRUE(t[0].stalls.empty());
  EXPECT_EQ(t[1].boundary, 2);
  EXPECT_DOUBLE_EQ(t[1].start, 2.1);  // its first stall opens it
  EXPECT_DOUBLE_EQ(t[1].end, 5.1);
  EXPECT_NEAR(t[1].busy.at("optimizer"), 3.5 - 2.1, 1e-12);  // step 1's update, within step 2's period
  EXPECT_NEAR(t[1].busy.at("compute"), 2.0, 1e-12);
  EXPECT_NEAR(t[1].stalls.at("optimizer"), 0.9, 1e-12);
  EXPECT_NEAR(t[1].stalls.at("comm"), 0.1, 1e-12);
  const std::string line = sched::FormatStepTimeline(t[1]);
  EXPECT_NE(line.find("compute 67%"), std::string::npos) << line;
  EXPECT_NE(line.find("optimizer 47%"), std::string::npos) << line;
  EXPECT_NE(line.find("disk 0%"), std::string::npos) << line;
  EXPECT_NE(line.find("stalled 1000.0 ms (comm 100.0 ms, optimizer 900.0 ms)"), std::string::npos) << line;

  StepStats none;  // no caller's spans: no period
  none.timeline = {S("optimizer", "unit0", 0, 1)};
  EXPECT_TRUE(SummarizeTimeline({none}).empty());
}

TEST(TimelineReadTest, TheSvgHasARowPerLaneAndABarPerSpan) {
  StepStats a;
  a.boundary = 7;
  a.timeline = {S("compute", "forward <unit0>", 0.0, 1.0), S("optimizer", "unit0", 0.5, 1.5),
                S("disk", "optimizer state", 0.2, 0.4)};
  const std::string svg = sched::TimelineSvg({a}, "t & t");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t bars = 0;
  for (size_t at = svg.find("<rect x="); at != std::string::npos; at = svg.find("<rect x=", at + 1)) ++bars;
  EXPECT_EQ(bars, 3u);
  EXPECT_NE(svg.find("forward &lt;unit0&gt;"), std::string::npos);
  EXPECT_NE(svg.find("t &amp; t"), std::string::npos);
  EXPECT_NE(svg.find("step 7"), std::string::npos);
  // The compute row comes first, then optimizer, then disk.
  EXPECT_LT(svg.find(">compute<"), svg.find(">optimizer<"));
  EXPECT_LT(svg.find(">optimizer<"), svg.find(">disk<"));
  // A window cuts spans outside it.
  const std::string cut = sched::TimelineSvg({a}, "t", 0.45, 2.0);
  bars = 0;
  for (size_t at = cut.find("<rect x="); at != std::string::npos; at = cut.find("<rect x=", at + 1)) ++bars;
  EXPECT_EQ(bars, 2u);

  // A name longer than any buffer keeps the markup after it.
  StepStats long_name;
  long_name.timeline = {S("compute\nlane", std::string(2000, 'x'), 0.0, 1.0)};
  const std::string whole = sched::TimelineSvg({long_name}, "t");
  EXPECT_NE(whole.find(std::string(2000, 'x') + ": 1000.000 ms at 0.000 s</title></rect>"), std::string::npos);
  EXPECT_NE(whole.find(">compute\nlane<"), std::string::npos);

  const Status bad = sched::WriteTimelineSvg("/nonexistent-dir/t.svg", {a}, "t");
  EXPECT_EQ(bad.code(), StatusCode::kIoError);
  EXPECT_NE(bad.message().find("/nonexistent-dir/t.svg"), std::string::npos) << bad.ToString();
}

TEST(IoEngineBusyTest, BusyStretchesCoverEachRequestAndAreTakenOnce) {
  auto io = Must(nvme::IoEngine::Create(nvme::IoEngineOptions{}));
  const std::string path = test::TestDir() + "/io_busy_" + std::to_string(::getpid());
  std::vector<char> data(1 << 20, 7);
  {
    std::ofstream f(path, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  nvme::FileOptions fo;
  fo.direct = false;
  fo.writable = false;
  auto file = Must(nvme::File::Open(path, fo));
  (void)io->TakeBusyIntervals();
  std::vector<char> back(data.size());
  const auto before = std::chrono::steady_clock::now();
  MustOk(io->Submit({nvme::IoOp{nvme::IoKind::kRead, file, 0, back.data(), back.size()}}).Wait());
  const auto after = std::chrono::steady_clock::now();
  const std::vector<nvme::IoBusyInterval> busy = io->TakeBusyIntervals();
  ASSERT_EQ(busy.size(), 1u);
  EXPECT_GE(busy[0].begin, before);
  EXPECT_LE(busy[0].begin, busy[0].end);
  EXPECT_LE(busy[0].end, after);
  EXPECT_GT(io->stats().busy_seconds, 0.0);
  EXPECT_TRUE(io->TakeBusyIntervals().empty());
  file.reset();
  std::filesystem::remove(path);
}

// The engine's timeline on HostDevice: 4 units, 2 steps' worth of work
// before the held one, compute traced as 2 ms tasks.
constexpr int kUnits = 4;
constexpr int64_t kElems = 50'000;
constexpr double kComputeSeconds = 0.002;
constexpr int64_t kHeldBoundary = 2;
constexpr auto kHold = std::chrono::milliseconds(40);

struct TimelineRun {
  std::vector<StepStats> steps;
};

TimelineRun RunEngine(const Config& config, bool serialize, bool hold, double compute_seconds = kComputeSeconds) {
  auto device = Must(cpu::CreateHostDevice(DeviceOptions{
      .spec = "cpu", .memory_budget = 64 << 20, .checking = true, .serialize_tasks = serialize, .seed = 3}));
  auto stream = Must(device->CreateStream());
  auto engine = Must(Engine::Create(config, *device));
  // The held update waits until the next step's first Fetch has returned
  // (so that Fetch found it unfinished and put a stall on the stream), then
  // holds for kHold; after 10 s it gives up, and the test fails on that.
  std::atomic<bool> fetched_past_held{false};
  std::atomic<bool> gate_timed_out{false};
  if (hold) {
    sched::testing::SetHostUpdateHook([&](int unit, int64_t boundary) {
      if (unit != 0 || boundary != kHeldBoundary) return;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!fetched_past_held) {
        if (std::chrono::steady_clock::now() > deadline) {
          gate_timed_out = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      std::this_thread::sleep_for(kHold);
    });
  }
  for (int u = 0; u < kUnits; ++u) {
    (void)Must(engine->AddUnit("unit" + std::to_string(u), {{"w", {kElems}, DType::kFloat32, nullptr}}));
  }
  auto compute = [&](const std::string& what) {
    MustOk(engine->Trace(*stream, "compute", what, [&] {
      return stream->Enqueue([compute_seconds](const StreamContext&) {
        std::this_thread::sleep_for(std::chrono::duration<double>(compute_seconds));
        return Status::Ok();
      });
    }));
  };
  const int steps = 4;
  for (int step = 0; step < steps; ++step) {
    for (int u = 0; u < kUnits; ++u) {
      (void)Must(engine->Fetch(u, *stream));
      if (step == kHeldBoundary && u == 0) fetched_past_held = true;
      compute("forward unit" + std::to_string(u));
      MustOk(engine->Release(u, *stream));
    }
    for (int u = kUnits - 1; u >= 0; --u) {
      (void)Must(engine->Fetch(u, *stream));
      const UnitPointers g = Must(engine->GradBuffers(u));
      MustOk(stream->Enqueue([g](const StreamContext& ctx) {
        float* p = static_cast<float*>(ctx.Host(g.data));
        for (int64_t i = 0; i < g.num_elems; ++i) p[i] = 1e-3f * static_cast<float>(i % 7);
        return Status::Ok();
      }));
      compute("backward unit" + std::to_string(u));
      MustOk(engine->GradsReady(u, *stream));
      MustOk(engine->Release(u, *stream));
    }
    EXPECT_TRUE(Must(engine->Step()));
  }
  MustOk(stream->Synchronize());
  MustOk(engine->Synchronize());
  if (hold) sched::testing::SetHostUpdateHook({});
  EXPECT_FALSE(gate_timed_out) << "the next step's first Fetch did not return while unit 0's update was held";
  TimelineRun run;
  for (int b = 1; b <= steps; ++b) run.steps.push_back(Must(engine->Stats(b)));
  return run;
}

std::vector<TimelineSpan> InLane(const StepStats& s, const std::string& lane) {
  std::vector<TimelineSpan> out;
  for (const TimelineSpan& t : s.timeline) {
    if (t.lane == lane) out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const TimelineSpan& a, const TimelineSpan& b) { return a.start < b.start; });
  return out;
}

Config OffloadConfig() {
  Config c;
  c.zero.stage = 0;
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  c.optimizer.lr = 1e-3;
  c.zinf.optimizer_threads = 1;
  return c;
}

class EngineTimelineTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Tasks, EngineTimelineTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Serialized" : "Concurrent"; });

TEST_P(EngineTimelineTest, EachStepHoldsItsComputeUpdatesAndCopiesWhereTheyHappened) {
  Config config = OffloadConfig();
  config.zinf.offload_zero_copy = false;  // the copies a GPU's memory needs
  const TimelineRun run = RunEngine(config, GetParam(), /*hold=*/false);
  for (const StepStats& s : run.steps) {
    SCOPED_TRACE("boundary " + std::to_string(s.boundary));
    EXPECT_EQ(s.timeline_dropped, 0);
    for (const TimelineSpan& t : s.timeline) {
      EXPECT_GE(t.start, 0.0) << t.lane << " " << t.what;
      EXPECT_GE(t.end, t.start) << t.lane << " " << t.what;
    }
    // The caller's compute: every traced task, in its order, none shorter
    // than its sleep, none overlapping the next (one stream).
    const std::vector<TimelineSpan> compute = InLane(s, "compute");
    ASSERT_EQ(compute.size(), 2u * kUnits);
    for (size_t i = 0; i < compute.size(); ++i) {
      const int u = i < kUnits ? static_cast<int>(i) : static_cast<int>(2 * kUnits - 1 - i);
      EXPECT_EQ(compute[i].what, std::string(i < kUnits ? "forward" : "backward") + " unit" + std::to_string(u));
      EXPECT_GE(compute[i].end - compute[i].start, kComputeSeconds * 0.95);
      if (i > 0) {
        EXPECT_GE(compute[i].start, compute[i - 1].end - 1e-6);
      }
    }
    // One update per unit, each after the step's backward of that unit.
    const std::vector<TimelineSpan> updates = InLane(s, "optimizer");
    ASSERT_EQ(updates.size(), static_cast<size_t>(kUnits));
    for (const TimelineSpan& up : updates) {
      const auto bwd = std::find_if(compute.begin(), compute.end(),
                                    [&](const TimelineSpan& c) { return c.what == "backward " + up.what; });
      ASSERT_NE(bwd, compute.end()) << up.what;
      EXPECT_GE(up.start, bwd->end - 5e-3) << up.what;  // the two clocks agree within milliseconds
    }
    // Each unit's new parameters go up after its update; the gradients down
    // during backward.
    EXPECT_FALSE(InLane(s, "copy").empty());
  }
  // The summary: each step's period spans its compute, whose busy time is
  // the compute spans' sum (they do not overlap); the rest of the period is
  // the stream's other work (gradients written, waits, the checking mode's
  // delays).
  const std::vector<StepTimeline> t = SummarizeTimeline(run.steps);
  ASSERT_EQ(t.size(), run.steps.size());
  for (size_t i = 0; i < t.size(); ++i) {
    double sum = 0;
    for (const TimelineSpan& c : InLane(run.steps[i], "compute")) sum += c.end - c.start;
    EXPECT_EQ(t[i].boundary, run.steps[i].boundary);
    EXPECT_NEAR(t[i].busy.at("compute"), sum, 1e-9);
    EXPECT_GE(t[i].seconds(), sum);
    EXPECT_GT(t[i].share("compute"), 0.0);
    EXPECT_LE(t[i].share("compute"), 1.0 + 1e-9);
  }
}

TEST_P(EngineTimelineTest, AStallOnAHeldUpdateEndsWhenTheUpdateDoes) {
  const TimelineRun run = RunEngine(OffloadConfig(), GetParam(), /*hold=*/true);
  const StepStats& held = run.steps[kHeldBoundary - 1];
  const StepStats& next = run.steps[kHeldBoundary];
  const std::vector<TimelineSpan> updates = InLane(held, "optimizer");
  const auto update0 =
      std::find_if(updates.begin(), updates.end(), [](const TimelineSpan& t) { return t.what == "unit0"; });
  ASSERT_NE(update0, updates.end());
  EXPECT_GE(update0->end - update0->start, 0.035);  // the hold is inside the update
  // The next forward's first Fetch returned while the update was held, so
  // it found the update unfinished: a stall of that step, ending with the
  // update (after its copy up) by the events' clock. How long the stall is
  // depends on when the stream got there (a loaded machine runs it late);
  // its end does not.
  const std::vector<TimelineSpan> stalls = InLane(next, "stall");
  const auto stall0 =
      std::find_if(stalls.begin(), stalls.end(), [](const TimelineSpan& t) { return t.what == "optimizer unit0"; });
  ASSERT_NE(stall0, stalls.end()) << "no stall on unit0's update in step " << next.boundary;
  EXPECT_GT(stall0->end, stall0->start);
  EXPECT_LE(stall0->start, update0->end);
  EXPECT_GE(stall0->end, update0->end - 3e-3);  // the clocks agree within milliseconds
  EXPECT_LE(stall0->end, update0->end + 0.05);
  // The summary puts it in that step, by cause: the stall spans' sum.
  double stalled_on_optimizer = 0;  // every step's, an upper bound on the union within this one
  for (const StepStats& step : run.steps) {
    for (const TimelineSpan& t : InLane(step, "stall")) {
      if (t.what.rfind("optimizer ", 0) == 0) stalled_on_optimizer += t.end - t.start;
    }
  }
  for (const StepTimeline& t : SummarizeTimeline(run.steps)) {
    if (t.boundary != next.boundary) continue;
    ASSERT_TRUE(t.stalls.count("optimizer"));
    EXPECT_GE(t.stalls.at("optimizer"), stall0->end - stall0->start);
    EXPECT_LE(t.stalls.at("optimizer"), stalled_on_optimizer + 1e-9);
    EXPECT_GT(t.busy.at("optimizer"), 0.02);  // the held update, inside this step's period
  }
}

// zinf.active_offload: the updates start during backward, so on the
// timeline the step's first updates begin before its last backward ends;
// without it every update begins after.
TEST_P(EngineTimelineTest, ActiveOffloadUpdatesOverlapBackward) {
  for (bool active : {false, true}) {
    SCOPED_TRACE(active ? "active offload" : "updates at the boundary");
    Config c = OffloadConfig();
    c.zinf.active_offload = active;
    // Backward long enough for an update to start within it.
    const TimelineRun run = RunEngine(c, GetParam(), /*hold=*/false, /*compute_seconds=*/0.02);
    for (const StepStats& s : run.steps) {
      SCOPED_TRACE("boundary " + std::to_string(s.boundary));
      const std::vector<TimelineSpan> compute = InLane(s, "compute"), updates = InLane(s, "optimizer");
      ASSERT_FALSE(compute.empty());
      ASSERT_EQ(updates.size(), static_cast<size_t>(kUnits));
      const double backward_end = compute.back().end;
      int before = 0;
      // (2 ms for the two clocks' agreement: at the boundary the first
      // update starts after backward's end, not within it.)
      for (const TimelineSpan& up : updates) before += up.start < backward_end - 2e-3;
      if (active) {
        EXPECT_GE(before, 1);
      } else {
        EXPECT_EQ(before, 0);
      }
    }
  }
}

// Trace in two calls (a framework's hooks): the work enqueued between
// TraceBegin and TraceEnd is the span; before the first Fetch the token is
// 0 and nothing is timed; a token ends once.
TEST(EngineTraceTest, BeginAndEndBracketTheWorkBetweenThem) {
  auto device = Must(cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 16 << 20}));
  auto stream = Must(device->CreateStream());
  auto engine = Must(Engine::Create(OffloadConfig(), *device));
  (void)Must(engine->AddUnit("unit0", {{"w", {kElems}, DType::kFloat32, nullptr}}));
  auto sleep = [](double seconds) {
    return [seconds](const StreamContext&) {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      return Status::Ok();
    };
  };
  const int64_t early = Must(engine->TraceBegin(*stream));
  EXPECT_EQ(early, 0);  // no origin before the first Fetch
  MustOk(engine->TraceEnd(early, *stream, "compute", "before"));
  (void)Must(engine->Fetch(0, *stream));
  const int64_t outer = Must(engine->TraceBegin(*stream));
  MustOk(stream->Enqueue(sleep(0.02)));
  const int64_t inner = Must(engine->TraceBegin(*stream));  // nested: each its own span
  MustOk(stream->Enqueue(sleep(0.03)));
  MustOk(engine->TraceEnd(inner, *stream, "compute", "inner"));
  MustOk(engine->TraceEnd(outer, *stream, "compute", "outer"));
  const int64_t odd = Must(engine->TraceBegin(*stream));
  MustOk(engine->TraceEnd(odd, *stream, "my\nlane", "odd"));  // any lane name is the caller's
  EXPECT_GT(outer, 0);
  EXPECT_NE(inner, outer);
  const Status again = engine->TraceEnd(inner, *stream, "compute", "inner");
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.ToString();
  EXPECT_EQ(engine->TraceEnd(12345, *stream, "compute", "x").code(), StatusCode::kInvalidArgument);
  const UnitPointers g = Must(engine->GradBuffers(0));
  (void)g;
  MustOk(engine->GradsReady(0, *stream));
  MustOk(engine->Release(0, *stream));
  EXPECT_TRUE(Must(engine->Step()));
  MustOk(stream->Synchronize());
  MustOk(engine->Synchronize());
  const StepStats s = Must(engine->Stats(1));
  std::map<std::string, double> seconds;
  for (const TimelineSpan& t : InLane(s, "compute")) seconds[t.what] = t.end - t.start;
  ASSERT_EQ(seconds.size(), 2u) << "the span begun before the first Fetch is not timed";
  ASSERT_EQ(InLane(s, "my\nlane").size(), 1u);
  EXPECT_EQ(InLane(s, "my\nlane")[0].what, "odd");
  EXPECT_GE(seconds["inner"], 0.029);
  EXPECT_GE(seconds["outer"], 0.049);
  EXPECT_GT(seconds["outer"], seconds["inner"]);
}

TEST(EngineTimelineNvmeTest, TheDisksBusyStretchesAndTheEnginesWaitsShow) {
  Config c = OffloadConfig();
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  c.zero.offload_optimizer.nvme_path = {test::TestDir()};
  c.zero.sub_group_size = kElems;  // a sub-group per unit
  const TimelineRun run = RunEngine(c, /*serialize=*/false, /*hold=*/false);
  double disk = 0;
  for (size_t i = 1; i < run.steps.size(); ++i) {
    const StepStats& s = run.steps[i];
    SCOPED_TRACE("boundary " + std::to_string(s.boundary));
    const std::vector<TimelineSpan> busy = InLane(s, "disk");
    EXPECT_FALSE(busy.empty());
    for (const TimelineSpan& t : busy) {
      EXPECT_EQ(t.what, "optimizer state");
      EXPECT_GE(t.start, 0.0);
      disk += t.end - t.start;
    }
    EXPECT_FALSE(InLane(s, "nvme wait").empty());
    EXPECT_EQ(InLane(s, "optimizer").size(), static_cast<size_t>(kUnits));
  }
  EXPECT_GT(disk, 0.0);
}

}  // namespace
}  // namespace zinf::sched
