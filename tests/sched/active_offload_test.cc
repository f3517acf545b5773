// zinf.active_offload: with the optimizer in host memory and no global value
// needed by the update (no clipping, no fp16 loss scale), each unit's Adam
// starts as soon as its gradient of the window's last micro-step is
// accumulated and the unit is released, during backward. Tested on the host
// device in checking mode: the updates begin before Step() is called (and
// never do without the key), the parameters are bit-identical to the same
// run with updates at the boundary and to the optimizer on the device, a
// non-finite norm stops the engine, and the key is refused where it cannot
// hold. The same binary runs under mpirun (2 and 4 ranks), each rank with its
// own gradients, in checking mode: the communicator compares every
// collective's kind and order across the ranks, so a collective enqueued
// out of turn on one rank (a new shard's all-gather, say) fails the run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/float16.h"
#include "cpu/host_device.h"
#include "cpu/mpi_comm.h"
#include "sched/engine_testing.h"
#include "sched/engine_test_util.h"
#include "test_util.h"
#include "zinf/engine.h"

namespace zinf::sched {
namespace {

using test::Must;
using test::MustOk;
using test::Uniform;

constexpr int64_t kSizes[] = {75'250, 200, 140'000, 9'000};
constexpr int kUnits = 4;
constexpr int kMicro = 2;

Config Parse(const std::string& json) { return Must(ParseConfig(json)); }

// Every rank of an mpirun, or one rank without it. After the ranks stopped
// together (a non-finite norm), the broken communicator is replaced. The
// last one is never destroyed: MPI is finalized at exit, before statics go.
Communicator& Comm() {
  static auto* comm = new std::unique_ptr<Communicator>;
  if (!*comm || !(*comm)->Health().ok()) {
    *comm = Must(cpu::CreateMpiCommunicator(CommOptions{.timeout_seconds = 60, .checking = true}));
  }
  return **comm;
}

// `extra` goes inside zero_optimization; `top` at the top level.
std::string ConfigJson(int stage, const std::string& offload, bool bf16, bool active, const std::string& extra = "",
                       const std::string& top = "") {
  std::string j = R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 3}},
    "zinf": {"device": "cpu", "optimizer_threads": 1, "active_offload": )" +
                  std::string(active ? "true" : "false") + R"(},
    "bf16": {"enabled": )" +
                  std::string(bf16 ? "true" : "false") + R"(},
    "zero_optimization": {"stage": )" +
                  std::to_string(stage) + R"(, "reduce_bucket_size": 131072, "offload_optimizer": {"device": ")" +
                  offload + R"("})" + extra + "}" + top + "}";
  return j;
}

struct TrainResult {
  std::vector<std::vector<float>> masters;
  int boundaries_updated_before_step = 0;  // boundaries whose first update began before Step()
  Status failure;                          // the first failed call, when `nan_step` poisons a gradient
};

