// Which NUMA node pinned host memory is bound to: the node nearest the GPU
// (its PCI bus id, as cudaDeviceGetPCIBusId gives it, looked up in hwloc's
// PCI tree) when there is one, else the caller's node. The choice is a pure
// function of an hwloc topology, so it is tested on synthetic topologies
// loaded from XML. HwlocTopology owns one loaded topology.
// Thread-safety: HwlocTopology is immutable after loading and may be shared
// for reading (hwloc allows concurrent queries on a loaded topology);
// ChooseNumaNode is pure.
#pragma once

#include <hwloc.h>

#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf::cpu {

class HwlocTopology {
 public:
  // This machine's topology; with_pci adds PCI devices (slower to load).
  static Result<HwlocTopology> LoadThisSystem(bool with_pci);
  // A topology exported by hwloc as XML (lstopo --of xml), with its PCI devices.
  // Binding memory on it does nothing: it does not describe this machine.
  static Result<HwlocTopology> FromXml(std::string_view xml);

  HwlocTopology(HwlocTopology&& other) noexcept : topology_(other.topology_) { other.topology_ = nullptr; }
  HwlocTopology& operator=(HwlocTopology&& other) noexcept;
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  ~HwlocTopology();

  hwloc_topology_t get() const { return topology_; }
  bool is_this_system() const { return hwloc_topology_is_thissystem(topology_) != 0; }

 private:
  explicit HwlocTopology(hwloc_topology_t topology) : topology_(topology) {}
  hwloc_topology_t topology_ = nullptr;
};

struct NumaChoice {
  int node = 0;        // OS index of the NUMA node
  std::string reason;  // why, for logs: "nearest to GPU 0000:17:00.0", "caller's node", ...
};

// gpu_pci_bus_id non-empty ("0000:17:00.0" or "17:00.0"): the NUMA node whose
// locality holds that PCI device. When the device is missing from the topology
// (containers often hide /sys/bus/pci) or attached above several nodes, the
// caller's node is used and the reason says so. caller_node >= 0 names the
// caller's node; -1 means the node of the CPU the calling thread runs on (the
// first node when that is unknown, e.g. on an XML topology). kInvalidArgument
// when caller_node does not exist in the topology.
Result<NumaChoice> ChooseNumaNode(hwloc_topology_t topology, std::string_view gpu_pci_bus_id, int caller_node);

}  // namespace zinf::cpu
