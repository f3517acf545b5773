// NUMA node choice on a synthetic two-node topology loaded from hwloc XML
// (two_node_topology.h), and on this machine.
#include "cpu/numa.h"

#include <gtest/gtest.h>

#include "two_node_topology.h"

namespace zinf::cpu {
namespace {

HwlocTopology TwoNodes() {
  auto t = HwlocTopology::FromXml(test::kTwoNodeTopologyXml);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TEST(NumaTest, SyntheticTopologyHasTwoNodes) {
  HwlocTopology t = TwoNodes();
  EXPECT_EQ(hwloc_get_nbobjs_by_type(t.get(), HWLOC_OBJ_NUMANODE), 2);
  EXPECT_FALSE(t.is_this_system());
}

TEST(NumaTest, GpuGetsItsNearestNode) {
  HwlocTopology t = TwoNodes();
  auto near1 = ChooseNumaNode(t.get(), "0000:b3:00.0", 0);  // the caller's node 0 does not win
  ASSERT_TRUE(near1.ok()) << near1.status().ToString();
  EXPECT_EQ(near1->node, 1);
  EXPECT_EQ(near1->reason, "nearest to GPU 0000:b3:00.0");
  auto near0 = ChooseNumaNode(t.get(), "17:00.0", 1);  // the short form cudaDeviceGetPCIBusId may give
  ASSERT_TRUE(near0.ok());
  EXPECT_EQ(near0->node, 0);
}

TEST(NumaTest, DeviceAboveBothNodesFallsBackToCallersNode) {
  HwlocTopology t = TwoNodes();
  auto c = ChooseNumaNode(t.get(), "0000:c1:00.0", 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->node, 1);
  EXPECT_NE(c->reason.find("equally near nodes 0-1"), std::string::npos) << c->reason;
}

TEST(NumaTest, UnknownGpuFallsBackToCallersNode) {
  HwlocTopology t = TwoNodes();
  auto c = ChooseNumaNode(t.get(), "0000:99:00.0", 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->node, 1);
  EXPECT_NE(c->reason.find("not in hwloc's PCI tree"), std::string::npos) << c->reason;
}

TEST(NumaTest, NoGpuUsesCallersNode) {
  HwlocTopology t = TwoNodes();
  EXPECT_EQ(ChooseNumaNode(t.get(), "", 1)->node, 1);
  EXPECT_EQ(ChooseNumaNode(t.get(), "", 0)->node, 0);
  // -1: the calling thread's node, unknowable on a topology of another
  // machine: the first node.
  EXPECT_EQ(ChooseNumaNode(t.get(), "", -1)->node, 0);
  auto missing = ChooseNumaNode(t.get(), "", 5);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("nodes: 0-1"), std::string::npos) << missing.status().message();
}

TEST(NumaTest, BadXmlIsInvalidArgument) {
  EXPECT_EQ(HwlocTopology::FromXml("<topology>not really</topology>").status().code(), StatusCode::kInvalidArgument);
}

TEST(NumaTest, ThisMachineGivesTheCallingThreadsNode) {
  auto t = HwlocTopology::LoadThisSystem(/*with_pci=*/false);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto c = ChooseNumaNode(t->get(), "", -1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(hwloc_get_numanode_obj_by_os_index(t->get(), static_cast<unsigned>(c->node)), nullptr);
}

}  // namespace
}  // namespace zinf::cpu