// `steps` optimizer steps of kMicro micro-steps. Before each boundary's
// Step() the loop waits up to `wait_ms` for the hook to report that the
// last unit's update (the first backward finishes) has begun. With
// `nan_step` >= 0, that step's last micro-step gives unit 1 a NaN gradient.
TrainResult Train(const Config& config, int steps, int wait_ms, int nan_step = -1) {
  const int rank = Comm().rank();
  auto device = Must(cpu::CreateHostDevice(
      DeviceOptions{.spec = "cpu", .memory_budget = 128 << 20, .checking = true, .seed = 9 + 7919ull * rank}));
  auto stream = Must(device->CreateStream());
  auto engine = Must(Engine::Create(config, *device, &Comm()));
  std::atomic<int64_t> started_boundary{0};  // the latest boundary whose last unit's update began
  sched::testing::SetHostUpdateHook([&](int unit, int64_t boundary) {
    if (unit == kUnits - 1) started_boundary = boundary;
  });
  for (int u = 0; u < kUnits; ++u) {
    std::vector<float> w(kSizes[u]);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * Uniform(7, u, i);
    (void)Must(engine->AddUnit("unit" + std::to_string(u), {{"w", {kSizes[u]}, DType::kFloat32, w.data()}}));
  }
  TrainResult run;
  // With a poisoned step the engine stops, on every rank, at whichever call
  // comes next (a peer's stop reaches a rank as Unavailable): the first
  // failure is kept and the run ends. Without one, every call must succeed.
  auto ok = [&](const Status& s) {
    if (s.ok()) return true;
    EXPECT_GE(nan_step, 0) << s.ToString();
    if (run.failure.ok()) run.failure = s;
    return false;
  };
  for (int step = 0; step < steps && run.failure.ok(); ++step) {
    for (int k = 0; k < kMicro && run.failure.ok(); ++k) {
      const uint64_t g = static_cast<uint64_t>(step) * kMicro + k;
      bool going = true;
      for (int u = 0; u < kUnits && going; ++u) {
        going = ok(engine->Fetch(u, *stream).status()) && ok(engine->Release(u, *stream));
      }
      for (int u = kUnits - 1; u >= 0 && going; --u) {
        if (!ok(engine->Fetch(u, *stream).status())) break;
        const Result<UnitPointers> grads = engine->GradBuffers(u);
        if (!ok(grads.status())) break;
        const UnitPointers gp = *grads;
        const bool poison = step == nan_step && k == kMicro - 1 && u == 1;
        MustOk(stream->Enqueue([g, u, gp, poison, rank](const StreamContext& ctx) {
          void* p = ctx.Host(gp.data);
          for (int64_t i = 0; i < gp.num_elems; ++i) {
            float v = 0.01f * Uniform(33 + rank, g * 16 + u, i);
            if (poison && i == 7) v = std::numeric_limits<float>::quiet_NaN();
            if (gp.dtype == DType::kFloat32)
              static_cast<float*>(p)[i] = v;
            else
              static_cast<uint16_t*>(p)[i] = FloatToBf16Bits(v);
          }
          return Status::Ok();
        }));
        going = ok(engine->GradsReady(u, *stream)) && ok(engine->Release(u, *stream));
      }
      if (!going) break;
      if (k == kMicro - 1 && wait_ms > 0) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
        while (started_boundary.load() < step + 1 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        if (started_boundary.load() >= step + 1) ++run.boundaries_updated_before_step;
      }
      Result<bool> stepped = engine->Step();
      if (ok(stepped.status())) {
        EXPECT_EQ(*stepped, k == kMicro - 1);
      }
    }
    if (nan_step >= 0 && run.failure.ok()) (void)engine->Synchronize();  // the decision is made by now
  }
  (void)stream->Synchronize();
  (void)engine->Synchronize();
  sched::testing::SetHostUpdateHook({});
  if (run.failure.ok()) {
    for (int u = 0; u < kUnits; ++u) {
      std::vector<float> m(kSizes[u]);
      MustOk(engine->ReadState(u, StateKind::kMaster, m.data()));
      run.masters.push_back(std::move(m));
    }
  }
  return run;
}

void ExpectSameMasters(const TrainResult& a, const TrainResult& b) {
  ASSERT_EQ(a.masters.size(), static_cast<size_t>(kUnits));
  ASSERT_EQ(b.masters.size(), static_cast<size_t>(kUnits));
  for (int u = 0; u < kUnits; ++u) {
    EXPECT_EQ(std::memcmp(a.masters[u].data(), b.masters[u].data(), kSizes[u] * 4), 0) << "unit " << u;
  }
}

struct Shape {
  std::string name;
  int stage;
  bool bf16;
  std::string extra;
};

std::vector<Shape> Shapes() {
  return {{"stage 0, fp32", 0, false, ""},
          {"stage 1, fp32", 1, false, ""},
          {"stage 2, bf16", 2, true, ""},
          {"stage 3, bf16, parameters in host memory", 3, true,
           R"(, "stage3_param_persistence_threshold": 0, "offload_param": {"device": "cpu"})"}};
}

