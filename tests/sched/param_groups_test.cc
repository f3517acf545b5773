// Parameter groups, frozen units and WriteState on HostDevice in checking
// mode, one rank and under mpirun: what a PyTorch trainer's param_groups,
// requires_grad=False and load_state_dict need from the engine.
//
//   - A tensor's group decides its weight decay and, once set, its lr: the
//     engine's update equals the CPU Adam applied per tensor with the
//     group's hyper-parameters, at every stage and tier, bit for bit.
//   - A frozen unit keeps its compute copy only: the trainable units end
//     exactly as in an engine that never had it, it has no optimizer state,
//     and a checkpoint carries its values.
//   - WriteState sets the parameters (master and compute copy) and keeps m
//     and v, on every tier.
//   - Broadcast copies a root's host bytes to every rank (what a value
//     written on one rank needs before WriteState), also across pieces and
//     with a tail shorter than a word, and refuses a bad root.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "common/float16.h"
#include "cpu/adam.h"
#include "cpu/host_device.h"
#include "cpu/mpi_comm.h"
#include "sched/engine_test_util.h"
#include "test_util.h"
#include "zinf/engine.h"

namespace zinf::sched {
namespace {

using test::Must;
using test::MustOk;
using test::Uniform;

// Units of a weight and a bias; the weight spans more than a norm block in
// unit 0 so that the groups' runs cross a shard boundary at 2 ranks.
struct TwoTensorUnits {
  std::vector<std::pair<int64_t, int64_t>> sizes{{70'000, 300}, {5'000, 40}, {200, 7}};
  int num_units() const { return static_cast<int>(sizes.size()); }
  static float Init(int u, int t, int64_t i) { return 0.2f * Uniform(7, u * 2 + t, i); }
  static float Grad(uint64_t g, int u, int64_t i) { return 0.01f * Uniform(41, g * 8 + u, i); }
  std::vector<ParamSpec> Specs(int u, std::vector<std::vector<float>>& keep, int weight_group, int bias_group) const {
    const auto [w, b] = sizes[u];
    keep.emplace_back(w);
    for (int64_t i = 0; i < w; ++i) keep.back()[i] = Init(u, 0, i);
    const float* wp = keep.back().data();
    keep.emplace_back(b);
    for (int64_t i = 0; i < b; ++i) keep.back()[i] = Init(u, 1, i);
    return {{"w", {w}, DType::kFloat32, wp, weight_group}, {"b", {b}, DType::kFloat32, keep.back().data(), bias_group}};
  }
  Status MicroStep(Engine& e, Stream& stream, uint64_t g, const std::vector<int>& trainable) const {
    for (int u = 0; u < e.num_units(); ++u) {
      ZINF_RETURN_IF_ERROR(e.Fetch(u, stream).status());
      ZINF_RETURN_IF_ERROR(e.Release(u, stream));
    }
    for (auto it = trainable.rbegin(); it != trainable.rend(); ++it) {
      const int u = *it;
      ZINF_RETURN_IF_ERROR(e.Fetch(u, stream).status());
      ZINF_ASSIGN_OR_RETURN(UnitPointers gp, e.GradBuffers(u));
      ZINF_RETURN_IF_ERROR(stream.Enqueue([g, u, gp](const StreamContext& ctx) {
        float* p = static_cast<float*>(ctx.Host(gp.data));
        for (int64_t i = 0; i < gp.num_elems; ++i) p[i] = Grad(g, u, i);
        return Status::Ok();
      }));
      ZINF_RETURN_IF_ERROR(e.GradsReady(u, stream));
      ZINF_RETURN_IF_ERROR(e.Release(u, stream));
    }
    return Status::Ok();
  }
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ParamGroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = Must(cpu::CreateMpiCommunicator(CommOptions{.timeout_seconds = 60, .checking = true}));
    device_ = Must(cpu::CreateHostDevice(DeviceOptions{
        .spec = "cpu", .memory_budget = 128 << 20, .checking = true, .seed = 5 + 7919ull * comm_->rank()}));
    stream_ = Must(device_->CreateStream());
  }
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }

