#include "sched/swap_schedule.h"

#include <algorithm>

namespace zinf::sched {

size_t SwapSchedule::ReadEnd(size_t g) const {
  if (phased_) return std::min(groups_, BatchStart(g) + buffers_);
  return std::min(groups_, g + std::max<size_t>(1, buffers_ - 1));
}

std::optional<std::pair<size_t, size_t>> SwapSchedule::PreviousBatch(size_t g) const {
  const size_t first = BatchStart(g);
  if (!phased_ || first < buffers_) return std::nullopt;
  return std::make_pair(first - buffers_, first);
}

std::optional<std::pair<size_t, size_t>> SwapSchedule::WritesAfterUpdate(size_t g) const {
  if (!phased_) return std::make_pair(g, g);
  if ((g + 1) % buffers_ != 0 && g + 1 != groups_) return std::nullopt;
  return std::make_pair(BatchStart(g), g);
}

std::vector<int64_t> SwapSchedule::BufferElems(const std::vector<int64_t>& group_elems, size_t buffers) {
  std::vector<int64_t> out(buffers, 0);
  for (size_t g = 0; g < group_elems.size() && buffers > 0; ++g) {
    out[g % buffers] = std::max(out[g % buffers], group_elems[g]);
  }
  return out;
}

}  // namespace zinf::sched
