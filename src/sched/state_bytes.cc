// The bytes-per-parameter table of DESIGN.md as code.
#include "sched/state_bytes.h"

#include "common/check.h"

namespace zinf::sched {
namespace {

void Place(StateBytes& s, OffloadDevice where, double bytes) {
  switch (where) {
    case OffloadDevice::kNone:
      s.device += bytes;
      break;
    case OffloadDevice::kCpu:
      s.host += bytes;
      break;
    case OffloadDevice::kNvme:
      s.nvme += bytes;
      break;
  }
}

}  // namespace

StateBytes ModelStateBytes(int64_t num_params, int64_t world_size, int stage, OffloadDevice optimizer,
                           OffloadDevice param) {
  ZINF_CHECK(num_params >= 0 && world_size >= 1 && stage >= 0 && stage <= 3);
  const double p = static_cast<double>(num_params);
  const double n = static_cast<double>(world_size);
  StateBytes s;
  // 16-bit compute copy: sharded only at stage 3, and only then offloadable.
  Place(s, stage == 3 ? param : OffloadDevice::kNone, stage == 3 ? 2 * p / n : 2 * p);
  // 16-bit gradients on the device: sharded from stage 2.
  s.device += stage >= 2 ? 2 * p / n : 2 * p;
  // fp32 master, m, v: sharded from stage 1.
  const double opt = stage >= 1 ? 12 * p / n : 12 * p;
  Place(s, optimizer, opt);
  // With the optimizer offloaded, this rank's reduced gradient shard lives on
  // the host in fp32 (4 B per element of the shard).
  if (optimizer != OffloadDevice::kNone) s.host += stage >= 1 ? 4 * p / n : 4 * p;
  return s;
}

}  // namespace zinf::sched
