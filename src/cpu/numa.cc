// NUMA node choice over hwloc: PCI locality via the device's first non-I/O
// ancestor (a package or group whose nodeset is the nearest memory).
#include "cpu/numa.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace zinf::cpu {
namespace {

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno) + " (errno " + std::to_string(errno) + ")";
}

std::string NodeList(hwloc_const_nodeset_t set) {
  char buf[256];
  hwloc_bitmap_list_snprintf(buf, sizeof(buf), set);
  return buf;
}

// The caller's node: explicit, or where the calling thread last ran.
Result<NumaChoice> CallerNode(hwloc_topology_t topology, int caller_node, std::string prefix) {
  if (caller_node >= 0) {
    if (!hwloc_get_numanode_obj_by_os_index(topology, static_cast<unsigned>(caller_node))) {
      return InvalidArgument("NUMA node " + std::to_string(caller_node) +
                             " does not exist (nodes: " + NodeList(hwloc_get_root_obj(topology)->nodeset) + ")");
    }
    return NumaChoice{caller_node, prefix + "caller's node " + std::to_string(caller_node)};
  }
  hwloc_obj_t first = hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, 0);
  if (!first) return Internal("hwloc topology has no NUMA node");
  hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
  hwloc_obj_t node = nullptr;
  if (hwloc_topology_is_thissystem(topology) &&
      hwloc_get_last_cpu_location(topology, cpus, HWLOC_CPUBIND_THREAD) == 0) {
    node = hwloc_get_next_obj_covering_cpuset_by_type(topology, cpus, HWLOC_OBJ_NUMANODE, nullptr);
  }
  hwloc_bitmap_free(cpus);
  if (node) return NumaChoice{static_cast<int>(node->os_index), prefix + "calling thread's node"};
  return NumaChoice{static_cast<int>(first->os_index), prefix + "first node (the calling thread's is unknown)"};
}

}  // namespace

Result<HwlocTopology> HwlocTopology::LoadThisSystem(bool with_pci) {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return Internal(Errno("hwloc_topology_init"));
  if (with_pci) hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topology) != 0) {
    Status s = Internal(Errno("hwloc_topology_load"));
    hwloc_topology_destroy(topology);
    return s;
  }
  return HwlocTopology(topology);
}

Result<HwlocTopology> HwlocTopology::FromXml(std::string_view xml) {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return Internal(Errno("hwloc_topology_init"));
  hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  const std::string buffer(xml);  // hwloc wants the terminating NUL counted
  if (hwloc_topology_set_xmlbuffer(topology, buffer.c_str(), static_cast<int>(buffer.size() + 1)) != 0 ||
      hwloc_topology_load(topology) != 0) {
    Status s = InvalidArgument(Errno("hwloc topology from XML (" + std::to_string(xml.size()) + " bytes)"));
    hwloc_topology_destroy(topology);
    return s;
  }
  return HwlocTopology(topology);
}

HwlocTopology& HwlocTopology::operator=(HwlocTopology&& other) noexcept {
  if (this != &other) {
    if (topology_) hwloc_topology_destroy(topology_);
    topology_ = other.topology_;
    other.topology_ = nullptr;
  }
  return *this;
}

HwlocTopology::~HwlocTopology() {
  if (topology_) hwloc_topology_destroy(topology_);
}

Result<NumaChoice> ChooseNumaNode(hwloc_topology_t topology, std::string_view gpu_pci_bus_id, int caller_node) {
  if (gpu_pci_bus_id.empty()) return CallerNode(topology, caller_node, "");
  const std::string bus_id(gpu_pci_bus_id);
  hwloc_obj_t device = hwloc_get_pcidev_by_busidstring(topology, bus_id.c_str());
  if (!device) {
    return CallerNode(topology, caller_node, "GPU " + bus_id + " is not in hwloc's PCI tree; ");
  }
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, device);
  if (ancestor && hwloc_bitmap_weight(ancestor->nodeset) == 1) {
    const int node = hwloc_bitmap_first(ancestor->nodeset);
    return NumaChoice{node, "nearest to GPU " + bus_id};
  }
  const std::string nodes = ancestor ? NodeList(ancestor->nodeset) : std::string("?");
  return CallerNode(topology, caller_node, "GPU " + bus_id + " is equally near nodes " + nodes + "; ");
}

}  // namespace zinf::cpu
