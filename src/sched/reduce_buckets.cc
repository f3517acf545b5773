#include "sched/reduce_buckets.h"

#include <utility>

namespace zinf::sched {

bool ReduceBuckets::Add(int unit, int64_t elems, bool last) {
  if (!open_.empty() && open_elems_ + elems > capacity_) CloseOpen();
  open_.push_back(unit);
  open_elems_ += elems;
  if (last) CloseOpen();
  return overlap_ || last;
}

void ReduceBuckets::CloseOpen() {
  if (open_.empty()) return;
  closed_.push_back(std::move(open_));
  open_.clear();
  open_elems_ = 0;
}

}  // namespace zinf::sched
