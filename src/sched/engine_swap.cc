// The optimizer state's NVMe home (offload_optimizer nvme) and its pipelined
// swapper, the swapped gradients, and stage 3's parameter store
// (offload_param nvme).
//
// Owns: the sub-groups (whole units in forward order, [master | m | v] of
// their owned ranges per swap tensor), the buffer_count pinned buffers the
// boundary cycles them through, the gradient staging buffers and the
// parameter store's two staging buffers. Runs on the engine stream: reads
// are issued ahead of the sub-group that needs them (during the last
// backward for the state, at the boundary for swapped gradients), writes
// after its update; every transfer completes before its buffer is reused.
// A failed transfer breaks the engine (SwapFailure): the state on disk is
// mixed and no further step runs.
#include "sched/engine_impl.h"

namespace zinf {
namespace sched {

Status EngineImpl::StageInitialState(const Unit& u, const float* master, int64_t valid) {
  // A sub-group's swap buffer is one pinned buffer of [master | m | v]:
  // units are packed up to min(sub_group_size, 1 GiB of state), and a unit
  // larger than that is a sub-group of its own (gradient_placement.h).
  const int64_t buffer_cap = static_cast<int64_t>(PinnedPool::kMaxBufferBytes / 12);
  const int64_t n = owned_elems(u);
  if (n > buffer_cap) {
    return InvalidArgument("unit '" + u.name + "' has " + std::to_string(n) +
                           " elements on this rank: its optimizer state (12 B/element) exceeds the " +
                           FormatBytes(PinnedPool::kMaxBufferBytes) +
                           " a sub-group's swap buffer can be; split the unit, or shard it over more ranks "
                           "(stage 1-3)");
  }
  if (!store_) {
    group_limit_ = std::min<int64_t>(config_.zero.sub_group_size, kSubGroupPackElems);
    if (group_limit_ < config_.zero.sub_group_size) {
      ZINF_LOG_INFO("engine: sub-groups of at most {} elements (sub_group_size {} capped at 1 GiB of 12 B/element "
                    "state; a larger unit is a sub-group of its own)",
                    group_limit_, config_.zero.sub_group_size);
    }
  }
  if (n > group_limit_) {
    ZINF_LOG_INFO("engine: unit '{}' ({} elements on this rank) is larger than a sub-group ({}): a sub-group of its "
                  "own, with swap buffers of {}",
                  u.name, n, group_limit_, FormatBytes(static_cast<uint64_t>(n) * 12));
  }
  if (!store_) {
    nvme::SwapStoreOptions so;
    so.dirs = config_.zero.offload_optimizer.nvme_path;
    so.checksums = config_.zinf.checksums;
    so.direct = !config_.zinf.aio.buffered;
    so.open_file = [this](const std::string& path, const nvme::FileOptions& fo) {
      return ckpt::OpenWithHook(*io_, path, fo);
    };
    ZINF_ASSIGN_OR_RETURN(store_, nvme::SwapStore::Create(*io_, so));  // grown as sub-groups close
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
  g.units.push_back(u.index);
  g.elems += n;
  return Status::Ok();
}

// The open sub-group's initial state into the store, grown for it (space
// checked first).
Status EngineImpl::FlushInitialGroup() {
  if (groups_written_ == groups_.size()) return Status::Ok();
  const size_t g = groups_.size() - 1;
  const uint64_t bytes = static_cast<uint64_t>(groups_[g].elems) * 12;
  const uint64_t extent = nvme::SwapStoreOptions{}.extent_bytes;
  // A tensor rounds up to whole extents on each of its files.
  store_capacity_ += bytes + extent * (config_.zero.offload_optimizer.nvme_path.size() + 1);
  ZINF_RETURN_IF_ERROR(store_->Reserve(store_capacity_).WithContext("optimizer state on NVMe"));
  ZINF_RETURN_IF_ERROR(store_->Allocate(g, bytes));
  ZINF_RETURN_IF_ERROR(store_->Write(g, init_group_.get()).Wait().WithContext("initial optimizer state"));
  ++groups_written_;
  return Status::Ok();
}

// At Finalize: the last sub-group written, the space for swapped gradients
// reserved (checked now, before step 1), the pipeline buffers, and where
// each unit's gradients accumulate.
Status EngineImpl::SetUpSwap() {
  ZINF_RETURN_IF_ERROR(FlushInitialGroup());
  init_group_.reset();
  init_group_elems_ = 0;
  int64_t max_group = 0;
  uint64_t total = 0;
  for (const Group& g : groups_) {
    max_group = std::max(max_group, g.elems);
    total += static_cast<uint64_t>(g.elems) * 12;
  }
  const OffloadOptimizerConfig& oc = config_.zero.offload_optimizer;
  // No more buffers than sub-groups: with one sub-group, one buffer (read,
  // update, write back in place).
  const int64_t buffers = std::min<int64_t>(std::clamp<int64_t>(oc.buffer_count, 1, 64),
                                            static_cast<int64_t>(groups_.size()));
  ZINF_ASSIGN_OR_RETURN(const uint64_t grad_bytes, PlaceGradients(buffers, max_group));
  const uint64_t extent = nvme::SwapStoreOptions{}.extent_bytes;
  store_capacity_ += grad_bytes + static_cast<uint64_t>(swapped_grad_units_) * extent * (oc.nvme_path.size() + 1);
  ZINF_RETURN_IF_ERROR(store_->Reserve(store_capacity_).WithContext("gradients swapped to NVMe"));
  ZINF_LOG_INFO("engine: optimizer state on NVMe: {} in {} sub-groups{}, {} reserved per path ({})",
                FormatBytes(total), groups_.size(),
                swapped_grad_units_ == 0
                    ? std::string()
                    : ", gradients of " + std::to_string(swapped_grad_units_) + " of " +
                          std::to_string(units_.size()) + " units swapped too (" + FormatBytes(grad_bytes) + ")",
                FormatBytes(store_->bytes_reserved() / oc.nvme_path.size()), [&] {
                  std::string d;
                  for (const std::string& p : oc.nvme_path) d += (d.empty() ? "" : ", ") + p;
                  return d;
                }());
  for (int64_t i = 0; i < buffers; ++i) {
    ZINF_ASSIGN_OR_RETURN(PinnedBuffer b, Pinned(static_cast<uint64_t>(max_group) * 12, "NVMe swap buffer"));
    nvme_bufs_.push_back(std::move(b));
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    const std::string what = "unit '" + u.name + "' gradient accumulator";
    if (!u.grad_on_nvme) {
      ZINF_ASSIGN_OR_RETURN(u.h_accum, Pinned(owned_elems(u) * 4, what));
    } else {
      ZINF_RETURN_IF_ERROR(store_->Allocate(kGradTensor + i, owned_elems(u) * 4));
    }
  }
  swap_schedule_.emplace(groups_.size(), nvme_bufs_.size(), config_.zinf.aio.phased_swaps);
  group_read_.assign(groups_.size(), {});
  group_write_.assign(groups_.size(), {});
  group_grad_read_.assign(groups_.size(), {});
  return Status::Ok();
}

// Where each unit's accumulated gradient lives: in pinned host memory while
// the host budget allows (the first units first: the last to arrive in
// backward and the first updated), the others in the swap store, written
// as they arrive through two staging buffers and read back with their
// sub-group's state into a gradient buffer beside its swap buffer. Host
// gradient memory is then these buffers, whatever the model size. Returns
// the bytes the swapped gradients take on disk.
Result<uint64_t> EngineImpl::PlaceGradients(int64_t buffers, int64_t max_group) {
  const PinnedPoolStats ps = pool_->stats();
  GradientPlacementInput in;
  in.home = config_.zinf.gradients;
  for (const Unit& u : units_) in.owned.push_back(owned_elems(u));
  in.group_of_unit = group_of_unit_;
  in.buffers = buffers;
  in.state_buffer_bytes = buffers * PinnedPool::SizeClassBytes(static_cast<uint64_t>(max_group) * 12);
  in.available = ps.budget_bytes > ps.in_use_bytes ? ps.budget_bytes - ps.in_use_bytes : 0;
  const GradientPlacement place = zinf::PlaceGradients(in);
  grad_stage_of_.assign(units_.size(), -1);
  grad_offset_.assign(units_.size(), 0);
  if (!place.swap) return uint64_t{0};
  if (!place.buffers_fit) {
    return OutOfMemory("host memory: " + FormatBytes(in.available) + " of the pinned budget (" +
                       FormatBytes(ps.budget_bytes) + ", zinf.host_memory) is left for the optimizer's NVMe buffers, "
                       "which need " + FormatBytes(in.state_buffer_bytes + place.buffer_bytes) + " (" +
                       std::to_string(buffers) +
                       " swap buffers of a sub-group's state and gradients, two gradient staging buffers): raise "
                       "zinf.host_memory, or lower zero_optimization.sub_group_size or offload_optimizer.buffer_count");
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    grad_offset_[i] = static_cast<int64_t>(place.offset[i]);
    units_[i].grad_on_nvme = place.on_nvme[i] != 0;
  }
  swapped_grad_units_ = place.swapped_units;
  const uint64_t region = place.region_bytes, stage = place.stage_bytes, bytes = place.nvme_bytes;
  for (int64_t i = 0; i < buffers; ++i) {
    ZINF_ASSIGN_OR_RETURN(PinnedBuffer b, Pinned(region, "NVMe gradient buffer"));
    grad_bufs_.push_back(std::move(b));
  }
  for (PinnedBuffer& b : grad_stage_) {
    ZINF_ASSIGN_OR_RETURN(b, Pinned(stage, "gradient staging (to NVMe)"));
  }
  return bytes;
}

// Issues the reads of groups g .. g + buffers - 2 not yet issued (a buffer
// is reused once the write of the group before it there has finished), then
// waits for g's.
Status EngineImpl::ReadGroup(size_t g, const std::vector<char>& has_grad) {
  ZINF_RETURN_IF_ERROR(IssueReads(g, &has_grad));
  ZINF_RETURN_IF_ERROR(SwapFailure(group_read_[g].Wait()));
  for (const nvme::IoRequest& r : group_grad_read_[g]) ZINF_RETURN_IF_ERROR(SwapFailure(r.Wait(), SwapKind::kGradients));
  return Status::Ok();
}

Status EngineImpl::IssueReads(size_t g, const std::vector<char>* has_grad) {
  const SwapSchedule& sched = *swap_schedule_;
  if (auto prev = sched.PreviousBatch(g); prev && !group_read_[g].valid()) {
    // Phases: g's batch is read only once every write of the batch before
    // it has finished.
    for (size_t h = prev->first; h < prev->second; ++h) {
      if (group_write_[h].valid()) ZINF_RETURN_IF_ERROR(SwapFailure(group_write_[h].Wait()));
    }
  }
  for (size_t h = g; h < sched.ReadEnd(g); ++h) {
    if (!group_read_[h].valid()) {
      if (auto before = sched.BufferPredecessor(h); before && group_write_[*before].valid()) {
        ZINF_RETURN_IF_ERROR(SwapFailure(group_write_[*before].Wait()));
      }
      group_read_[h] = store_->Read(h, nvme_bufs_[sched.BufferOf(h)].data());
    }
    // Swapped gradients are final only once backward is over: read at the
    // boundary, those of units that have one this window.
    if (!has_grad || swapped_grad_units_ == 0 || !group_grad_read_[h].empty()) continue;
    for (int i : groups_[h].units) {
      if (!units_[i].grad_on_nvme || !(*has_grad)[i]) continue;
      char* dst = static_cast<char*>(grad_bufs_[sched.BufferOf(h)].data()) + grad_offset_[i];
      group_grad_read_[h].push_back(store_->Read(kGradTensor + i, dst));
    }
  }
  return Status::Ok();
}

// Sub-group g updated: its write goes out now, or (phased swaps) with the
// rest of its batch once the batch's last group is updated, when none of
// the batch's reads is still in flight.
void EngineImpl::IssueWrites(size_t g) {
  const auto writes = swap_schedule_->WritesAfterUpdate(g);
  if (!writes) return;
  for (size_t h = writes->first; h <= writes->second; ++h) {
    group_write_[h] = store_->Write(h, nvme_bufs_[swap_schedule_->BufferOf(h)].data());
  }
}

// offload_param nvme, at Finalize: the two staging buffers of the largest
// shard in the store (every shard there was written as its unit registered,
// so every gather reads written extents).
Status EngineImpl::SetUpParamSwap() {
  const OffloadParamConfig& pc = config_.zero.offload_param;
  const uint64_t esize = DTypeSizeBytes(compute_dtype_);
  int64_t max_shard = 0, on_nvme = 0, on_nvme_elems = 0;
  for (const Unit& u : units_) {
    if (!u.shard_on_nvme) continue;
    ++on_nvme;
    on_nvme_elems += u.part.shard_elems;
    max_shard = std::max(max_shard, u.part.shard_elems);
  }
  if (on_nvme == 0) {
    ZINF_LOG_INFO("engine: offload_param nvme: every parameter shard ({} elements) fits within "
                  "offload_param.max_in_cpu = {}: all stay in pinned host memory",
                  cpu_shard_elems_, pc.max_in_cpu);
    return Status::Ok();
  }
  const uint64_t padded = (static_cast<uint64_t>(max_shard) * esize + 4095) / 4096 * 4096;
  ZINF_LOG_INFO("engine: parameter shards on NVMe: {} units, {} elements ({}), {} reserved per path ({}); {} elements "
                "in host memory (max_in_cpu {}); 2 staging buffers of {} (gathers, updates)",
                on_nvme, on_nvme_elems, FormatBytes(static_cast<uint64_t>(on_nvme_elems) * esize),
                FormatBytes(param_store_->bytes_reserved() / pc.nvme_path.size()),
                [&] {
                  std::string d;
                  for (const std::string& p : pc.nvme_path) d += (d.empty() ? "" : ", ") + p;
                  return d;
                }(),
                cpu_shard_elems_, pc.max_in_cpu, FormatBytes(padded));
  for (int i = 0; i < 2; ++i) {
    ZINF_ASSIGN_OR_RETURN(PinnedBuffer b, Pinned(padded, "parameter staging buffer (offload_param nvme)"));
    param_bufs_.push_back(std::move(b));
  }
  return Status::Ok();
}

// The parameter store (created with the first shard past max_in_cpu) grown
// for this shard, checked against the staging buffers' limits, and the
// initial shard (the master's rounding; zeros past the valid elements)
// written through a buffer of its own size.
Status EngineImpl::AddShardToStore(const Unit& u, const float* master) {
  const OffloadParamConfig& pc = config_.zero.offload_param;
  const uint64_t esize = DTypeSizeBytes(compute_dtype_);
  const int64_t shard = u.part.shard_elems;
  if (shard > pc.buffer_size) {
    return InvalidArgument("zero_optimization.offload_param.buffer_size = " + std::to_string(pc.buffer_size) +
                           " elements is smaller than the shard of unit '" + u.name + "' (" + std::to_string(shard) +
                           " elements on this rank): raise buffer_size to at least " + std::to_string(shard));
  }
  const uint64_t bytes = static_cast<uint64_t>(shard) * esize;
  const uint64_t padded = (bytes + 4095) / 4096 * 4096;
  if (padded > PinnedPool::kMaxBufferBytes) {
    return InvalidArgument("unit '" + u.name + "' has a parameter shard of " + FormatBytes(padded) +
                           " on this rank, more than one staging buffer can be (" +
                           FormatBytes(PinnedPool::kMaxBufferBytes) + "): split the unit or shard it over more ranks");
  }
  if (!param_store_) {
    nvme::SwapStoreOptions so;
    so.dirs = pc.nvme_path;
    so.checksums = config_.zinf.checksums;
    so.direct = !config_.zinf.aio.buffered;
    so.open_file = [this](const std::string& path, const nvme::FileOptions& fo) {
      return ckpt::OpenWithHook(*param_io_, path, fo);
    };
    ZINF_ASSIGN_OR_RETURN(param_store_, nvme::SwapStore::Create(*param_io_, so));  // grown shard by shard
  }
  // Each tensor rounds up to whole extents on each of its files.
  const uint64_t extent = nvme::SwapStoreOptions{}.extent_bytes;
  param_capacity_ += padded + extent * (pc.nvme_path.size() + 1);
  ZINF_RETURN_IF_ERROR(param_store_->Reserve(param_capacity_).WithContext("parameter shards on NVMe"));
  ZINF_RETURN_IF_ERROR(param_store_->Allocate(u.index, bytes));
  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(4096, padded)), &std::free);
  if (!buf) return OutOfMemory("unit '" + u.name + "': " + FormatBytes(padded) + " for its initial parameter shard");
  std::memset(buf.get(), 0, padded);
  const int64_t count = u.part.valid_in_shard(rank_);
  if (count > 0) {
    ZINF_RETURN_IF_ERROR(
        Cast(arena_, master + u.part.shard_begin(rank_), DType::kFloat32, buf.get(), compute_dtype_, count));
  }
  return param_store_->Write(u.index, buf.get()).Wait().WithContext("initial parameter shard of unit '" + u.name + "'");
}

// An I/O failure during a step leaves some sub-groups updated and others
// not: the engine refuses further steps.
Status EngineImpl::SwapFailure(Status s, SwapKind kind) {
  if (s.ok()) return s;
  std::lock_guard lock(mu_);
  if (broken_.ok()) {
    const char* what = kind == SwapKind::kParams      ? "parameter shards on NVMe: "
                       : kind == SwapKind::kGradients ? "gradients swapped to NVMe: "
                                                      : "optimizer state on NVMe: ";
    const char* consequence = kind == SwapKind::kParams ? "; units on disk are now at different steps"
                              : kind == SwapKind::kGradients
                                  ? "; this window's gradients are lost and sub-groups on disk may be at different steps"
                                  : "; sub-groups on disk are now at different steps";
    broken_ = DataLoss(std::string(what) + s.ToString() + consequence +
                       ": no further steps; resume from the last "
                       "complete checkpoint" +
                       (last_checkpoint_.empty() ? std::string(" (this engine has saved or loaded none)")
                                                 : " (" + last_checkpoint_ + ")"));
  }
  return broken_;
}

Status EngineImpl::SwapAccumulate(size_t i, const float* reduced, bool first) {
  const int64_t n = owned_elems(units_[i]);
  ZINF_ASSIGN_OR_RETURN(const int stage, AcquireGradStage(i));
  float* acc = static_cast<float*>(grad_stage_[stage].data());
  if (!first) ZINF_RETURN_IF_ERROR(ReadSwappedGrads(i, stage));
  float* dst = first ? acc : static_cast<float*>(h_grad_stage_.data());
  ZINF_RETURN_IF_ERROR(TimedCopies(*stream_, n * 4, [&] { return device_.CopyToHost(dst, reduced, n * 4, *stream_); }));
  if (!first) {
    ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, acc, r = dst, n](const StreamContext&) {
      arena_.execute([&] {
        tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, int64_t{1} << 16),
                          [&](const tbb::blocked_range<int64_t>& range) {
                            for (int64_t k = range.begin(); k < range.end(); ++k) acc[k] = acc[k] + r[k];
                          });
      });
      return Status::Ok();
    }));
  }
  // Out to the store while the norm partials read the same buffer; the
  // buffer is reused only after this write finished.
  return stream_->Enqueue([this, i, stage, acc](const StreamContext&) {
    grad_stage_write_[stage] = store_->Write(kGradTensor + i, acc);
    return Status::Ok();
  });
}

