// The engine on a CudaDevice against the same run on HostDevice: every
// config below ends with the same master, m, v and compute copy, bit for bit,
// and the same per-step norm, loss scale and skip decisions. The client reads
// its parameters back and computes its gradients on the host, so the two runs
// see the same client math and differ only in the engine's device work (the
// CUDA accumulation, norm partials, Adam and cast kernels, the copies, the
// pinned-buffer registration). Skipped (not passed) without a CUDA device.
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/build_config.h"
#include "common/communicator.h"
#include "common/float16.h"
#include "common/logging.h"
#include "cpu/host_device.h"
#include "cpu/mpi_comm.h"
#include "gpu/cuda_device.h"
#include "sched/backends.h"
#include "gpu/cuda_host_register.h"
#include "gpu/cuda_probe.h"
#include "test_util.h"
#include "zinf/config.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using test::SplitMix64;

float Uniform(uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t bits = SplitMix64(a * 0x9e3779b97f4a7c15ull ^ SplitMix64(b * 1000003 + c));
  return static_cast<float>(bits >> 40) / 16777216.0f * 2.0f - 1.0f;
}

// Units of one, about two, part of, and several norm blocks; the gradient
// pulls each weight toward a fixed target, so each step's gradient depends on
// the parameters the previous update wrote.
struct HostMathClient {
  std::vector<int64_t> sizes{75'250, 200, 140'000, 9'000};

  void Register(Engine& e) const {
    for (size_t u = 0; u < sizes.size(); ++u) {
      std::vector<float> w(sizes[u]);
      for (size_t i = 0; i < w.size(); ++i) w[i] = 0.2f * Uniform(5, u, i);
      ASSERT_TRUE(e.AddUnit("unit" + std::to_string(u), {{"w", {sizes[u]}, DType::kFloat32, w.data()}}).ok());
    }
  }

  // Forward over `present`, backward in reverse; `poison` puts +inf into
  // unit 1's first gradient.
  Status MicroStep(Engine& e, Device& device, Stream& stream, uint64_t g, const std::vector<int>& present,
                   bool poison) {
    for (int u : present) {
      ZINF_RETURN_IF_ERROR(e.Fetch(u, stream).status());
      ZINF_RETURN_IF_ERROR(e.Release(u, stream));
    }
    ZINF_ASSIGN_OR_RETURN(const float scale, e.loss_scale());
    for (auto it = present.rbegin(); it != present.rend(); ++it) {
      const int u = *it;
      ZINF_ASSIGN_OR_RETURN(UnitPointers p, e.Fetch(u, stream));
      ZINF_ASSIGN_OR_RETURN(UnitPointers gp, e.GradBuffers(u));
      std::vector<uint8_t> w(p.num_elems * DTypeSizeBytes(p.dtype));
      ZINF_RETURN_IF_ERROR(device.CopyToHost(w.data(), p.data, w.size(), stream));
      ZINF_RETURN_IF_ERROR(stream.Synchronize());
      std::vector<float> grad(gp.num_elems);
      for (int64_t i = 0; i < gp.num_elems; ++i) {
        const float target = 0.3f * Uniform(6, u, i);
        grad[i] =
            scale * (0.5f * (test::LoadAsFloat(w.data(), p.dtype, i) - target) + 0.01f * Uniform(7, g * 16 + u, i));
      }
      if (poison && u == 1) grad[0] = INFINITY;
      ZINF_RETURN_IF_ERROR(device.CopyToDevice(gp.data, grad.data(), grad.size() * 4, stream));
      ZINF_RETURN_IF_ERROR(stream.Synchronize());  // `grad` dies here
      ZINF_RETURN_IF_ERROR(e.GradsReady(u, stream));
      ZINF_RETURN_IF_ERROR(e.Release(u, stream));
    }
    return Status::Ok();
  }
};

struct TrainedState {
  std::vector<std::vector<float>> state[4];  // by StateKind, per unit
  std::vector<StepStats> stats;
};

// Five steps of two micro-steps: the second micro-step of step 2 is poisoned
// (fp16: skipped, scale halved) on the last rank; unit 2 is missing from all
// of step 3. Each rank trains on its own micro-batches.
TrainedState Train(const Config& c, Device& device, Communicator* comm = nullptr) {
  TrainedState r;
  auto stream = device.CreateStream();
  EXPECT_TRUE(stream.ok()) << stream.status().ToString();
  auto engine = Engine::Create(c, device, comm);
  const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!stream.ok() || !engine.ok()) return r;
  Engine& e = **engine;
  HostMathClient client;
  client.Register(e);
  for (int step = 0; step < 5; ++step) {
    for (int k = 0; k < 2; ++k) {
      const std::vector<int> present = step == 3 ? std::vector<int>{0, 1, 3} : std::vector<int>{0, 1, 2, 3};
      const Status s = client.MicroStep(e, device, **stream, (step * 2 + k) * world + rank, present,
                                        step == 2 && k == 1 && rank == world - 1);
      EXPECT_TRUE(s.ok()) << s.ToString();
      auto boundary = e.Step();
      EXPECT_TRUE(boundary.ok()) << boundary.status().ToString();
      if (!s.ok() || !boundary.ok()) return r;
    }
    EXPECT_TRUE(e.Synchronize().ok());
    auto st = e.Stats();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (st.ok()) r.stats.push_back(*st);
  }
  EXPECT_TRUE(e.Synchronize().ok());
  for (int k = 0; k < 4; ++k) {
    for (size_t u = 0; u < client.sizes.size(); ++u) {
      std::vector<float> v(client.sizes[u]);
      const Status s = e.ReadState(static_cast<int>(u), static_cast<StateKind>(k), v.data());
      EXPECT_TRUE(s.ok()) << s.ToString();
      r.state[k].push_back(std::move(v));
    }
  }
  return r;
}

