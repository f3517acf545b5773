// The NVMe tiers on the engine stream: the optimizer state's home
// (OptimizerSwapper, optimizer_swapper.h) set up at Finalize, the swapped
// gradients' accumulation through two staging buffers, and stage 3's
// parameter store (offload_param nvme).
//
// Owns: the gradient staging writes and the parameter store's two staging
// buffers. Runs on the engine stream: a swapped gradient is accumulated in
// a staging buffer and written out while the next one fills; every transfer
// completes before its buffer is reused. A failed transfer breaks the
// engine (SwapFailure): the state on disk is mixed and no further step
// runs.
#include "sched/engine_impl.h"

namespace zinf::sched {

OptimizerSwapper::Options EngineImpl::SwapperOptions() {
  OptimizerSwapper::Options so;
  const OffloadOptimizerConfig& oc = config_.zero.offload_optimizer;
  so.dirs = oc.nvme_path;
  so.checksums = config_.zinf.checksums;
  so.direct = !config_.zinf.aio.buffered;
  so.sub_group_size = config_.zero.sub_group_size;
  so.buffer_count = oc.buffer_count;
  so.phased = config_.zinf.aio.phased_swaps;
  so.gradients = config_.zinf.gradients;
  so.open_file = [this](const std::string& path, const nvme::FileOptions& fo) {
    return ckpt::OpenWithHook(*io_, path, fo);
  };
  so.pinned = [this](uint64_t bytes, const std::string& what) { return Pinned(bytes, what); };
  so.on_failure = [this](Status s, OptimizerSwapper::FailureKind kind) {
    return SwapFailure(std::move(s),
                       kind == OptimizerSwapper::FailureKind::kGradients ? SwapKind::kGradients : SwapKind::kState);
  };
  return so;
}

// At Finalize: the swapper's set-up (the last sub-group written, where each
// unit's gradients accumulate, the space for swapped gradients reserved:
// checked now, before step 1), then the accumulators of the gradients kept
// in host memory.
Status EngineImpl::SetUpSwap() {
  const cpu::PinnedPoolStats ps = pool_->stats();
  const uint64_t available = ps.budget_bytes > ps.in_use_bytes ? ps.budget_bytes - ps.in_use_bytes : 0;
  ZINF_RETURN_IF_ERROR(swapper_->Finish(available, ps.budget_bytes));
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    if (!grad_on_nvme(i) && !u.frozen) {
      ZINF_ASSIGN_OR_RETURN(u.h_accum, Pinned(owned_elems(u) * 4, "unit '" + u.name + "' gradient accumulator"));
    }
  }
  grad_stage_of_.assign(units_.size(), -1);
  return Status::Ok();
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
    ZINF_LOG_INFO(
        "engine: offload_param nvme: every parameter shard ({} elements) fits within "
        "offload_param.max_in_cpu = {}: all stay in pinned host memory",
        table_.cpu_shard_elems(), pc.max_in_cpu);
    return Status::Ok();
  }
  const uint64_t padded = (static_cast<uint64_t>(max_shard) * esize + 4095) / 4096 * 4096;
  ZINF_LOG_INFO(
      "engine: parameter shards on NVMe: {} units, {} elements ({}), {} reserved per path ({}); {} elements "
      "in host memory (max_in_cpu {}); 2 staging buffers of {} (gathers, updates)",
      on_nvme, on_nvme_elems, FormatBytes(static_cast<uint64_t>(on_nvme_elems) * esize),
      FormatBytes(param_store_->bytes_reserved() / pc.nvme_path.size()),
      [&] {
        std::string d;
        for (const std::string& p : pc.nvme_path) d += (d.empty() ? "" : ", ") + p;
        return d;
      }(),
      table_.cpu_shard_elems(), pc.max_in_cpu, FormatBytes(padded));
  for (int i = 0; i < 2; ++i) {
    ZINF_ASSIGN_OR_RETURN(cpu::PinnedBuffer b, Pinned(padded, "parameter staging buffer (offload_param nvme)"));
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
  if (padded > cpu::PinnedPool::kMaxBufferBytes) {
    return InvalidArgument("unit '" + u.name + "' has a parameter shard of " + FormatBytes(padded) +
                           " on this rank, more than one staging buffer can be (" +
                           FormatBytes(cpu::PinnedPool::kMaxBufferBytes) +
                           "): split the unit or shard it over more ranks");
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
        cpu::Cast(arena_, master + u.part.shard_begin(rank_), DType::kFloat32, buf.get(), compute_dtype_, count));
  }
  return param_store_->Write(u.index, buf.get()).Wait().WithContext("initial parameter shard of unit '" + u.name + "'");
}

// An I/O failure during a step leaves some sub-groups updated and others
// not: the engine refuses further steps.
Status EngineImpl::SwapFailure(Status s, SwapKind kind) {
  if (s.ok()) return s;
  MutexLock lock(mu_);
  if (broken_.ok()) {
    const char* what = kind == SwapKind::kParams      ? "parameter shards on NVMe: "
                       : kind == SwapKind::kGradients ? "gradients swapped to NVMe: "
                                                      : "optimizer state on NVMe: ";
    const char* consequence =
        kind == SwapKind::kParams ? "; units on disk are now at different steps"
        : kind == SwapKind::kGradients
            ? "; this window's gradients are lost and sub-groups on disk may be at different steps"
            : "; sub-groups on disk are now at different steps";
    broken_ = DataLoss(std::string(what) + s.ToString() + consequence + ": no further steps; " + ResumeHint());
    // The peers stop now, not at their next collective with this rank.
    if (comm_ && distributed()) comm_->Abort(broken_);
  }
  return broken_;
}

Status EngineImpl::SwapAccumulate(size_t i, const float* reduced, bool first) {
  const int64_t n = owned_elems(units_[i]);
  ZINF_ASSIGN_OR_RETURN(const int stage, AcquireGradStage(i));
  float* acc = static_cast<float*>(swapper_->grad_stage(stage));
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
    grad_stage_write_[stage] = swapper_->WriteGrad(swap_id(i), acc);
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
  return Timed(&Window::io, "read gradient " + units_[i].name, [this, i, stage](const StreamContext&) -> Status {
    ZINF_RETURN_IF_ERROR(WaitGradWrites());  // its last write may still be in flight
    return SwapFailure(swapper_->ReadGrad(swap_id(i), swapper_->grad_stage(stage)).Wait(), SwapKind::kGradients);
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
  return Timed(&Window::io, "write sub-groups", [this](const StreamContext&) { return swapper_->Drain(); });
}

}  // namespace zinf::sched
