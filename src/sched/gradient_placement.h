// With the optimizer state on NVMe, where each unit's fp32 accumulated
// gradient lives: in pinned host memory while the pinned budget allows (the
// first units first: the last to arrive in backward, the first updated),
// else in the swap store, written as it arrives through two staging buffers
// and read back at the boundary into a gradient buffer beside each swap
// buffer (a sub-group's gradients at 4 KiB-aligned places, for O_DIRECT).
// The engine places gradients by this function and `zinf plan` counts them
// by it, so the two cannot disagree.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "zinf/config.h"

namespace zinf::sched {

// Sub-groups (offload_optimizer nvme): consecutive whole units packed up to
// min(sub_group_size, kSubGroupPackElems) elements (1 GiB of [master | m |
// v]); a unit larger than that is a sub-group of its own, as large as one
// pinned buffer allows (PinnedPool::kMaxBufferBytes / 12 elements). The
// engine and `zinf plan` both group this way.
inline constexpr int64_t kSubGroupPackElems = (int64_t{1} << 30) / 12;
struct GradientPlacementInput {
  GradientHome home = GradientHome::kAuto;
  std::vector<int64_t> owned;       // elements this rank updates, per unit
  std::vector<int> group_of_unit;   // each unit's sub-group (a group's units are consecutive)
  int64_t buffers = 1;              // swap buffers (one gradient buffer each)
  uint64_t state_buffer_bytes = 0;  // the state's swap buffers, as pinned
  uint64_t available = 0;           // pinned budget left when the engine decides
};

struct GradientPlacement {
  // false: every gradient in host memory (host_bytes), no gradient buffers.
  bool swap = false;
  std::vector<char> on_nvme;     // per unit
  std::vector<uint64_t> offset;  // per unit: bytes into its sub-group's gradient buffer
  uint64_t region_bytes = 0;     // one gradient buffer: the largest sub-group's gradients
  uint64_t stage_bytes = 0;      // one staging buffer: the largest unit's gradient
  uint64_t buffer_bytes = 0;     // buffers × region + 2 × stage, as pinned
  bool buffers_fit = true;       // the state's and the gradients' buffers within `available`
  uint64_t host_bytes = 0;       // the gradients kept in host memory, as pinned
  uint64_t nvme_bytes = 0;       // the gradients in the swap store (4 KiB-padded)
  int64_t swapped_units = 0;
};

GradientPlacement PlaceGradients(const GradientPlacementInput& in);

}  // namespace zinf::sched
