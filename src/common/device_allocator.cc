// DeviceAllocator: best fit over free ranges plus stream-tagged pending frees.
#include "common/device_allocator.h"

#include <algorithm>
#include <optional>

#include "common/check.h"
#include "common/fault_injection.h"
#include "common/units.h"

namespace zinf {

DeviceAllocator::DeviceAllocator(Device& device, uint64_t budget_bytes)
    : device_(device), budget_(budget_bytes / 512 * 512) {
  if (budget_ > 0) InsertFree(0, budget_);
}

uint64_t DeviceAllocator::RoundUp(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  const uint64_t step = bytes <= (1u << 20) ? 512 : (64u << 10);
  return (bytes + step - 1) / step * step;
}

void DeviceAllocator::InsertFree(uint64_t offset, uint64_t size) {
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && offset + size == next->first) {
    size += next->second;
    free_by_size_.erase({next->second, next->first});
    next = free_by_offset_.erase(next);
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      free_by_size_.erase({prev->second, prev->first});
      free_by_offset_.erase(prev);
    }
  }
  free_by_offset_[offset] = size;
  free_by_size_.insert({size, offset});
}

void DeviceAllocator::EraseFree(uint64_t offset, uint64_t size) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({size, offset});
}

void DeviceAllocator::Reclaim() {
  for (size_t i = 0; i < pending_.size();) {
    auto done = pending_[i].event->Query();
    if (done.ok() && *done) {
      InsertFree(pending_[i].offset, pending_[i].size);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    } else {
      ++i;
    }
  }
}

uint64_t DeviceAllocator::LargestFree() const {
  // Free ranges and pending blocks merge when adjacent (step 4 of Allocate).
  std::vector<std::pair<uint64_t, uint64_t>> pieces(free_by_offset_.begin(), free_by_offset_.end());
  for (const auto& p : pending_) pieces.emplace_back(p.offset, p.size);
  std::sort(pieces.begin(), pieces.end());
  uint64_t largest = 0, run = 0, end = 0;
  for (const auto& [offset, size] : pieces) {
    run = offset == end ? run + size : size;
    end = offset + size;
    largest = std::max(largest, run);
  }
  return largest;
}

Status DeviceAllocator::OutOfMemory(uint64_t bytes, uint64_t rounded) const {
  uint64_t free_total = budget_ - in_use_;
  std::string msg = "device memory: a request of " + FormatBytes(bytes) + " (" + FormatBytes(rounded) +
                    " as a block) does not fit: budget " + FormatBytes(budget_) + ", in use " + FormatBytes(in_use_) +
                    " in " + std::to_string(live_.size()) + " allocations";
  if (free_total >= rounded)
    msg += "; " + FormatBytes(free_total) + " is free but fragmented, the largest free range is " +
           FormatBytes(LargestFree());
  return ::zinf::OutOfMemory(msg);
}

