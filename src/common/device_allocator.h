// The device-memory allocator shared by HostDevice and CudaDevice: one
// reservation of the whole budget (made once by the device — an mmap or one
// cudaMalloc), carved into blocks rounded up to size classes (512 B steps up
// to 1 MiB, 64 KiB steps above). Nothing is ever allocated outside it, so
// fragmentation counts against the budget by construction.
//
// Reuse is stream-ordered: a block freed on stream S is handed out again on S
// at once (S runs in order, so its earlier uses are done first); another
// stream gets it only after an event recorded at the free — the allocating
// stream is made to wait on that event, or the block is reused once the
// event has completed. Part of a pending block handed out early leaves its
// tail pending under the same event (free for its own stream, not for
// others). Freed neighbours merge once their events complete; when no single
// range fits, adjacent free and pending pieces merge, the allocating stream
// waiting for each pending one.
//
// Thread-safe (one mutex); never blocks on device work.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "zinf/device.h"

namespace zinf {

class DeviceAllocator {
 public:
  // `device` creates the events; the reservation is [0, budget) in offsets.
  DeviceAllocator(Device& device, uint64_t budget_bytes);

  // An offset into the reservation, aligned to 512 bytes.
  Result<uint64_t> Allocate(uint64_t bytes, Stream& stream);
  // `offset` must come from Allocate and not be freed yet (else kInvalidArgument).
  Status Free(uint64_t offset, Stream& stream);
  DeviceMemoryStats stats() const;

  // The size class a request is rounded up to.
  static uint64_t RoundUp(uint64_t bytes);

 private:
  struct Pending {
    uint64_t offset;
    uint64_t size;
    uint64_t stream_id;
    std::shared_ptr<Event> event;  // shared by a block and the tails split from it
  };

  void InsertFree(uint64_t offset, uint64_t size);  // coalesces with free neighbours
  void EraseFree(uint64_t offset, uint64_t size);
  // Moves pending blocks whose events completed into the free ranges.
  void Reclaim();
  uint64_t LargestFree() const;
  Status OutOfMemory(uint64_t bytes, uint64_t rounded) const;

  Device& device_;
  const uint64_t budget_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_by_offset_;             // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;    // (size, offset), best fit
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> live_;  // offset -> (size, requested)
  std::vector<Pending> pending_;
  uint64_t in_use_ = 0, peak_ = 0, requested_ = 0;
};

}  // namespace zinf
