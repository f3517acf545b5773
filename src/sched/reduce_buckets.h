// The reduce buckets of ZeRO stages 2 and 3: which units' gradients are
// reduce-scattered together, and when. Units join the open bucket in the
// order their gradients become ready; a unit that would take the bucket past
// `capacity` elements closes it first (a unit larger than the capacity has a
// bucket to itself); the micro-step's last unit, or its end, closes the open
// bucket. Closed buckets are reduced at once with overlap_comm, else when
// the micro-step's last unit is ready. Every rank sees the same GradsReady
// order, so every rank builds the same buckets.
//
// Owns the open bucket and the closed ones not yet reduced. Pure
// bookkeeping, on the client's thread (GradsReady, Step).
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <vector>

namespace zinf::sched {

class ReduceBuckets {
 public:
  ReduceBuckets(int64_t capacity_elems, bool overlap) : capacity_(capacity_elems), overlap_(overlap) {}

  // Unit `unit` (`elems` padded elements) is ready; `last`: every unit of
  // the micro-step is. Returns whether the closed buckets go out now.
  bool Add(int unit, int64_t elems, bool last);
  // The micro-step ends (some units were not fetched): the open bucket closes.
  void CloseOpen();

  const std::vector<std::vector<int>>& closed() const { return closed_; }
  void ClearClosed() { closed_.clear(); }
  bool open_empty() const { return open_.empty(); }

 private:
  const int64_t capacity_;
  const bool overlap_;
  std::vector<int> open_;
  int64_t open_elems_ = 0;
  std::vector<std::vector<int>> closed_;
};

}  // namespace zinf::sched
