// The unit table alone: tensor spans and partitions, refusals of bad
// registrations, and the placement rules (stage-3 persistence thresholds,
// offload_param's max_in_cpu) as units accumulate.
#include "sched/unit_table.h"

#include <gtest/gtest.h>

namespace zinf::sched {
namespace {

std::vector<ParamSpec> Specs(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<ParamSpec> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamSpec p;
    p.name = "t" + std::to_string(i);
    p.shape = shapes[i];
    out.push_back(p);
  }
  return out;
}

UnitLayout AddOk(UnitTable& t, const std::string& name, const std::vector<std::vector<int64_t>>& shapes) {
  auto l = t.Layout(name, Specs(shapes));
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return {};
  t.Add(*l);
  return *l;
}

TEST(UnitTableTest, TensorsLieBackToBackAndTheUnitIsPartitionedOverTheRanks) {
  UnitTable t(UnitTableOptions{.world = 4});
  const UnitLayout a = AddOk(t, "a", {{3, 5}, {7}, {2, 2, 2}});
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(a.tensor_names, (std::vector<std::string>{"t0", "t1", "t2"}));
  EXPECT_EQ(a.tensor_offsets, (std::vector<int64_t>{0, 15, 22}));
  EXPECT_EQ(a.tensor_shapes[2], (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(a.part.num_elems, 30);
  const UnitPartition want = PartitionUnit(30, 4);
  EXPECT_EQ(a.part.padded_elems, want.padded_elems);
  EXPECT_EQ(a.part.shard_elems, want.shard_elems);
  EXPECT_EQ(a.part.padded_elems, 4 * a.part.shard_elems);
  EXPECT_FALSE(a.partitioned) << "only stage 3 partitions the parameters";
  EXPECT_EQ(AddOk(t, "b", {{1}}).index, 1);
  EXPECT_EQ(t.size(), 2);
}

TEST(UnitTableTest, BadRegistrationsAreRefusedAndChangeNothing) {
  UnitTable t(UnitTableOptions{});
  AddOk(t, "a", {{4}});
  auto dup = t.Layout("a", Specs({{2}}));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message(), "a unit named 'a' is already registered");
  auto empty = t.Layout("e", {});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(), "unit 'e' has no parameters");
  auto zero = t.Layout("z", Specs({{3, 0}}));
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("parameter 't0' of unit 'z': every dimension must be positive"),
            std::string::npos);
  auto huge = t.Layout("h", Specs({{int64_t{1} << 20, int64_t{1} << 21}}));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("under 2^40 elements"), std::string::npos);
  EXPECT_EQ(t.size(), 1);
  // A layout not added takes no name: the next unit is still index 1.
  EXPECT_EQ(AddOk(t, "b", {{2}}).index, 1);
}

TEST(UnitTableTest, Stage3KeepsSmallUnitsWholeUntilTheModelThresholdIsReached) {
  UnitTable t(
      UnitTableOptions{.world = 2, .stage = 3, .param_persistence_threshold = 100, .model_persistence_threshold = 250});
  EXPECT_FALSE(AddOk(t, "s0", {{100}}).partitioned);  // at the unit threshold: whole
  EXPECT_TRUE(AddOk(t, "big", {{101}}).partitioned);  // above it
  EXPECT_FALSE(AddOk(t, "s1", {{100}}).partitioned);  // 200 kept whole so far
  EXPECT_EQ(t.persistent_elems(), 200);
  EXPECT_TRUE(AddOk(t, "s2", {{60}}).partitioned);   // 260 would pass the model threshold
  EXPECT_FALSE(AddOk(t, "s3", {{50}}).partitioned);  // 250 does not
  EXPECT_EQ(t.persistent_elems(), 250);
}

TEST(UnitTableTest, OffloadParamNvmeKeepsShardsInHostMemoryUpToMaxInCpu) {
  const int64_t shard = PartitionUnit(5000, 2).shard_elems;  // whole norm blocks, padded
  UnitTable t(
      UnitTableOptions{.world = 2, .stage = 3, .param_offload = true, .param_nvme = true, .max_in_cpu = 2 * shard});
  const UnitLayout a = AddOk(t, "a", {{5000}});
  EXPECT_TRUE(a.partitioned);
  EXPECT_FALSE(a.shard_on_nvme);
  EXPECT_EQ(t.cpu_shard_elems(), shard);
  EXPECT_FALSE(AddOk(t, "b", {{5000}}).shard_on_nvme) << "two shards fill max_in_cpu exactly";
  EXPECT_TRUE(AddOk(t, "c", {{5000}}).shard_on_nvme) << "a third does not fit";
  EXPECT_EQ(t.cpu_shard_elems(), 2 * shard);
  // offload_param cpu: every shard at home in host memory, none in the store.
  UnitTable cpu(UnitTableOptions{.world = 2, .stage = 3, .param_offload = true, .max_in_cpu = 0});
  EXPECT_FALSE(AddOk(cpu, "a", {{5000}}).shard_on_nvme);
}

}  // namespace
}  // namespace zinf::sched