Config Base(int stage) {
  Config c;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 2 * 65536;
  c.zero.overlap_comm = true;
  c.zero.stage3_param_persistence_threshold = 0;
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 10;
  c.fp16.loss_scale_window = 3;
  c.fp16.hysteresis = 1;
  c.gradient_clipping = 0.5;
  c.gradient_accumulation_steps = 2;
  c.train_micro_batch_size_per_gpu = 1;
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.1;
  c.scheduler.type = SchedulerType::kWarmupDecayLR;
  c.scheduler.warmup_min_lr = 1e-3;
  c.scheduler.warmup_max_lr = 1e-2;
  c.scheduler.warmup_num_steps = 3;
  c.scheduler.warmup_type = WarmupType::kLinear;
  c.scheduler.total_num_steps = 20;
  return c;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class EngineOnCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(EngineOnCudaTest, EveryTierMatchesHostDeviceBitForBit) {
  struct Case {
    std::string name;
    Config config;
  };
  std::vector<Case> cases;
  for (int stage = 0; stage <= 3; ++stage) cases.push_back({"stage " + std::to_string(stage), Base(stage)});
  {
    Config c = Base(2);
    c.fp16.enabled = false;
    c.bf16.enabled = true;
    cases.push_back({"stage 2 bf16", c});
    c = Base(1);
    c.fp16.enabled = false;
    cases.push_back({"stage 1 fp32", c});
  }
  {
    Config c = Base(3);
    c.zero.offload_param.device = OffloadDevice::kCpu;
    cases.push_back({"stage 3 offload_param cpu", c});
    c.zero.offload_optimizer.device = OffloadDevice::kCpu;
    cases.push_back({"stage 3 offload_param cpu + offload_optimizer cpu", c});
  }
  {
    Config c = Base(1);
    c.zero.offload_optimizer.device = OffloadDevice::kCpu;
    cases.push_back({"stage 1 offload_optimizer cpu", c});
    c = Base(2);
    c.zero.offload_optimizer.device = OffloadDevice::kNvme;
    c.zero.offload_optimizer.nvme_path = {test::TestDir()};
    c.zero.offload_optimizer.buffer_count = 2;
    c.zero.sub_group_size = 3 * 65536;  // sub-groups of one or two units
    cases.push_back({"stage 2 offload_optimizer nvme", c});
    c.zinf.gradients = GradientHome::kNvme;  // the accumulated gradients swapped out and read back
    cases.push_back({"stage 2 offload_optimizer nvme, gradients nvme", c});
    c.zinf.aio.phased_swaps = false;
    cases.push_back({"stage 2 offload_optimizer nvme, gradients nvme, reads ahead beside writes", c});
    c.zinf.gradients = GradientHome::kAuto;
    c.zinf.aio.phased_swaps = true;
    c.zero.stage = 3;
    c.zero.offload_param.device = OffloadDevice::kCpu;
    cases.push_back({"stage 3 offload_param cpu + offload_optimizer nvme", c});
    c.zero.offload_param.device = OffloadDevice::kNvme;  // every shard in the parameter store
    c.zero.offload_param.nvme_path = {test::TestDir()};
    c.zero.offload_param.buffer_count = 2;
    c.zero.offload_param.max_in_cpu = 0;
    cases.push_back({"stage 3 offload_param nvme + offload_optimizer nvme", c});
    c.zinf.gradients = GradientHome::kNvme;
    cases.push_back({"stage 3 offload_param nvme + offload_optimizer nvme, gradients nvme", c});
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    auto host =
        cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 256 << 20, .checking = true, .seed = 3});
    auto cuda = gpu::CreateCudaDevice(0, DeviceOptions{.memory_budget = 256 << 20});
    ASSERT_TRUE(host.ok() && cuda.ok()) << host.status().ToString() << cuda.status().ToString();
    const TrainedState want = Train(k.config, **host);
    const TrainedState got = Train(k.config, **cuda);
    ASSERT_EQ(got.stats.size(), 5u);
    ASSERT_EQ(want.stats.size(), 5u);
    for (size_t s = 0; s < 5; ++s) {
      EXPECT_EQ(got.stats[s].skipped, want.stats[s].skipped) << "step " << s;
      EXPECT_EQ(got.stats[s].grad_norm, want.stats[s].grad_norm) << "step " << s;
      EXPECT_EQ(got.stats[s].loss_scale, want.stats[s].loss_scale) << "step " << s;
      EXPECT_EQ(got.stats[s].step, want.stats[s].step) << "step " << s;
    }
    if (k.config.fp16.enabled) {
      EXPECT_TRUE(got.stats[2].skipped) << "the poisoned step must be skipped";
    }
    for (int kind = 0; kind < 4; ++kind) {
      ASSERT_EQ(got.state[kind].size(), want.state[kind].size());
      for (size_t u = 0; u < want.state[kind].size(); ++u) {
        EXPECT_TRUE(SameBits(got.state[kind][u], want.state[kind][u])) << "state kind " << kind << ", unit " << u;
      }
    }
    // The run moved the state: a test of equal bits must not pass on two untouched copies.
    EXPECT_NE(want.state[0][0][0], 0.2f * Uniform(5, 0, 0));
  }
}