Result<uint64_t> DeviceAllocator::Allocate(uint64_t bytes, Stream& stream) {
  const uint64_t size = RoundUp(bytes);
  if (fault::At(fault::Site::kDeviceAlloc)) {
    return ::zinf::OutOfMemory("injected (ZINF_FAULT): a device allocation of " + FormatBytes(bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto take = [&](uint64_t offset) {
    live_[offset] = {size, bytes};
    in_use_ += size;
    requested_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return offset;
  };
  // Split a free range, keeping the tail free.
  auto carve = [&](uint64_t offset, uint64_t range) {
    EraseFree(offset, range);
    if (range > size) InsertFree(offset + size, range - size);
    return take(offset);
  };
  // Takes the head of pending block i; its tail stays pending under the same
  // event: only the freeing stream (or one that waits) may use it.
  auto take_pending = [&](size_t i) {
    Pending p = std::move(pending_[i]);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    if (p.size > size) pending_.push_back({p.offset + size, p.size - size, p.stream_id, p.event});
    return take(p.offset);
  };
  // 1. A block this stream freed: stream order makes it safe at once.
  {
    size_t best = pending_.size();
    for (size_t i = 0; i < pending_.size(); ++i)
      if (pending_[i].stream_id == stream.id() && pending_[i].size >= size &&
          (best == pending_.size() || pending_[i].size < pending_[best].size))
        best = i;
    if (best < pending_.size()) return take_pending(best);
  }
  // 2. A free range (best fit), after reclaiming blocks whose events completed.
  Reclaim();
  auto it = free_by_size_.lower_bound({size, 0});
  if (it != free_by_size_.end()) return carve(it->second, it->first);
  // 3. A block another stream freed whose event is still pending: this
  // stream waits for that event, then reuses it.
  {
    size_t best = pending_.size();
    for (size_t i = 0; i < pending_.size(); ++i)
      if (pending_[i].size >= size && (best == pending_.size() || pending_[i].size < pending_[best].size)) best = i;
    if (best < pending_.size()) {
      ZINF_RETURN_IF_ERROR(stream.Wait(*pending_[best].event));
      return take_pending(best);
    }
  }
  // 4. Adjacent pieces — free ranges and pending blocks — that together hold
  // the request: this stream waits for every pending one among them; the
  // last piece's unused tail stays what it was (free, or pending).
  {
    struct Piece {
      uint64_t offset, size;
      size_t pending;  // index into pending_, or pending_.size() for a free range
    };
    std::vector<Piece> pieces;
    for (const auto& [offset, range] : free_by_offset_) pieces.push_back({offset, range, pending_.size()});
    for (size_t i = 0; i < pending_.size(); ++i) pieces.push_back({pending_[i].offset, pending_[i].size, i});
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    size_t first = 0;
    uint64_t run = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (i > first && pieces[i - 1].offset + pieces[i - 1].size != pieces[i].offset) {
        first = i;
        run = 0;
      }
      run += pieces[i].size;
      if (run < size) continue;
      const uint64_t start = pieces[first].offset, end = start + size;
      std::optional<Pending> tail;  // of the last piece, past the allocation
      std::vector<size_t> taken;
      for (size_t j = first; j <= i; ++j) {
        const Piece& q = pieces[j];
        const bool last = j == i && q.offset + q.size > end;
        if (q.pending == pending_.size()) {
          EraseFree(q.offset, q.size);
          if (last) tail = Pending{end, q.offset + q.size - end, 0, nullptr};
        } else {
          const Pending& p = pending_[q.pending];
          ZINF_RETURN_IF_ERROR(stream.Wait(*p.event));
          if (last) tail = Pending{end, q.offset + q.size - end, p.stream_id, p.event};
          taken.push_back(q.pending);
        }
      }
      std::sort(taken.rbegin(), taken.rend());  // erase from the back so indices stay valid
      for (size_t k : taken) {
        pending_[k] = std::move(pending_.back());
        pending_.pop_back();
      }
      if (tail && tail->event)
        pending_.push_back(std::move(*tail));
      else if (tail)
        InsertFree(tail->offset, tail->size);
      return take(start);
    }
  }
  return OutOfMemory(bytes, size);
}

Status DeviceAllocator::Free(uint64_t offset, Stream& stream) {
  ZINF_ASSIGN_OR_RETURN(auto event, device_.CreateEvent());
  ZINF_RETURN_IF_ERROR(event->Record(stream));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(offset);
  if (it == live_.end())
    return InvalidArgument("device memory: free of offset " + std::to_string(offset) +
                           ", which is not a live allocation (double free?)");
  uint64_t size = it->second.first;
  in_use_ -= size;
  requested_ -= it->second.second;
  live_.erase(it);
  pending_.push_back({offset, size, stream.id(), std::move(event)});
  return Status::Ok();
}

DeviceMemoryStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceMemoryStats s;
  s.budget_bytes = budget_;
  s.in_use_bytes = in_use_;
  s.peak_in_use_bytes = peak_;
  s.requested_bytes = requested_;
  s.largest_free_bytes = LargestFree();
  s.allocations = live_.size();
  return s;
}

}  // namespace zinf
