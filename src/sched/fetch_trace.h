// The stage-3 Fetch trace: the order of one micro-step's Fetch calls,
// recorded in the first micro-step and compared call by call in every later
// one, and what the parameter coordinator derives from it while the calls
// follow it: which units to gather ahead (prefetch) and whether a released
// unit is fetched again soon enough to keep it gathered (reuse).
//
// Owns the recorded order and this micro-step's calls. Pure bookkeeping: no
// device, stream or thread; the engine calls it on the client's thread, in
// Fetch order. Every rank fetching in the same order decides the same.
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace zinf::sched {

class FetchTrace {
 public:
  FetchTrace() = default;
  // unit_elems[u]: the elements a gather of unit u holds (padded).
  explicit FetchTrace(std::vector<int64_t> unit_elems) : unit_elems_(std::move(unit_elems)) {}

  // Where this micro-step's calls left the trace: the call's index, the unit
  // fetched, and the unit the trace has there (-1: the trace had no more).
  struct Divergence {
    size_t call = 0;
    int unit = -1, expected = -1;
  };
  // The client fetched `unit`. Returns the divergence when this call is the
  // one that leaves the trace (once per micro-step).
  std::optional<Divergence> Note(int unit);
  // The micro-step ended: its calls become the trace when they differ.
  void EndMicroStep();

  // This micro-step's calls so far match the trace (false before the first
  // call, and when there is no trace yet).
  bool followed() const { return followed_; }
  const std::vector<int>& trace() const { return trace_; }

  // The units to gather ahead, in trace order after the current call: those
  // not yet gathered (each once), while the elements gathered ahead stay within
  // `bucket` and every gathered element (`live` now, plus each one taken)
  // within `live_cap`. Empty unless the calls follow the trace.
  std::vector<int> Ahead(const std::function<bool(int)>& gathered, int64_t live, int64_t bucket,
                         int64_t live_cap) const;
  // Whether the trace fetches `unit` again within `max_distance` elements
  // of the units fetched in between, with `live` within `live_cap`.
  bool ReusedWithin(int unit, int64_t live, int64_t live_cap, int64_t max_distance) const;

 private:
  std::vector<int64_t> unit_elems_;
  std::vector<int> trace_, recording_;
  bool followed_ = false;
};

}  // namespace zinf::sched
