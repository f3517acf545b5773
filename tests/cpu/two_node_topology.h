// A synthetic hwloc topology for NUMA tests: two packages, each with one NUMA
// node, two cores and a GPU behind its own host bridge (0000:17:00.0 on node
// 0, 0000:b3:00.0 on node 1), plus an NVMe drive (0000:c1:00.0) attached at
// the machine level, equally near both nodes.
#pragma once

namespace zinf::test {

inline constexpr const char* kTwoNodeTopologyXml = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="17179869184"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
      </object>
      <object type="Bridge" gp_index="8" bridge_type="0-1" depth="0" bridge_pci="0000:[00-1f]">
        <object type="PCIDev" gp_index="9" pci_busid="0000:17:00.0" pci_type="0302 [10de:20b0] [10de:1450] a1" pci_link_speed="0.000000"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="10">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="11" local_memory="17179869184"/>
      <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="12">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="13"/>
      </object>
      <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="14">
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="15"/>
      </object>
      <object type="Bridge" gp_index="16" bridge_type="0-1" depth="0" bridge_pci="0000:[a0-bf]">
        <object type="PCIDev" gp_index="17" pci_busid="0000:b3:00.0" pci_type="0302 [10de:20b0] [10de:1450] a1" pci_link_speed="0.000000"/>
      </object>
    </object>
    <object type="Bridge" gp_index="18" bridge_type="0-1" depth="0" bridge_pci="0000:[c0-c0]">
      <object type="PCIDev" gp_index="19" pci_busid="0000:c1:00.0" pci_type="0108 [144d:a80a] [144d:a801] 00" pci_link_speed="0.000000"/>
    </object>
  </object>
</topology>
)";

}  // namespace zinf::test
