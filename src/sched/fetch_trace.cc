#include "sched/fetch_trace.h"

#include <algorithm>

namespace zinf::sched {

std::optional<FetchTrace::Divergence> FetchTrace::Note(int unit) {
  const size_t pos = recording_.size();
  recording_.push_back(unit);
  if (pos == 0) followed_ = !trace_.empty();
  if (followed_ && (pos >= trace_.size() || trace_[pos] != unit)) {
    followed_ = false;
    return Divergence{pos, unit, pos < trace_.size() ? trace_[pos] : -1};
  }
  return std::nullopt;
}

void FetchTrace::EndMicroStep() {
  if (recording_ != trace_) trace_ = recording_;
  recording_.clear();
  followed_ = false;
}

std::vector<int> FetchTrace::Ahead(const std::function<bool(int)>& gathered, int64_t live, int64_t bucket,
                                   int64_t live_cap) const {
  std::vector<int> out;
  if (!followed_) return out;
  int64_t ahead = 0;
  for (size_t j = recording_.size(); j < trace_.size(); ++j) {
    const int u = trace_[j];
    // A unit the trace fetches twice ahead is gathered once.
    if (gathered(u) || std::find(out.begin(), out.end(), u) != out.end()) continue;
    const int64_t e = unit_elems_[u];
    if (ahead + e > bucket || live + e > live_cap) break;
    out.push_back(u);
    ahead += e;
    live += e;
  }
  return out;
}

bool FetchTrace::ReusedWithin(int unit, int64_t live, int64_t live_cap, int64_t max_distance) const {
  if (!followed_ || live > live_cap) return false;
  int64_t distance = 0;
  for (size_t j = recording_.size(); j < trace_.size(); ++j) {
    if (trace_[j] == unit) return distance <= max_distance;
    distance += unit_elems_[trace_[j]];
    if (distance > max_distance) return false;
  }
  return false;
}

}  // namespace zinf::sched
