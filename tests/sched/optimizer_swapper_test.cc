// The optimizer swapper alone, over a real swap store whose files fail on
// demand: sub-groups as registered, every boundary reads back what the last
// one wrote through any number of buffers, swapped gradients come back with
// their sub-group, and a failed read or write reaches on_failure with its
// kind and leaves no request waiting.
#include "sched/optimizer_swapper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "nvme/fault_file.h"
#include "test_util.h"

namespace zinf::sched {
namespace {

using FailureKind = OptimizerSwapper::FailureKind;

// Owned elements per unit with sub-groups of at most 8000: {0, 1} fills one,
// 2 alone (2 + 3 would exceed it), {3, 4}, 5 is larger than a sub-group and
// gets its own, then 6.
const std::vector<int64_t> kOwned = {3000, 5000, 2000, 7000, 1000, 9000, 500};
const std::vector<std::vector<int>> kGroups = {{0, 1}, {2}, {3, 4}, {5}, {6}};

// State k (0 master, 1 m, 2 v) of element e of unit i after `step` updates.
float Value(int i, int k, int64_t e, int step) {
  if (step == 0 && k > 0) return 0.0f;  // m and v start at zero
  return static_cast<float>(
      test::SplitMix64((uint64_t(i) << 40) ^ (uint64_t(k) << 36) ^ (uint64_t(step) << 28) ^ uint64_t(e)) >> 40);
}

class OptimizerSwapperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nvme::IoEngineOptions io;
    io.block_size = 64 << 10;
    io.queue_depth = 8;
    io.rings = 2;
    io_ = std::move(nvme::IoEngine::Create(io)).value();
    cpu::PinnedPoolOptions po;
    po.budget_bytes = 64 << 20;
    po.lock = false;
    pool_ = std::move(cpu::PinnedPool::Create(po)).value();
    dir_ = test::TestDir() + "/optimizer_swapper_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    armed_ = std::make_shared<std::atomic<bool>>(false);
  }
  void TearDown() override {
    swapper_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A swapper over files that fail as `plan` says once armed_ is set; the
  // units of kOwned registered with their initial state (unit 6 has fewer
  // valid elements than owned: the rest must read back as zeros).
  void Make(int64_t buffers, bool phased, GradientHome grads = GradientHome::kHost, nvme::FaultPlan plan = {}) {
    OptimizerSwapper::Options o;
    o.dirs = {dir_};
    o.direct = false;
    o.sub_group_size = 8000;
    o.buffer_count = buffers;
    o.phased = phased;
    o.gradients = grads;
    plan.armed = armed_;
    o.open_file = [plan](const std::string& path, const nvme::FileOptions& fo) -> Result<std::shared_ptr<nvme::File>> {
      ZINF_ASSIGN_OR_RETURN(auto f, nvme::FaultInjectingFile::Open(path, fo, plan));
      return std::shared_ptr<nvme::File>(f);
    };
    o.pinned = [this](uint64_t bytes, const std::string&) { return pool_->Acquire(bytes); };
    o.on_failure = [this](Status s, FailureKind kind) {
      failures_.push_back({s, kind});
      return DataLoss("swap failed: " + s.ToString());
    };
    swapper_ = std::make_unique<OptimizerSwapper>(*io_, o);
    for (size_t i = 0; i < kOwned.size(); ++i) {
      const int64_t valid = i == 6 ? 300 : kOwned[i];
      std::vector<float> master(valid);
      for (int64_t e = 0; e < valid; ++e) master[e] = Value(int(i), 0, e, 0);
      ASSERT_TRUE(swapper_->AddUnit("unit" + std::to_string(i), kOwned[i], master.data(), valid).ok());
    }
    const cpu::PinnedPoolStats ps = pool_->stats();
    ASSERT_TRUE(swapper_->Finish(ps.budget_bytes - ps.in_use_bytes, ps.budget_bytes).ok());
  }

  // Whether unit i's [master | m | v] in its buffer is the state after `step`
  // updates (past 300 valid elements unit 6 is zeros).
  ::testing::AssertionResult HoldsStep(int i, int step) {
    const float* s = swapper_->state(i);
    for (int k = 0; k < 3; ++k) {
      for (int64_t e = 0; e < kOwned[i]; ++e) {
        const float want = i == 6 && e >= 300 ? 0.0f : Value(i, k, e, step);
        if (s[k * kOwned[i] + e] != want) {
          return ::testing::AssertionFailure() << "unit " << i << " state " << k << " element " << e << ": "
                                               << s[k * kOwned[i] + e] << ", want " << want << " (step " << step << ")";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }
  void Update(int i, int step) {
    float* s = swapper_->state(i);
    for (int k = 0; k < 3; ++k) {
      for (int64_t e = 0; e < kOwned[i]; ++e) s[k * kOwned[i] + e] = i == 6 && e >= 300 ? 0.0f : Value(i, k, e, step);
    }
  }

  std::unique_ptr<nvme::IoEngine> io_;
  std::unique_ptr<cpu::PinnedPool> pool_;
  std::string dir_;
  std::shared_ptr<std::atomic<bool>> armed_;
  std::unique_ptr<OptimizerSwapper> swapper_;
  std::vector<std::pair<Status, FailureKind>> failures_;
};

TEST_F(OptimizerSwapperTest, UnitsPackIntoSubGroupsInOrder) {
  Make(/*buffers=*/3, /*phased=*/true);
  ASSERT_EQ(swapper_->num_groups(), kGroups.size());
  for (size_t g = 0; g < kGroups.size(); ++g) {
    EXPECT_EQ(swapper_->group_units(g), kGroups[g]) << "sub-group " << g;
    int64_t offset = 0;
    for (int i : kGroups[g]) {
      EXPECT_EQ(swapper_->group_of(i), g);
      EXPECT_EQ(swapper_->offset_in_group(i), offset) << "unit " << i;
      offset += 3 * kOwned[i];
    }
  }
  EXPECT_EQ(swapper_->num_buffers(), 3u);
  EXPECT_EQ(swapper_->swapped_grad_units(), 0);
}

// Buffer counts from one (read, update, write back in place) to more than
// there are sub-groups, with and without phases: three boundaries, each
// reading what the previous one wrote; the first sub-groups' reads go out
// early (as during the last backward) in every boundary.
class OptimizerSwapperPipelineTest : public OptimizerSwapperTest,
                                     public ::testing::WithParamInterface<std::tuple<int, bool>> {};

TEST_P(OptimizerSwapperPipelineTest, EveryBoundaryReadsWhatTheLastOneWrote) {
  const auto [buffers, phased] = GetParam();
  Make(buffers, phased);
  const std::vector<char> has_grad(kOwned.size(), 1);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(swapper_->IssueReads(0, nullptr).ok());
    for (size_t g = 0; g < swapper_->num_groups(); ++g) {
      ASSERT_TRUE(swapper_->ReadGroup(g, has_grad).ok());
      for (int i : swapper_->group_units(g)) {
        ASSERT_TRUE(HoldsStep(i, step));
        Update(i, step + 1);
      }
      swapper_->IssueWrites(g);
    }
    ASSERT_TRUE(swapper_->Drain().ok());
  }
  // On disk: every sub-group at step 3.
  for (size_t g = 0; g < swapper_->num_groups(); ++g) {
    ASSERT_TRUE(swapper_->store().Read(g, swapper_->buffer(g)).Wait().ok());
    for (int i : swapper_->group_units(g)) EXPECT_TRUE(HoldsStep(i, 3));
  }
  EXPECT_TRUE(failures_.empty());
}

INSTANTIATE_TEST_SUITE_P(BuffersAndPhases, OptimizerSwapperPipelineTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 8), ::testing::Bool()));

TEST_F(OptimizerSwapperTest, SwappedGradientsComeBackWithTheirSubGroup) {
  Make(/*buffers=*/2, /*phased=*/true, GradientHome::kNvme);
  ASSERT_EQ(swapper_->swapped_grad_units(), static_cast<int64_t>(kOwned.size()));
  // Each unit's gradient written through a staging buffer, as the engine
  // does during backward; unit 4 has none this window.
  std::vector<char> has_grad(kOwned.size(), 1);
  has_grad[4] = 0;
  for (size_t i = 0; i < kOwned.size(); ++i) {
    EXPECT_TRUE(swapper_->grad_on_nvme(int(i)));
    if (!has_grad[i]) continue;
    float* stage = static_cast<float*>(swapper_->grad_stage(int(i % 2)));
    for (int64_t e = 0; e < kOwned[i]; ++e) stage[e] = Value(int(i), 3, e, 1);
    ASSERT_TRUE(swapper_->WriteGrad(int(i), stage).Wait().ok());
  }
  for (size_t g = 0; g < swapper_->num_groups(); ++g) {
    ASSERT_TRUE(swapper_->ReadGroup(g, has_grad).ok());
    for (int i : swapper_->group_units(g)) {
      EXPECT_TRUE(HoldsStep(i, 0));
      if (!has_grad[i]) continue;
      const float* grad = static_cast<const float*>(swapper_->grad(i));
      for (int64_t e = 0; e < kOwned[i]; ++e) ASSERT_EQ(grad[e], Value(i, 3, e, 1)) << "unit " << i << " element " << e;
    }
    swapper_->IssueWrites(g);
  }
  EXPECT_TRUE(swapper_->Drain().ok());
}

// One buffer, no phases: the write of sub-group 2 fails; the read of 3 into
// the same buffer waits for it, so the failure surfaces there, through
// on_failure, as the state's. Sub-groups 0 and 1 are at the new step on
// disk, 2 is unreadable (its last write failed), 3 and 4 are at the old one:
// the mixed state the engine must refuse to step on.
TEST_F(OptimizerSwapperTest, AFailedWriteSurfacesAtTheBuffersNextReadAsTheStates) {
  nvme::FaultPlan plan;
  plan.fail_attempt = 0;  // the first attempt once armed
  Make(/*buffers=*/1, /*phased=*/false, GradientHome::kHost, plan);
  const std::vector<char> has_grad(kOwned.size(), 1);
  for (size_t g = 0; g < 3; ++g) {
    ASSERT_TRUE(swapper_->ReadGroup(g, has_grad).ok());
    for (int i : swapper_->group_units(g)) Update(i, 1);
    if (g == 2) armed_->store(true);
    swapper_->IssueWrites(g);
  }
  const Status s = swapper_->ReadGroup(3, has_grad);
  armed_->store(false);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("swap failed: "), std::string::npos) << s.ToString();
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].second, FailureKind::kState);
  EXPECT_EQ(failures_[0].first.code(), StatusCode::kIoError) << failures_[0].first.ToString();
  EXPECT_NE(failures_[0].first.message().find(dir_), std::string::npos) << "names the swap file";
  (void)swapper_->Drain();  // returns, with nothing left in flight

  auto read = [&](size_t g) { return swapper_->store().Read(g, swapper_->buffer(g)).Wait(); };
  ASSERT_TRUE(read(0).ok());
  for (int i : kGroups[0]) EXPECT_TRUE(HoldsStep(i, 1));
  ASSERT_TRUE(read(1).ok());
  for (int i : kGroups[1]) EXPECT_TRUE(HoldsStep(i, 1));
  EXPECT_EQ(read(2).code(), StatusCode::kDataLoss);
  ASSERT_TRUE(read(3).ok());
  for (int i : kGroups[3]) EXPECT_TRUE(HoldsStep(i, 0));
}

