// Where the model state of mixed-precision Adam lives, per rank, for a ZeRO
// stage and offload choice — the table in DESIGN.md:
//   compute copy (16-bit) 2 B, gradient 2 B (16-bit, device) + 4 B (fp32,
//   host when the optimizer is offloaded), fp32 master + m + v 12 B.
//   Stage 0: 16P; 1: 4P + 12P/N; 2: 2P + 14P/N; 3: 16P/N on the device.
// Offload moves the sharded optimizer state (and with offload_param the
// parameter shard) to the host or NVMe. Staging buffers, buckets and
// activations are not model state and are counted by the planner on top.
// Thread-safe (pure).
#pragma once

#include <cstdint>

#include "zinf/config.h"

namespace zinf::sched {

struct StateBytes {
  double device = 0;  // bytes of device memory per rank
  double host = 0;    // bytes of host memory per rank (state homed there, not staging)
  double nvme = 0;    // bytes on NVMe per rank
  double total() const { return device + host + nvme; }
};

// num_params: P; world_size: N >= 1; stage 0..3.
StateBytes ModelStateBytes(int64_t num_params, int64_t world_size, int stage, OffloadDevice optimizer,
                           OffloadDevice param);

}  // namespace zinf::sched
