// The order of the NVMe optimizer swapper's transfers (offload_optimizer
// nvme). Sub-groups 0 .. groups-1 are updated in order at each boundary, and
// cycle through `buffers` pinned buffers: sub-group g lives in buffer
// g % buffers, so its read may start only once the write of g - buffers
// (the buffer's previous sub-group) has finished.
//
// Without phases, reads run up to buffers - 1 sub-groups ahead of the
// update, beside the writes of those behind it, and each sub-group's write
// goes out right after its update. With phased swaps (zinf.aio.phased_swaps)
// the sub-groups move in batches of `buffers`: a batch is read once every
// write of the batch before it has finished, and its writes go out together
// after its last update, so the disk never reads and writes at once.
//
// Pure arithmetic; the engine's swapper (engine_swap.cc) issues and waits
// on the engine stream. Thread-safety: immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace zinf::sched {

class SwapSchedule {
 public:
  // groups >= 1, buffers >= 1.
  SwapSchedule(size_t groups, size_t buffers, bool phased) : groups_(groups), buffers_(buffers), phased_(phased) {}

  size_t groups() const { return groups_; }
  size_t buffers() const { return buffers_; }
  size_t BufferOf(size_t g) const { return g % buffers_; }
  // The elements each of `buffers` buffers must hold: buffer b the largest
  // of the sub-groups b, b + buffers, ... (`group_elems`, in order) that
  // cycle through it. A last, smaller sub-group then does not cost a buffer
  // of the largest one's size.
  static std::vector<int64_t> BufferElems(const std::vector<int64_t>& group_elems, size_t buffers);

  // When sub-group g is next: the reads of [g, ReadEnd(g)) should be in
  // flight (those not yet issued are issued now).
  size_t ReadEnd(size_t g) const;
  // Phased: the batch before g's, [first, last) — every write there must
  // have finished before g's batch is read. Nothing without phases, or for
  // the first batch.
  std::optional<std::pair<size_t, size_t>> PreviousBatch(size_t g) const;
  // The sub-group whose write must finish before h's read reuses its buffer.
  std::optional<size_t> BufferPredecessor(size_t h) const {
    return h >= buffers_ ? std::optional<size_t>(h - buffers_) : std::nullopt;
  }
  // Sub-group g was updated: the writes that go out now, [first, g] (none
  // while a phased batch still has sub-groups to update).
  std::optional<std::pair<size_t, size_t>> WritesAfterUpdate(size_t g) const;

 private:
  size_t BatchStart(size_t g) const { return g / buffers_ * buffers_; }
  size_t groups_, buffers_;
  bool phased_;
};

}  // namespace zinf::sched
