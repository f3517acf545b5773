#include "sched/gradient_placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cpu/pinned_pool.h"

namespace zinf::sched {
namespace {

uint64_t Pinned(int64_t elems) { return cpu::PinnedPool::SizeClassBytes(static_cast<uint64_t>(elems) * 4); }
uint64_t Padded(int64_t elems) { return (static_cast<uint64_t>(elems) * 4 + 4095) / 4096 * 4096; }

// Five units in two sub-groups, sizes chosen off 4 KiB boundaries so that
// the padding shows: 1000 elements are 4000 bytes, padded to 4096.
GradientPlacementInput FiveUnits() {
  GradientPlacementInput in;
  in.owned = {1000, 3000, 2048, 5000, 1000};
  in.group_of_unit = {0, 0, 0, 1, 1};
  in.buffers = 2;
  in.state_buffer_bytes = 1 << 20;
  return in;
}

uint64_t AllPinned(const GradientPlacementInput& in) {
  uint64_t sum = 0;
  for (int64_t o : in.owned) sum += Pinned(o);
  return sum;
}

TEST(GradientPlacementTest, AutoKeepsEveryGradientInHostMemoryWhenTheBudgetHoldsThemBesideTheState) {
  GradientPlacementInput in = FiveUnits();
  in.available = in.state_buffer_bytes + AllPinned(in);
  GradientPlacement p = PlaceGradients(in);
  EXPECT_FALSE(p.swap);
  EXPECT_EQ(p.host_bytes, AllPinned(in));
  EXPECT_EQ(p.nvme_bytes, 0u);
  EXPECT_EQ(p.buffer_bytes, 0u);
  EXPECT_EQ(p.swapped_units, 0);
  EXPECT_EQ(p.on_nvme, std::vector<char>(5, 0));

  // One byte less and the same input swaps.
  in.available -= 1;
  EXPECT_TRUE(PlaceGradients(in).swap);
}

TEST(GradientPlacementTest, HostIsHostWhateverTheBudget) {
  GradientPlacementInput in = FiveUnits();
  in.home = GradientHome::kHost;
  in.available = 0;
  GradientPlacement p = PlaceGradients(in);
  EXPECT_FALSE(p.swap);
  EXPECT_EQ(p.host_bytes, AllPinned(in));
  EXPECT_EQ(p.swapped_units, 0);
}

TEST(GradientPlacementTest, NvmeSwapsEveryUnitAtAlignedPlacesInItsSubGroupsBuffer) {
  GradientPlacementInput in = FiveUnits();
  in.home = GradientHome::kNvme;
  in.available = uint64_t{1} << 30;  // room for all: kNvme swaps anyway
  GradientPlacement p = PlaceGradients(in);
  ASSERT_TRUE(p.swap);
  EXPECT_EQ(p.on_nvme, std::vector<char>(5, 1));
  EXPECT_EQ(p.swapped_units, 5);
  EXPECT_EQ(p.host_bytes, 0u);
  // Offsets restart at each sub-group and step by the padded sizes.
  const std::vector<uint64_t> offsets = {0, Padded(1000), Padded(1000) + Padded(3000), 0, Padded(5000)};
  EXPECT_EQ(p.offset, offsets);
  for (uint64_t o : p.offset) EXPECT_EQ(o % 4096, 0u);
  const uint64_t group0 = Padded(1000) + Padded(3000) + Padded(2048);
  const uint64_t group1 = Padded(5000) + Padded(1000);
  EXPECT_EQ(p.region_bytes, std::max(group0, group1));
  EXPECT_EQ(p.stage_bytes, Padded(5000));
  EXPECT_EQ(p.buffer_bytes,
            2 * cpu::PinnedPool::SizeClassBytes(p.region_bytes) + 2 * cpu::PinnedPool::SizeClassBytes(p.stage_bytes));
  EXPECT_TRUE(p.buffers_fit);
  uint64_t nvme = 0;
  for (int64_t o : in.owned) nvme += Padded(o);
  EXPECT_EQ(p.nvme_bytes, nvme);
}

// Updates read gradients in unit order: the units kept in host memory are a
// prefix, and from the first that does not fit on every unit is swapped, even
// a later one small enough for what is left.
TEST(GradientPlacementTest, AutoKeepsAPrefixOfUnitsAndSwapsTheRest) {
  // Each unit a sub-group of its own and one swap buffer, so that the
  // buffers are small beside the gradients.
  GradientPlacementInput in;
  in.owned = {3000, 3000, 2048, 3000, 1000, 3000, 3000, 3000};
  in.group_of_unit = {0, 1, 2, 3, 4, 5, 6, 7};
  in.buffers = 1;
  in.state_buffer_bytes = 1 << 20;
  in.home = GradientHome::kNvme;
  const uint64_t buffers = in.state_buffer_bytes + PlaceGradients(in).buffer_bytes;
  in.home = GradientHome::kAuto;

  // Room for units 0 and 1, then a byte less than units 2 and 4 need.
  in.available = buffers + 2 * Pinned(3000) + Pinned(1000) - 1;
  ASSERT_LT(in.available, in.state_buffer_bytes + AllPinned(in));
  ASSERT_LT(Pinned(1000), Pinned(2048));
  GradientPlacement p = PlaceGradients(in);
  ASSERT_TRUE(p.swap);
  EXPECT_TRUE(p.buffers_fit);
  EXPECT_EQ(p.on_nvme, (std::vector<char>{0, 0, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(p.swapped_units, 6);
  EXPECT_EQ(p.host_bytes, 2 * Pinned(3000));
  EXPECT_EQ(p.nvme_bytes, Padded(2048) + 4 * Padded(3000) + Padded(1000));

  // With room for unit 2 as well, what is left would hold unit 4, but unit 3
  // does not fit: unit 4 and every later one are swapped.
  in.available = buffers + 2 * Pinned(3000) + Pinned(2048) + Pinned(1000);
  ASSERT_LT(in.available, in.state_buffer_bytes + AllPinned(in));
  p = PlaceGradients(in);
  ASSERT_TRUE(p.swap);
  EXPECT_EQ(p.on_nvme, (std::vector<char>{0, 0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(p.host_bytes, 2 * Pinned(3000) + Pinned(2048));
}

TEST(GradientPlacementTest, BuffersThatDoNotFitSwapEveryUnitAndSaySo) {
  GradientPlacementInput in = FiveUnits();
  in.available = in.state_buffer_bytes;  // no room for the gradient buffers
  GradientPlacement p = PlaceGradients(in);
  ASSERT_TRUE(p.swap);
  EXPECT_FALSE(p.buffers_fit);
  EXPECT_EQ(p.swapped_units, 5);
  EXPECT_EQ(p.host_bytes, 0u);
}

TEST(GradientPlacementTest, NoUnitsPlaceNothing) {
  GradientPlacementInput in;
  in.available = 1 << 20;
  GradientPlacement p = PlaceGradients(in);
  EXPECT_FALSE(p.swap);
  EXPECT_EQ(p.host_bytes, 0u);
  EXPECT_TRUE(p.on_nvme.empty());
}

}  // namespace
}  // namespace zinf::sched
