#include "sched/optimizer_swapper.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "common/units.h"
#include "sched/gradient_placement.h"

namespace zinf::sched {

OptimizerSwapper::OptimizerSwapper(nvme::IoEngine& io, Options options) : io_(io), options_(std::move(options)) {}

OptimizerSwapper::~OptimizerSwapper() { WaitAll(); }

void OptimizerSwapper::WaitAll() {
  for (auto* requests : {&reads_, &writes_}) {
    for (const nvme::IoRequest& r : *requests) {
      if (r.valid()) (void)r.Wait();
    }
  }
  for (const auto& reads : grad_reads_) {
    for (const nvme::IoRequest& r : reads) (void)r.Wait();
  }
}

Status OptimizerSwapper::AddUnit(const std::string& name, int64_t n, const float* master, int64_t valid) {
  // A sub-group's swap buffer is one pinned buffer of [master | m | v]:
  // units are packed up to min(sub_group_size, 1 GiB of state), and a unit
  // larger than that is a sub-group of its own (gradient_placement.h).
  const int64_t buffer_cap = static_cast<int64_t>(cpu::PinnedPool::kMaxBufferBytes / 12);
  if (n > buffer_cap) {
    return InvalidArgument("unit '" + name + "' has " + std::to_string(n) +
                           " elements on this rank: its optimizer state (12 B/element) exceeds the " +
                           FormatBytes(cpu::PinnedPool::kMaxBufferBytes) +
                           " a sub-group's swap buffer can be; split the unit, or shard it over more ranks "
                           "(stage 1-3)");
  }
  if (!store_) {
    group_limit_ = std::min<int64_t>(options_.sub_group_size, kSubGroupPackElems);
    if (group_limit_ < options_.sub_group_size) {
      ZINF_LOG_INFO(
          "engine: sub-groups of at most {} elements (sub_group_size {} capped at 1 GiB of 12 B/element "
          "state; a larger unit is a sub-group of its own)",
          group_limit_, options_.sub_group_size);
    }
  }
  if (n > group_limit_) {
    ZINF_LOG_INFO(
        "engine: unit '{}' ({} elements on this rank) is larger than a sub-group ({}): a sub-group of its "
        "own, with swap buffers of {}",
        name, n, group_limit_, FormatBytes(static_cast<uint64_t>(n) * 12));
  }
  if (!store_) {
    nvme::SwapStoreOptions so;
    so.dirs = options_.dirs;
    so.checksums = options_.checksums;
    so.direct = options_.direct;
    so.open_file = options_.open_file;
    ZINF_ASSIGN_OR_RETURN(store_, nvme::SwapStore::Create(io_, so));  // grown as sub-groups close
  }
  if (groups_.empty() || groups_.back().elems + n > group_limit_) {
    ZINF_RETURN_IF_ERROR(FlushInitialGroup());
    groups_.emplace_back();
  }
  const int64_t need = std::max(group_limit_, n);
  if (!init_group_ || init_group_elems_ < need) {
    const uint64_t bytes = (static_cast<uint64_t>(need) * 12 + 4095) / 4096 * 4096;
    // Virtual until touched: what the largest sub-group uses is resident.
    init_group_.reset(static_cast<float*>(std::aligned_alloc(4096, bytes)));
    if (!init_group_) return OutOfMemory("the initial state of a sub-group (" + FormatBytes(bytes) + ")");
    init_group_elems_ = need;
  }
  Group& g = groups_.back();
  float* dst = init_group_.get() + 3 * g.elems;
  std::memset(dst, 0, static_cast<uint64_t>(n) * 12);
  if (valid > 0) std::memcpy(dst, master, valid * 4);
  group_of_unit_.push_back(static_cast<int>(groups_.size()) - 1);
  offset_in_group_.push_back(3 * g.elems);
  g.units.push_back(static_cast<int>(owned_.size()));
  owned_.push_back(n);
  g.elems += n;
  return Status::Ok();
}

// The open sub-group's initial state into the store, grown for it (space
// checked first).
Status OptimizerSwapper::FlushInitialGroup() {
  if (groups_written_ == groups_.size()) return Status::Ok();
  const size_t g = groups_.size() - 1;
  const uint64_t bytes = static_cast<uint64_t>(groups_[g].elems) * 12;
  const uint64_t extent = nvme::SwapStoreOptions{}.extent_bytes;
  // A tensor rounds up to whole extents on each of its files.
  store_capacity_ += bytes + extent * (options_.dirs.size() + 1);
  ZINF_RETURN_IF_ERROR(store_->Reserve(store_capacity_).WithContext("optimizer state on NVMe"));
  ZINF_RETURN_IF_ERROR(store_->Allocate(g, bytes));
  ZINF_RETURN_IF_ERROR(store_->Write(g, init_group_.get()).Wait().WithContext("initial optimizer state"));
  ++groups_written_;
  return Status::Ok();
}

Status OptimizerSwapper::Finish(uint64_t host_available, uint64_t host_budget) {
  if (!store_) return FailedPrecondition("optimizer swapper: no unit was added");
  ZINF_RETURN_IF_ERROR(FlushInitialGroup());
  init_group_.reset();
  init_group_elems_ = 0;
  std::vector<int64_t> group_elems;
  uint64_t total = 0;
  for (const Group& g : groups_) {
    group_elems.push_back(g.elems);
    total += static_cast<uint64_t>(g.elems) * 12;
  }
  // No more buffers than sub-groups: with one sub-group, one buffer (read,
  // update, write back in place). Each buffer fits the sub-groups that cycle
  // through it.
  const int64_t buffers =
      std::min<int64_t>(std::clamp<int64_t>(options_.buffer_count, 1, 64), static_cast<int64_t>(groups_.size()));
  const std::vector<int64_t> buffer_elems = SwapSchedule::BufferElems(group_elems, static_cast<size_t>(buffers));
  ZINF_ASSIGN_OR_RETURN(const uint64_t grad_bytes, PlaceGradients(buffer_elems, host_available, host_budget));
  const uint64_t extent = nvme::SwapStoreOptions{}.extent_bytes;
  store_capacity_ += grad_bytes + static_cast<uint64_t>(swapped_grad_units_) * extent * (options_.dirs.size() + 1);
  ZINF_RETURN_IF_ERROR(store_->Reserve(store_capacity_).WithContext("gradients swapped to NVMe"));
  std::string dirs;
  for (const std::string& p : options_.dirs) dirs += (dirs.empty() ? "" : ", ") + p;
  ZINF_LOG_INFO("engine: optimizer state on NVMe: {} in {} sub-groups{}, {} reserved per path ({})", FormatBytes(total),
                groups_.size(),
                swapped_grad_units_ == 0
                    ? std::string()
                    : ", gradients of " + std::to_string(swapped_grad_units_) + " of " + std::to_string(owned_.size()) +
                          " units swapped too (" + FormatBytes(grad_bytes) + ")",
                FormatBytes(store_->bytes_reserved() / options_.dirs.size()), dirs);
  for (int64_t i = 0; i < buffers; ++i) {
    ZINF_ASSIGN_OR_RETURN(cpu::PinnedBuffer b,
                          options_.pinned(static_cast<uint64_t>(buffer_elems[i]) * 12, "NVMe swap buffer"));
    bufs_.push_back(std::move(b));
  }
  for (size_t i = 0; i < owned_.size(); ++i) {
    if (grad_on_nvme(static_cast<int>(i))) {
      ZINF_RETURN_IF_ERROR(store_->Allocate(GradTensor(static_cast<int>(i)), owned_[i] * 4));
    }
  }
  schedule_.emplace(groups_.size(), bufs_.size(), options_.phased);
  reads_.assign(groups_.size(), {});
  writes_.assign(groups_.size(), {});
  grad_reads_.assign(groups_.size(), {});
  return Status::Ok();
}

// Where each unit's accumulated gradient lives: in pinned host memory while
// the host budget allows (the first units first: the last to arrive in
// backward and the first updated), the others in the swap store, written
// as they arrive through two staging buffers and read back with their
// sub-group's state into a gradient buffer beside its swap buffer. Host
// gradient memory is then these buffers, whatever the model size. Returns
// the bytes the swapped gradients take on disk.
Result<uint64_t> OptimizerSwapper::PlaceGradients(const std::vector<int64_t>& buffer_elems, uint64_t available,
                                                  uint64_t budget) {
  const int64_t buffers = static_cast<int64_t>(buffer_elems.size());
  GradientPlacementInput in;
  in.home = options_.gradients;
  in.owned = owned_;
  in.group_of_unit = group_of_unit_;
  in.buffers = buffers;
  for (int64_t e : buffer_elems)
    in.state_buffer_bytes += cpu::PinnedPool::SizeClassBytes(static_cast<uint64_t>(e) * 12);
  in.available = available;
  const GradientPlacement place = zinf::sched::PlaceGradients(in);
  grad_on_nvme_.assign(owned_.size(), 0);
  grad_offset_.assign(owned_.size(), 0);
  if (!place.swap) return uint64_t{0};
  if (!place.buffers_fit) {
    return OutOfMemory("host memory: " + FormatBytes(in.available) + " of the pinned budget (" + FormatBytes(budget) +
                       ", zinf.host_memory) is left for the optimizer's NVMe buffers, "
                       "which need " +
                       FormatBytes(in.state_buffer_bytes + place.buffer_bytes) + " (" + std::to_string(buffers) +
                       " swap buffers of a sub-group's state and gradients, two gradient staging buffers): raise "
                       "zinf.host_memory, or lower zero_optimization.sub_group_size or offload_optimizer.buffer_count");
  }
  for (size_t i = 0; i < owned_.size(); ++i) {
    grad_offset_[i] = static_cast<int64_t>(place.offset[i]);
    grad_on_nvme_[i] = place.on_nvme[i];
  }
  swapped_grad_units_ = place.swapped_units;
  for (int64_t i = 0; i < buffers; ++i) {
    ZINF_ASSIGN_OR_RETURN(cpu::PinnedBuffer b, options_.pinned(place.region_bytes, "NVMe gradient buffer"));
    grad_bufs_.push_back(std::move(b));
  }
  for (cpu::PinnedBuffer& b : grad_stage_) {
    ZINF_ASSIGN_OR_RETURN(b, options_.pinned(place.stage_bytes, "gradient staging (to NVMe)"));
  }
  return place.nvme_bytes;
}

void* OptimizerSwapper::grad(int unit) const {
  if (!grad_on_nvme(unit)) return nullptr;
  const size_t g = group_of(unit);
  return static_cast<char*>(grad_bufs_[g % grad_bufs_.size()].data()) + grad_offset_[unit];
}

// Issues the reads of groups g .. the schedule's read end not yet issued (a
// buffer is reused once the write of the group before it there has
// finished), then waits for g's.
Status OptimizerSwapper::ReadGroup(size_t g, const std::vector<char>& has_grad) {
  ZINF_RETURN_IF_ERROR(IssueReads(g, &has_grad));
  ZINF_RETURN_IF_ERROR(Failed(reads_[g].Wait(), FailureKind::kState));
  for (const nvme::IoRequest& r : grad_reads_[g]) ZINF_RETURN_IF_ERROR(Failed(r.Wait(), FailureKind::kGradients));
  return Status::Ok();
}

Status OptimizerSwapper::IssueReads(size_t g, const std::vector<char>* has_grad) {
  const SwapSchedule& sched = *schedule_;
  if (auto prev = sched.PreviousBatch(g); prev && !reads_[g].valid()) {
    // Phases: g's batch is read only once every write of the batch before
    // it has finished.
    for (size_t h = prev->first; h < prev->second; ++h) {
      if (writes_[h].valid()) ZINF_RETURN_IF_ERROR(Failed(writes_[h].Wait(), FailureKind::kState));
    }
  }
  for (size_t h = g; h < sched.ReadEnd(g); ++h) {
    if (!reads_[h].valid()) {
      if (auto before = sched.BufferPredecessor(h); before && writes_[*before].valid()) {
        ZINF_RETURN_IF_ERROR(Failed(writes_[*before].Wait(), FailureKind::kState));
      }
      reads_[h] = store_->Read(h, bufs_[sched.BufferOf(h)].data());
    }
    // Swapped gradients are final only once backward is over: read at the
    // boundary, those of units that have one this window.
    if (!has_grad || swapped_grad_units_ == 0 || !grad_reads_[h].empty()) continue;
    for (int i : groups_[h].units) {
      if (!grad_on_nvme(i) || !(*has_grad)[i]) continue;
      char* dst = static_cast<char*>(grad_bufs_[sched.BufferOf(h)].data()) + grad_offset_[i];
      grad_reads_[h].push_back(store_->Read(GradTensor(i), dst));
    }
  }
  return Status::Ok();
}

// Sub-group g updated: its write goes out now, or (phased swaps) with the
// rest of its batch once the batch's last group is updated, when none of
// the batch's reads is still in flight.
void OptimizerSwapper::IssueWrites(size_t g) {
  const auto writes = schedule_->WritesAfterUpdate(g);
  if (!writes) return;
  for (size_t h = writes->first; h <= writes->second; ++h) {
    writes_[h] = store_->Write(h, bufs_[schedule_->BufferOf(h)].data());
  }
}

Status OptimizerSwapper::Drain() {
  Status first;
  for (nvme::IoRequest& w : writes_) {
    if (w.valid()) {
      Status st = Failed(w.Wait(), FailureKind::kState);
      if (first.ok()) first = st;
    }
  }
  reads_.assign(groups_.size(), {});
  writes_.assign(groups_.size(), {});
  grad_reads_.assign(groups_.size(), {});
  return first;
}

}  // namespace zinf::sched