  // fp32, constant lr, accumulation 2, no clipping: the update is the
  // per-tensor Adam on the mean gradient.
  Config Base(int stage) const {
    Config c;
    c.zero.stage = stage;
    c.zero.reduce_bucket_size = 2 * 65536 * world();
    c.zero.stage3_param_persistence_threshold = 0;
    c.gradient_accumulation_steps = 2;
    c.train_micro_batch_size_per_gpu = 1;
    c.optimizer.type = OptimizerType::kAdamW;
    c.optimizer.lr = 1e-2;
    c.optimizer.eps = 1e-6;
    c.optimizer.weight_decay = 0.3;
    return c;
  }
  std::vector<std::pair<std::string, Config>> Tiers() const {
    std::vector<std::pair<std::string, Config>> v;
    for (int stage : {0, 1, 2, 3}) v.emplace_back("stage " + std::to_string(stage), Base(stage));
    Config c = Base(2);
    c.zero.offload_optimizer.device = OffloadDevice::kCpu;
    v.emplace_back("stage 2, offload cpu", c);
    c = Base(3);
    c.zero.offload_optimizer.device = OffloadDevice::kNvme;
    c.zero.offload_optimizer.nvme_path = {test::TestDir()};
    c.zero.offload_optimizer.buffer_count = 2;
    c.zero.sub_group_size = 65536 * std::max(2, world());
    c.zero.offload_param.device = OffloadDevice::kNvme;
    c.zero.offload_param.nvme_path = {test::TestDir()};
    c.zero.offload_param.max_in_cpu = 0;
    v.emplace_back("stage 3, parameters and optimizer on nvme", c);
    return v;
  }
  // Every unit's state of `kind`; an empty vector for the units in `skip`.
  std::vector<std::vector<float>> Read(Engine& e, StateKind kind, const std::vector<int>& skip = {}) {
    std::vector<std::vector<float>> out;
    for (int u = 0; u < e.num_units(); ++u) {
      out.emplace_back();
      if (std::find(skip.begin(), skip.end(), u) != skip.end()) continue;
      out.back().resize(Must(e.unit_elems(u)));
      MustOk(e.ReadState(u, kind, out.back().data()));
    }
    return out;
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
};

// The weights in the config's group (decay 0.3), the biases in a group
// without decay whose lr is set to 4e-3 from step 3 on: the engine ends
// where the CPU Adam applied tensor by tensor with those hyper-parameters
// ends, on every stage and tier.
TEST_F(ParamGroupsTest, EachGroupGetsItsOwnDecayAndLr) {
  const TwoTensorUnits net;
  constexpr int kSteps = 4;
  // The reference: per tensor, Adam over the mean of each step's two
  // micro-steps' gradients summed over the ranks.
  std::vector<std::vector<float>> ref_w(3), ref_m(3), ref_v(3);
  for (int u = 0; u < 3; ++u) {
    const int64_t n = net.sizes[u].first + net.sizes[u].second;
    for (int64_t i = 0; i < n; ++i) {
      ref_w[u].push_back(i < net.sizes[u].first ? TwoTensorUnits::Init(u, 0, i)
                                                : TwoTensorUnits::Init(u, 1, i - net.sizes[u].first));
    }
    ref_m[u].assign(n, 0.0f);
    ref_v[u].assign(n, 0.0f);
  }
  tbb::task_arena arena(1);
  for (int step = 0; step < kSteps; ++step) {
    for (int u = 0; u < 3; ++u) {
      const int64_t n = static_cast<int64_t>(ref_w[u].size());
      // The engine sums in rank order, then micro-steps, and scales by
      // 1 / (world * 2) inside Adam.
      std::vector<float> sum(n, 0.0f);
      for (int k = 0; k < 2; ++k) {
        std::vector<float> reduced(n, 0.0f);
        for (int r = 0; r < world(); ++r) {
          const uint64_t g = (static_cast<uint64_t>(step) * 2 + k) * world() + r;
          for (int64_t i = 0; i < n; ++i) reduced[i] += TwoTensorUnits::Grad(g, u, i);
        }
        for (int64_t i = 0; i < n; ++i) sum[i] = k == 0 ? reduced[i] : sum[i] + reduced[i];
      }
      const int64_t w = net.sizes[u].first;
      for (int t = 0; t < 2; ++t) {
        cpu::AdamOptions o;
        o.lr = t == 0 || step < 2 ? 1e-2 : 4e-3;
        o.eps = 1e-6;
        o.weight_decay = t == 0 ? 0.3 : 0.0;
        const int64_t off = t == 0 ? 0 : w, len = t == 0 ? w : n - w;
        cpu::AdamBuffers b{ref_w[u].data() + off, ref_m[u].data() + off,   ref_v[u].data() + off,
                           sum.data() + off,      DType::kFloat32,         nullptr,
                           DType::kBFloat16,      static_cast<size_t>(len)};
        MustOk(cpu::AdamStep(arena, o, step + 1, 1.0 / (2.0 * world()), b));
      }
    }
  }
  for (const auto& [name, config] : Tiers()) {
    SCOPED_TRACE(name);
    auto e = Must(Engine::Create(config, *device_, comm_.get()));
    const int no_decay = Must(e->AddParamGroup({.weight_decay = 0.0, .lr = -1}));
    EXPECT_EQ(no_decay, 1);
    std::vector<std::vector<float>> keep;
    for (int u = 0; u < 3; ++u) (void)Must(e->AddUnit("u" + std::to_string(u), net.Specs(u, keep, 0, no_decay)));
    for (int step = 0; step < kSteps; ++step) {
      if (step == 2) MustOk(e->SetGroupLr(no_decay, 4e-3));
      for (int k = 0; k < 2; ++k) {
        MustOk(net.MicroStep(*e, *stream_, (static_cast<uint64_t>(step) * 2 + k) * world() + rank(), {0, 1, 2}));
        EXPECT_EQ(Must(e->Step()), k == 1);
      }
    }
    MustOk(stream_->Synchronize());
    const auto w = Read(*e, StateKind::kMaster), m = Read(*e, StateKind::kExpAvg), v = Read(*e, StateKind::kExpAvgSq);
    for (int u = 0; u < 3; ++u) {
      EXPECT_TRUE(SameBits(w[u], ref_w[u])) << "unit " << u << " master";
      EXPECT_TRUE(SameBits(m[u], ref_m[u])) << "unit " << u << " m";
      EXPECT_TRUE(SameBits(v[u], ref_v[u])) << "unit " << u << " v";
    }
  }
  // What the groups decide is really different: the config's decay on the
  // biases too gives other values.
  EXPECT_FALSE(ref_w[0].empty());
}

TEST_F(ParamGroupsTest, BadGroupsAreRefusedNamingThem) {
  if (world() > 1) GTEST_SKIP() << "one rank: with several a refused call stops every rank";
  auto e = Must(Engine::Create(Base(0), *device_, comm_.get()));
  EXPECT_EQ(e->AddParamGroup({.weight_decay = -1.0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->SetGroupLr(3, 1e-3).code(), StatusCode::kInvalidArgument);
  std::vector<std::vector<float>> keep;
  const TwoTensorUnits net;
  auto bad = e->AddUnit("u0", net.Specs(0, keep, 0, 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("parameter group 2"), std::string::npos) << bad.status().ToString();
}

// Unit 1 frozen between two trainable units: they end bit for bit as in an
// engine without it; its values never move; it has no optimizer state and
// no gradients; a checkpoint restores it (and the rest) into a fresh engine.
TEST_F(ParamGroupsTest, FrozenUnitsKeepOnlyTheirValues) {
  const TwoTensorUnits net;
  for (const auto& [name, config] : Tiers()) {
    SCOPED_TRACE(name);
    Config c = config;
    c.bf16.enabled = true;  // the compute copy is not the fp32 init: a frozen unit keeps its rounding
    auto run = [&](bool with_frozen, std::unique_ptr<Engine>* keep_engine) {
      auto e = Must(Engine::Create(c, *device_, comm_.get()));
      std::vector<std::vector<float>> keep;
      (void)Must(e->AddUnit("u0", net.Specs(0, keep, 0, 0)));
      if (with_frozen) (void)Must(e->AddUnit("u1", net.Specs(1, keep, 0, 0), UnitOptions{.frozen = true}));
      (void)Must(e->AddUnit("u2", net.Specs(2, keep, 0, 0)));
      const int last = with_frozen ? 2 : 1;
      for (int step = 0; step < 3; ++step) {
        for (int k = 0; k < 2; ++k) {
          // The trainable units' data is that of units 0 and 2 either way.
          const uint64_t g = (static_cast<uint64_t>(step) * 2 + k) * world() + rank();
          for (int u = 0; u < e->num_units(); ++u) {
            MustOk(e->Fetch(u, *stream_).status());
            MustOk(e->Release(u, *stream_));
          }
          for (int u : {last, 0}) {
            MustOk(e->Fetch(u, *stream_).status());
            UnitPointers gp = Must(e->GradBuffers(u));
            const int src = u == 0 ? 0 : 2;
            MustOk(stream_->Enqueue([g, src, gp](const StreamContext& ctx) {
              float* p = static_cast<float*>(ctx.Host(gp.data));
              for (int64_t i = 0; i < gp.num_elems; ++i) p[i] = TwoTensorUnits::Grad(g, src, i);
              return Status::Ok();
            }));
            MustOk(e->GradsReady(u, *stream_));
            MustOk(e->Release(u, *stream_));
          }
          EXPECT_EQ(Must(e->Step()), k == 1);
        }
      }
      MustOk(stream_->Synchronize());
      auto m = Read(*e, StateKind::kExpAvg, with_frozen ? std::vector<int>{1} : std::vector<int>{});
      auto master = Read(*e, StateKind::kMaster);
      if (keep_engine) *keep_engine = std::move(e);
      return std::make_pair(master, m);
    };
    std::unique_ptr<Engine> e;
    const auto [with_master, with_m] = run(true, &e);
    const auto [without_master, without_m] = run(false, nullptr);
    EXPECT_TRUE(SameBits(with_master[0], without_master[0]));
    EXPECT_TRUE(SameBits(with_master[2], without_master[1]));
    EXPECT_TRUE(SameBits(with_m[2], without_m[1]));
    // The frozen unit: its registration's bf16 rounding, unchanged.
    std::vector<float> want;
    for (int64_t i = 0; i < net.sizes[1].first; ++i)
      want.push_back(Bf16BitsToFloat(FloatToBf16Bits(TwoTensorUnits::Init(1, 0, i))));
    for (int64_t i = 0; i < net.sizes[1].second; ++i)
      want.push_back(Bf16BitsToFloat(FloatToBf16Bits(TwoTensorUnits::Init(1, 1, i))));
    EXPECT_TRUE(SameBits(with_master[1], want));
    if (world() == 1) {  // with several ranks a refused call stops every rank (rank_failures.h)
      std::vector<float> m(Must(e->unit_elems(1)));
      EXPECT_EQ(e->ReadState(1, StateKind::kExpAvg, m.data()).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(e->GradBuffers(1).status().code(), StatusCode::kInvalidArgument);
    }
    // A checkpoint keeps it; a fresh engine (other values) loads all of it.
    const std::string dir = test::TestDir() + "/frozen-ckpt-np" + std::to_string(world()) +
                            (cpu::StartedByMpiLauncher() ? "-mpi" : "-local");
    if (rank() == 0) std::filesystem::remove_all(dir);
    MustOk(comm_->Barrier(*stream_));
    MustOk(stream_->Synchronize());
    (void)Must(e->Save(dir));
    auto fresh = Must(Engine::Create(c, *device_, comm_.get()));
    std::vector<std::vector<float>> keep;
    auto specs = [&](int u) {
      auto s = net.Specs(u, keep, 0, 0);
      for (ParamSpec& p : s) p.init = nullptr;  // zeros
      return s;
    };
    (void)Must(fresh->AddUnit("u0", specs(0)));
    (void)Must(fresh->AddUnit("u1", specs(1), UnitOptions{.frozen = true}));
    (void)Must(fresh->AddUnit("u2", specs(2)));
    (void)Must(fresh->Load(dir));
    const auto loaded = Read(*fresh, StateKind::kMaster);
    for (int u = 0; u < 3; ++u) EXPECT_TRUE(SameBits(loaded[u], with_master[u])) << "unit " << u;
    // Loading it where unit 1 trains is refused, naming the unit.
    auto other = Must(Engine::Create(c, *device_, comm_.get()));
    (void)Must(other->AddUnit("u0", specs(0)));
    (void)Must(other->AddUnit("u1", specs(1)));
    (void)Must(other->AddUnit("u2", specs(2)));
    auto refused = other->Load(dir);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("'u1' is frozen there and trainable here"), std::string::npos)
        << refused.status().ToString();
    MustOk(stream_->Synchronize());
  }
}

// WriteState after a step: ReadState gives the values written (master) and
// their rounding (compute copy), m and v stay, and the next step starts from
// them on every tier.
TEST_F(ParamGroupsTest, WriteStateSetsTheParametersAndKeepsTheMoments) {
  const TwoTensorUnits net;
  for (const auto& [name, config] : Tiers()) {
    SCOPED_TRACE(name);
    Config c = config;
    c.bf16.enabled = true;
    auto e = Must(Engine::Create(c, *device_, comm_.get()));
    std::vector<std::vector<float>> keep;
    for (int u = 0; u < 3; ++u) (void)Must(e->AddUnit("u" + std::to_string(u), net.Specs(u, keep, 0, 0)));
    for (int k = 0; k < 2; ++k) {
      MustOk(net.MicroStep(*e, *stream_, static_cast<uint64_t>(k) * world() + rank(), {0, 1, 2}));
      (void)Must(e->Step());
    }
    MustOk(stream_->Synchronize());
    const auto m_before = Read(*e, StateKind::kExpAvg);
    std::vector<std::vector<float>> written;
    for (int u = 0; u < 3; ++u) {
      written.emplace_back(Must(e->unit_elems(u)));
      for (size_t i = 0; i < written[u].size(); ++i) written[u][i] = 0.5f * Uniform(77, u, i);
      MustOk(e->WriteState(u, StateKind::kMaster, written[u].data()));
    }
    const auto master = Read(*e, StateKind::kMaster), compute = Read(*e, StateKind::kComputeParams);
    const auto m_after = Read(*e, StateKind::kExpAvg);
    for (int u = 0; u < 3; ++u) {
      EXPECT_TRUE(SameBits(master[u], written[u])) << "unit " << u;
      std::vector<float> rounded = written[u];
      for (float& x : rounded) x = Bf16BitsToFloat(FloatToBf16Bits(x));
      EXPECT_TRUE(SameBits(compute[u], rounded)) << "unit " << u;
      EXPECT_TRUE(SameBits(m_after[u], m_before[u])) << "unit " << u;
    }
    if (world() == 1) {
      EXPECT_EQ(e->WriteState(0, StateKind::kExpAvg, written[0].data()).code(), StatusCode::kInvalidArgument);
    }
    // The next forward sees the new values.
    UnitPointers p = Must(e->Fetch(2, *stream_));
    std::vector<uint16_t> seen(p.num_elems);
    MustOk(stream_->Enqueue([p, &seen](const StreamContext& ctx) {
      std::memcpy(seen.data(), ctx.Host(p.data), seen.size() * 2);
      return Status::Ok();
    }));
    MustOk(stream_->Synchronize());
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], FloatToBf16Bits(written[2][i])) << i;
    MustOk(e->Release(2, *stream_));
    MustOk(stream_->Synchronize());
  }
}

// Broadcast: every root's bytes arrive whole on every rank (an odd length
// spanning several 16 MiB pieces), mid-training and before a step; a bad
// root and a call inside an accumulation window are refused.
TEST_F(ParamGroupsTest, BroadcastCopiesTheRootsBytesToEveryRank) {
  const TwoTensorUnits net;
  auto e = Must(Engine::Create(Base(3), *device_, comm_.get()));
  std::vector<std::vector<float>> keep;
  for (int u = 0; u < 3; ++u) (void)Must(e->AddUnit("u" + std::to_string(u), net.Specs(u, keep, 0, 0)));
  const size_t bytes = (size_t{33} << 20) + 3;
  auto pattern = [](int root, size_t i) { return static_cast<uint8_t>((i * 2654435761u >> 7) + root * 31); };
  std::vector<uint8_t> buf(bytes);
  for (int round = 0; round < 2; ++round) {
    for (int root = 0; root < world(); ++root) {
      for (size_t i = 0; i < bytes; ++i) buf[i] = rank() == root ? pattern(root, i) : 0xee;
      MustOk(e->Broadcast(buf.data(), bytes, root));
      size_t wrong = 0;
      for (size_t i = 0; i < bytes; ++i) wrong += buf[i] != pattern(root, i);
      EXPECT_EQ(wrong, 0u) << "root " << root << " round " << round;
    }
    MustOk(e->Broadcast(nullptr, 0, 0));  // a barrier
    MustOk(net.MicroStep(*e, *stream_, static_cast<uint64_t>(round) * world() + rank(), {0, 1, 2}));
    EXPECT_FALSE(Must(e->Step()));  // 1 of 2 micro-steps
    if (world() == 1) {             // refused calls stop every rank with several
      EXPECT_EQ(e->Broadcast(buf.data(), 8, 0).code(), StatusCode::kFailedPrecondition);
    }
    MustOk(net.MicroStep(*e, *stream_, static_cast<uint64_t>(round) * world() + rank() + 7, {0, 1, 2}));
    EXPECT_TRUE(Must(e->Step()));
  }
  if (world() == 1) {
    EXPECT_EQ(e->Broadcast(buf.data(), 8, 1).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e->Broadcast(nullptr, 8, 0).code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace zinf::sched