Result<int> EngineImpl::AcquireGradStage(size_t i) {
  const int stage = next_grad_stage_;
  next_grad_stage_ ^= 1;
  for (int& s : grad_stage_of_) {
    if (s == stage) s = -1;
  }
  grad_stage_of_[i] = stage;
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, stage](const StreamContext&) -> Status {
    nvme::IoRequest w = std::exchange(grad_stage_write_[stage], {});
    return w.valid() ? SwapFailure(w.Wait(), SwapKind::kGradients) : Status::Ok();
  }));
  return stage;
}

Status EngineImpl::ReadSwappedGrads(size_t i, int stage) {
  return Timed(&Window::io, [this, i, stage](const StreamContext&) -> Status {
    ZINF_RETURN_IF_ERROR(WaitGradWrites());  // its last write may still be in flight
    return SwapFailure(store_->Read(kGradTensor + i, grad_stage_[stage].data()).Wait(), SwapKind::kGradients);
  });
}

Status EngineImpl::WaitGradWrites() {
  for (nvme::IoRequest& w : grad_stage_write_) {
    nvme::IoRequest pending = std::exchange(w, {});
    if (pending.valid()) ZINF_RETURN_IF_ERROR(SwapFailure(pending.Wait(), SwapKind::kGradients));
  }
  return Status::Ok();
}


// NVMe, the boundary's last engine-stream task: waits for every sub-group's
// write (a failure breaks the engine) and clears the boundary's requests.
Status EngineImpl::EnqueueSwapDrain() {
  return Timed(&Window::io, [this](const StreamContext&) -> Status {
    Status first;
    for (nvme::IoRequest& w : group_write_) {
      if (w.valid()) {
        Status st = SwapFailure(w.Wait());
        if (first.ok()) first = st;
      }
    }
    group_read_.assign(groups_.size(), {});
    group_write_.assign(groups_.size(), {});
    group_grad_read_.assign(groups_.size(), {});
    return first;
  });
}

}  // namespace sched
}  // namespace zinf
