// Where fp32 gradients live with the optimizer on NVMe (gradient_placement.h).
#include "sched/gradient_placement.h"

#include <algorithm>

#include "cpu/pinned_pool.h"

namespace zinf::sched {

GradientPlacement PlaceGradients(const GradientPlacementInput& in) {
  const size_t n = in.owned.size();
  auto pinned = [](int64_t elems) { return cpu::PinnedPool::SizeClassBytes(static_cast<uint64_t>(elems) * 4); };
  auto padded = [](int64_t elems) { return (static_cast<uint64_t>(elems) * 4 + 4095) / 4096 * 4096; };
  GradientPlacement out;
  out.on_nvme.assign(n, 0);
  out.offset.assign(n, 0);
  uint64_t resident = 0;
  for (int64_t o : in.owned) resident += pinned(o);
  if (in.home == GradientHome::kHost || (in.home == GradientHome::kAuto && in.state_buffer_bytes <= in.available &&
                                         resident <= in.available - in.state_buffer_bytes)) {
    out.host_bytes = resident;
    return out;
  }
  out.swap = true;
  uint64_t r = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && in.group_of_unit[i] != in.group_of_unit[i - 1]) r = 0;
    out.offset[i] = r;
    r += padded(in.owned[i]);
    out.region_bytes = std::max(out.region_bytes, r);
    out.stage_bytes = std::max(out.stage_bytes, padded(in.owned[i]));
  }
  out.buffer_bytes = static_cast<uint64_t>(in.buffers) * cpu::PinnedPool::SizeClassBytes(out.region_bytes) +
                     2 * cpu::PinnedPool::SizeClassBytes(out.stage_bytes);
  const uint64_t buffers = in.state_buffer_bytes + out.buffer_bytes;
  out.buffers_fit = buffers <= in.available;
  // The first units stay while what is left holds them; from the first that
  // does not fit on, every one is swapped (updates read them in order).
  uint64_t left = in.home == GradientHome::kNvme || !out.buffers_fit ? 0 : in.available - buffers;
  bool full = false;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t c = pinned(in.owned[i]);
    if (!full && c <= left) {
      left -= c;
      out.host_bytes += c;
      continue;
    }
    full = true;
    out.on_nvme[i] = 1;
    out.nvme_bytes += padded(in.owned[i]);
    ++out.swapped_units;
  }
  return out;
}

}  // namespace zinf::sched