TEST_F(OptimizerSwapperTest, AFailedReadIsTheStatesAndAFailedGradientReadTheGradients) {
  // Sub-groups and gradients share one file, packed in allocation order:
  // the five sub-groups' tensors (4 KiB-padded) first, the gradients after.
  uint64_t state_bytes = 0;
  for (const auto& group : kGroups) {
    uint64_t bytes = 0;
    for (int i : group) bytes += 12 * uint64_t(kOwned[i]);
    state_bytes += (bytes + 4095) / 4096 * 4096;
  }
  nvme::FaultPlan plan;
  plan.fail_reads_from = state_bytes;
  Make(/*buffers=*/2, /*phased=*/true, GradientHome::kNvme, plan);
  std::vector<char> has_grad(kOwned.size(), 1);
  for (size_t i = 0; i < kOwned.size(); ++i) {
    ASSERT_TRUE(swapper_->WriteGrad(int(i), swapper_->grad_stage(0)).Wait().ok());
  }
  armed_->store(true);
  const Status s = swapper_->ReadGroup(0, has_grad);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  // The state reads succeeded; only the gradients' failed.
  ASSERT_FALSE(failures_.empty());
  for (const auto& [status, kind] : failures_) EXPECT_EQ(kind, FailureKind::kGradients) << status.ToString();
  (void)swapper_->Drain();
  armed_->store(false);
  failures_.clear();

  // Now the state: every read fails.
  swapper_.reset();
  nvme::FaultPlan all;
  all.fail_reads_from = 0;
  Make(/*buffers=*/2, /*phased=*/true, GradientHome::kHost, all);
  armed_->store(true);
  const Status t = swapper_->ReadGroup(0, std::vector<char>(kOwned.size(), 1));
  armed_->store(false);
  EXPECT_EQ(t.code(), StatusCode::kDataLoss);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].second, FailureKind::kState);
  (void)swapper_->Drain();
}

}  // namespace
}  // namespace zinf::sched