// With the optimizer offloaded to a CUDA device's host, the engine's pinned
// pool is placed by that GPU's PCI bus id: next to it where hwloc knows the
// GPU, otherwise the log names the GPU and why it fell back. (Without the
// bus id the pool would pick the caller's node and never name the GPU.)
TEST_F(EngineOnCudaTest, PinnedMemoryIsPlacedByTheGpusNumaNode) {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  Log().sinks().push_back(ring);
  // The placement is logged at info: the test sees it whatever ZINF_LOG_LEVEL says.
  struct RemoveSink {
    std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink;
    spdlog::level::level_enum level;
    ~RemoveSink() {
      auto& sinks = Log().sinks();
      sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
      Log().set_level(level);
    }
  } remove{ring, Log().level()};
  Log().set_level(spdlog::level::info);
  auto cuda = gpu::CreateCudaDevice(0, DeviceOptions{.memory_budget = 64 << 20});
  ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
  auto bus = gpu::CudaDevicePciBusId(0);
  ASSERT_TRUE(bus.ok()) << bus.status().ToString();
  Config c = Base(1);
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  auto engine = Engine::Create(c, **cuda, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::string placed;
  for (const std::string& line : ring->last_formatted()) {
    if (line.find("pinned host memory on NUMA node") != std::string::npos) placed = line;
  }
  EXPECT_NE(placed.find("GPU " + *bus), std::string::npos) << "log line: '" << placed << "'";
}

// Under mpirun with one GPU per rank: every stage with NCCL on CUDA devices
// ends with the same bits as the same ranks on host devices with MPI (the
// NCCL reductions add in rank order, as MPI's do).
TEST_F(EngineOnCudaTest, NcclRanksMatchMpiRanksBitForBit) {
  if (!sched::Built(OptionalBackend::kNccl)) GTEST_SKIP() << NotBuilt(OptionalBackend::kNccl).message();
  auto mpi = cpu::CreateMpiCommunicator(CommOptions{.timeout_seconds = 60, .checking = true});
  ASSERT_TRUE(mpi.ok()) << mpi.status().ToString();
  const int world = (*mpi)->size(), rank = (*mpi)->rank();
  if (world < 2) GTEST_SKIP() << "one rank: run under mpirun -np 2 or more";
  if (gpu::CudaDeviceCount() < world) {
    GTEST_SKIP() << "needs one GPU per rank: " << gpu::CudaDeviceCount() << " for " << world << " ranks";
  }
  auto nccl = sched::CreateCommunicator(sched::CommBackend::kNccl, CommOptions{.timeout_seconds = 60}, rank);
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  std::vector<Config> configs;
  for (int stage = 0; stage <= 3; ++stage) configs.push_back(Base(stage));
  configs.push_back(Base(2));
  configs.back().zero.offload_optimizer.device = OffloadDevice::kCpu;
  configs.push_back(Base(3));
  configs.back().zero.offload_param.device = OffloadDevice::kCpu;
  for (const Config& c : configs) {
    SCOPED_TRACE("stage " + std::to_string(c.zero.stage) +
                 (c.zero.offload_optimizer.device != OffloadDevice::kNone ? " + offload_optimizer cpu"
                  : c.zero.offload_param.device != OffloadDevice::kNone   ? " + offload_param cpu"
                                                                          : ""));
    auto host =
        cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 256 << 20, .checking = true, .seed = 3});
    auto cuda = gpu::CreateCudaDevice(rank, DeviceOptions{.memory_budget = 256 << 20});
    ASSERT_TRUE(host.ok() && cuda.ok()) << host.status().ToString() << cuda.status().ToString();
    const TrainedState want = Train(c, **host, mpi->get());
    const TrainedState got = Train(c, **cuda, nccl->get());
    ASSERT_EQ(got.stats.size(), want.stats.size());
    for (size_t s = 0; s < want.stats.size(); ++s) {
      EXPECT_EQ(got.stats[s].grad_norm, want.stats[s].grad_norm) << "step " << s;
      EXPECT_EQ(got.stats[s].skipped, want.stats[s].skipped) << "step " << s;
    }
    for (int kind = 0; kind < 4; ++kind) {
      for (size_t u = 0; u < want.state[kind].size(); ++u) {
        EXPECT_TRUE(SameBits(got.state[kind][u], want.state[kind][u])) << "state kind " << kind << ", unit " << u;
      }
    }
  }
}

}  // namespace
}  // namespace zinf