TEST(ActiveOffloadTest, UpdatesBeginDuringBackwardWithTheSameBits) {
  constexpr int kSteps = 4;
  for (const Shape& s : Shapes()) {
    SCOPED_TRACE(s.name);
    const TrainResult active =
        Train(Parse(ConfigJson(s.stage, "cpu", s.bf16, true, s.extra)), kSteps, /*wait_ms=*/10000);
    EXPECT_EQ(active.boundaries_updated_before_step, kSteps) << "an update began before Step() at every boundary";
    // The control: at the boundary, no update can begin before Step().
    const TrainResult boundary =
        Train(Parse(ConfigJson(s.stage, "cpu", s.bf16, false, s.extra)), kSteps, /*wait_ms=*/200);
    EXPECT_EQ(boundary.boundaries_updated_before_step, 0);
    ExpectSameMasters(active, boundary);
    // And the optimizer on the device (offload none) takes the same steps.
    const std::string extra = s.stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "";
    const TrainResult none = Train(Parse(ConfigJson(s.stage, "none", s.bf16, false, extra)), kSteps, 0);
    ExpectSameMasters(active, none);
  }
}

// A non-finite gradient would skip the step; the units updated during
// backward cannot be skipped, so the engine stops, naming why and where to
// resume.
TEST(ActiveOffloadTest, ANonFiniteGradientNormStopsTheEngine) {
  const TrainResult r = Train(Parse(ConfigJson(2, "cpu", true, true)), 4, 0, /*nan_step=*/1);
  ASSERT_FALSE(r.failure.ok());
  // Here, or at a peer whose stop reached this rank first ("rank R stopped: ...").
  if (r.failure.code() == StatusCode::kUnavailable && Comm().size() > 1) {
    EXPECT_NE(r.failure.message().find(" stopped: FailedPrecondition: "), std::string::npos) << r.failure.ToString();
  } else {
    EXPECT_EQ(r.failure.code(), StatusCode::kFailedPrecondition) << r.failure.ToString();
  }
  EXPECT_NE(r.failure.message().find("optimizer step 2 is not finite"), std::string::npos) << r.failure.message();
  EXPECT_NE(r.failure.message().find("resume from the last complete checkpoint"), std::string::npos);
  // Without the key the step is skipped and training goes on.
  const TrainResult skipped = Train(Parse(ConfigJson(2, "cpu", true, false)), 4, 0, /*nan_step=*/1);
  EXPECT_TRUE(skipped.failure.ok()) << skipped.failure.ToString();
}

TEST(ActiveOffloadTest, TheKeyIsRefusedWhereTheUpdateNeedsAGlobalValue) {
  auto device = Must(cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 16 << 20}));
  auto refused = [&](const std::string& json, const std::string& needle) {
    auto e = Engine::Create(Parse(json), *device);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("zinf.active_offload needs " + needle), std::string::npos)
        << e.status().message();
  };
  refused(ConfigJson(2, "none", true, true), "zero_optimization.offload_optimizer.device = \"cpu\"");
  refused(ConfigJson(2, "cpu", true, true, "", R"(, "gradient_clipping": 1.0)"), "gradient_clipping = 0");
  refused(ConfigJson(2, "cpu", false, true, "", R"(, "fp16": {"enabled": true})"), "no fp16");
}

// A unit fetched again after its gradients were ready in the last
// micro-step would see its update: refused.
TEST(ActiveOffloadTest, AFetchAfterGradsReadyInTheLastMicroStepIsRefused) {
  auto device = Must(cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 16 << 20, .checking = true}));
  auto stream = Must(device->CreateStream());
  Config c = Parse(ConfigJson(0, "cpu", false, true));
  c.gradient_accumulation_steps = 1;
  auto engine = Must(Engine::Create(c, *device));
  std::vector<float> w(1000, 0.5f);
  (void)Must(engine->AddUnit("u", {{"w", {1000}, DType::kFloat32, w.data()}}));
  (void)Must(engine->Fetch(0, *stream));
  (void)Must(engine->GradBuffers(0));
  MustOk(engine->GradsReady(0, *stream));
  MustOk(engine->Release(0, *stream));
  auto again = engine->Fetch(0, *stream);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("zinf.active_offload"), std::string::npos) << again.status().message();
  MustOk(stream->Synchronize());
  MustOk(engine->Synchronize());
}

}  // namespace
}  // namespace zinf::sched
