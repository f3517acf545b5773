// Ranks that stop together (sched/rank_failures.h), under mpirun with 2 and
// 4 ranks: a failure on the last rank alone, in the middle of a step, must
// reach every other rank within seconds (not the 60 s deadline), naming the
// rank and its cause, and every later step call on every rank must refuse.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "common/fault_injection.h"
#include "cpu/host_device.h"
#include "cpu/mpi_comm.h"
#include "test_util.h"
#include "zinf/engine.h"

namespace zinf::sched {
namespace {

template <typename T>
T Must(Result<T> r) {
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return std::move(*r);
}

constexpr int64_t kElems = 70'000;  // a few norm blocks per rank's shard

class RankFailuresTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    comm_ = Must(cpu::CreateMpiCommunicator(CommOptions{.timeout_seconds = 60, .checking = true}));
    if (comm_->size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
    device_ = Must(cpu::CreateHostDevice(
        DeviceOptions{.spec = "cpu", .memory_budget = 64 << 20, .checking = true, .seed = 11 + 31ull * rank()}));
    stream_ = Must(device_->CreateStream());
    Config c;
    c.zero.stage = GetParam();
    c.zero.stage3_param_persistence_threshold = 0;
    c.train_micro_batch_size_per_gpu = 1;
    c.gradient_accumulation_steps = 1;
    c.zinf.stop_on_nonfinite_loss = true;
    engine_ = Must(Engine::Create(c, *device_, comm_.get()));
    for (int u = 0; u < 3; ++u) {
      std::vector<float> w(kElems, 0.01f * (u + 1));
      (void)Must(engine_->AddUnit("unit" + std::to_string(u), {{"w", {kElems}, DType::kFloat32, w.data()}}));
    }
  }
  void TearDown() override { fault::SetPlanForTesting(""); }

  int rank() const { return comm_->rank(); }
  int victim() const { return comm_->size() - 1; }

  // One micro-step and its boundary: forward over the units, backward in
  // reverse with a constant gradient, the loss reported, Step, Synchronize.
  // The first failure.
  Status Step(double loss = 1.0) {
    for (int u = 0; u < 3; ++u) {
      ZINF_RETURN_IF_ERROR(engine_->Fetch(u, *stream_).status());
      ZINF_RETURN_IF_ERROR(engine_->Release(u, *stream_));
    }
    for (int u = 2; u >= 0; --u) {
      ZINF_RETURN_IF_ERROR(engine_->Fetch(u, *stream_).status());
      ZINF_ASSIGN_OR_RETURN(UnitPointers g, engine_->GradBuffers(u));
      ZINF_RETURN_IF_ERROR(stream_->Enqueue([g](const StreamContext& ctx) {
        float* p = static_cast<float*>(ctx.Host(g.data));
        for (int64_t i = 0; i < g.num_elems; ++i) p[i] = 1e-3f;
        return Status::Ok();
      }));
      ZINF_RETURN_IF_ERROR(engine_->GradsReady(u, *stream_));
      ZINF_RETURN_IF_ERROR(engine_->Release(u, *stream_));
    }
    ZINF_RETURN_IF_ERROR(engine_->ReportLoss(loss));
    ZINF_RETURN_IF_ERROR(engine_->Step().status());
    ZINF_RETURN_IF_ERROR(engine_->Synchronize());
    return stream_->Synchronize();
  }

  // Every rank: the failure names the victim and `cause`, came within a few
  // seconds, and every later step call refuses with it.
  void ExpectStoppedTogether(const Status& st, double seconds, const std::string& cause) {
    ASSERT_FALSE(st.ok()) << "rank " << rank() << " went on after rank " << victim() << " failed";
    if (rank() != victim()) {
      EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
      const std::string named = "rank " + std::to_string(victim()) + " stopped: " + cause;
      EXPECT_NE(st.message().find(named), std::string::npos) << "want '" << named << "' in " << st.ToString();
    } else {
      EXPECT_NE(st.ToString().find(cause), std::string::npos) << st.ToString();
    }
    EXPECT_LT(seconds, 10.0) << "the notice should end the wait, not the 60 s deadline";
    Status again = engine_->Fetch(0, *stream_).status();
    EXPECT_FALSE(again.ok());
    EXPECT_NE(again.message().find("stopped together"), std::string::npos) << again.ToString();
    EXPECT_FALSE(engine_->Step().ok());
    EXPECT_FALSE(engine_->Save(test::TestDir() + "/never").ok()) << "a stopped engine must not save";
  }

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Engine> engine_;
};

TEST_P(RankFailuresTest, AFailedCallOnOneRankStopsEveryRank) {
  ASSERT_TRUE(Step().ok());
  ASSERT_TRUE(Step().ok());
  const auto t0 = std::chrono::steady_clock::now();
  Status st;
  if (rank() == victim()) {
    st = engine_->GradBuffers(99).status();  // a bad call, on this rank only
  } else {
    st = Step();  // waits in a collective the victim never joins
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ExpectStoppedTogether(st, s, "InvalidArgument");
}

TEST_P(RankFailuresTest, AnAllocationFailureOnOneRankStopsEveryRank) {
  // The first step allocates (gradients, buckets; stage 3 gathers every step).
  if (rank() == victim()) {
    ASSERT_TRUE(fault::SetPlanForTesting("alloc:1"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status st = Step();
  if (st.ok()) st = Step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ExpectStoppedTogether(st, s, "OutOfMemory");
}

// zinf.stop_on_nonfinite_loss: a NaN loss on one rank stops them all.
TEST_P(RankFailuresTest, ANonFiniteLossOnOneRankStopsEveryRank) {
  ASSERT_TRUE(Step().ok());
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = Step(rank() == victim() ? std::nan("") : 2.0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ExpectStoppedTogether(st, s, "FailedPrecondition: the loss is nan");
}

// A rank that stops inside a save without joining the agreement on the
// written files: every peer names it, and rank 0 leaves step-N.tmp where it
// is (a slower peer may still be writing there; the next save removes it).
TEST_P(RankFailuresTest, ARankThatDropsOutOfASaveIsNamedAndNoPeerLosesItsFiles) {
  namespace fs = std::filesystem;
  const std::string dir = test::TestDir() + "/save_drop_out_stage" + std::to_string(GetParam());
  if (rank() == 0) fs::remove_all(dir);
  ASSERT_TRUE(Step().ok());  // its collectives also order the removal before any save
  // The victim's allocations in Save: 1 the agreement to start, 2 the
  // agreement on the written files.
  if (rank() == victim()) {
    ASSERT_TRUE(fault::SetPlanForTesting("alloc:2"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = engine_->Save(dir).status();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank() == victim()) {
    EXPECT_NE(st.ToString().find("checkpoint agreement"), std::string::npos)
        << "the fault should hit the agreement on the written files: " << st.ToString();
  }
  ExpectStoppedTogether(st, s, "OutOfMemory");
  if (rank() == 0) {
    EXPECT_TRUE(fs::exists(dir + "/step-1.tmp/rank-0.json"))
        << "rank 0 removed step-1.tmp while its peers could still be writing there";
    EXPECT_FALSE(fs::exists(dir + "/step-1")) << "a failed save must not complete";
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, RankFailuresTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& p) { return "stage" + std::to_string(p.param); });

}  // namespace
}  // namespace zinf::sched
