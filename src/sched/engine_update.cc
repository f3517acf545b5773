// The boundary: the step decision and the update pipeline.
//
// After the window's last micro-step, on the engine stream: the norm
// partials are all-gathered and summed in the global block order, the
// decision (step_decision.h) is made by a task there (HostDevice, and CUDA
// with the optimizer offloaded, from the partials read back) or on the host
// after they are read back (CUDA with the updates on the device: the one
// host wait left in a step), and every unit's update
// follows in forward order on its tier (device kernels; host Adam with the
// optimizer offloaded; sub-group by sub-group through the NVMe swapper),
// each unit's end recorded in params_ready for its next Fetch. With the
// optimizer offloaded, the new compute copies go up on the copy stream
// through pinned staging slots, or, with zinf.offload_zero_copy where the
// host addresses the device's memory, are written in place.
#include "sched/engine_impl.h"
#include "sched/engine_testing.h"

namespace zinf::sched {
namespace {

Mutex hook_mu;
testing::HostUpdateHook host_update_hook GUARDED_BY(hook_mu);
std::atomic<bool> has_host_update_hook{false};

void RunHostUpdateHook(int unit, int64_t boundary) {
  if (!has_host_update_hook.load(std::memory_order_acquire)) return;
  testing::HostUpdateHook hook;
  {
    MutexLock lock(hook_mu);
    hook = host_update_hook;
  }
  if (hook) hook(unit, boundary);
}

}  // namespace

void testing::SetHostUpdateHook(HostUpdateHook hook) {
  MutexLock lock(hook_mu);
  has_host_update_hook.store(static_cast<bool>(hook), std::memory_order_release);
  host_update_hook = std::move(hook);
}

void EngineImpl::Decide(const double* partials, int64_t boundary) {
  const double total = SumNormPartials(partials, norm_layout_);
  MutexLock lock(mu_);
  decision_ = decider_.Decide(total);
  if (active_offload_ && decision_.skip && broken_.ok()) {
    broken_ = FailedPrecondition("the gradient norm of optimizer step " + std::to_string(boundary) +
                                 " is not finite, and with zinf.active_offload its units were updated during "
                                 "backward (the step cannot be skipped): no further steps; " +
                                 ResumeHint());
  }
  // The window's close reads its own boundary's: with the optimizer
  // offloaded it runs on the copy stream, possibly after the next decision.
  decided_steps_[boundary] = {decision_, decider_.steps_applied()};
}

Status EngineImpl::EnqueueBoundary() {
  ++boundaries_;
  early_reads_ = false;
  const int64_t boundary = boundaries_;
  // What this enqueues belongs to this boundary's window (TimeSpan).
  struct InBoundary {
    bool& flag;
    explicit InBoundary(bool& f) : flag(f) { flag = true; }
    ~InBoundary() { flag = false; }
  } in_boundary(in_boundary_);
  for (Unit& u : units_) ZINF_RETURN_IF_ERROR(stream_->Wait(*u.released));
  // No update overwrites a shard a gather still reads (one gathered ahead
  // and never fetched).
  ZINF_RETURN_IF_ERROR(gathers_done_->Record(*gather_stream_));
  ZINF_RETURN_IF_ERROR(stream_->Wait(*gathers_done_));
  // Most units' norm partials were taken as their last accumulation finished
  // (EnqueuePartials), during backward; those of units without gradients in
  // the last micro-step are taken now.
  std::vector<char> has_grad(units_.size());
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!units_[i].partials_taken && !units_[i].frozen) ZINF_RETURN_IF_ERROR(EnqueuePartials(i, /*now=*/true));
    has_grad[i] = units_[i].accumulated;
    units_[i].accumulated = units_[i].partials_taken = false;
  }
  // Every swapped gradient is on disk before the boundary reads them back.
  if (nvme_ && swapper_->swapped_grad_units() > 0) {
    ZINF_RETURN_IF_ERROR(
        Timed(&Window::io, "write gradients", [this](const StreamContext&) { return WaitGradWrites(); }));
  }
  // The swapper's reads take it by its own unit index.
  std::vector<char> has_grad_swap;
  for (size_t i = 0; i < units_.size(); ++i) {
    if (swap_id(i) >= 0) has_grad_swap.push_back(has_grad[i]);
  }
  const auto has_grad_shared = std::make_shared<const std::vector<char>>(std::move(has_grad_swap));
  if (sharded()) {
    double* mine = partials_ + rank_ * norm_layout_.blocks_per_rank;
    ZINF_RETURN_IF_ERROR(Collective("all_gather", norm_layout_.blocks_per_rank * world_ * sizeof(double), [&] {
      // Doubles travel as pairs of fp32 words: all-gather only moves bytes.
      return comm_->AllGather(mine, partials_, 2 * norm_layout_.blocks_per_rank, DType::kFloat32, *stream_);
    }));
  }
  if (host_memory_) {
    ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, boundary](const StreamContext& ctx) {
      Decide(static_cast<const double*>(ctx.Host(partials_)), boundary);
      return Status::Ok();
    }));
  } else {
    const int regions = stage_ == 0 ? 1 : world_;
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(h_partials_.data(), partials_,
                                            norm_layout_.blocks_per_rank * regions * sizeof(double), *stream_));
    if (offload_) {
      // The host updates read the decision when they run: it is made by a
      // task where the partials land, and Step() does not wait.
      ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, boundary](const StreamContext&) {
        Decide(static_cast<const double*>(h_partials_.data()), boundary);
        return Status::Ok();
      }));
    } else {
      // The device kernels below take the decision as launch arguments:
      // wait for the step's last reduction and decide here (the one host
      // wait left in a step: optimizer state on the device, CUDA).
      ZINF_RETURN_IF_ERROR(stream_->Synchronize());
      Decide(static_cast<const double*>(h_partials_.data()), boundary);
    }
  }
  ZINF_RETURN_IF_ERROR(decided_->Record(*stream_));
  {
    MutexLock lock(mu_);
    decision_pending_ = true;
  }
  // Per unit, in forward order (EnqueueUnitUpdate).
  for (size_t i = 0; i < units_.size(); ++i) {
    if (units_[i].frozen) continue;  // its compute copy never changes
    if (units_[i].active_updated) {  // updated during backward (zinf.active_offload)
      units_[i].active_updated = false;
      continue;
    }
    ZINF_RETURN_IF_ERROR(EnqueueUnitUpdate(i, has_grad[i] != 0, boundary, /*active=*/false, has_grad_shared));
  }
  if (nvme_) ZINF_RETURN_IF_ERROR(EnqueueSwapDrain());  // the step ends when every sub-group is back on disk
  return EnqueueWindowClose(boundary);
}

// Unit i's update, in forward order at the boundary or during backward
// (active): Adam over the owned range, the new compute copy written in the
// same pass, then (sharded) every rank's new shard gathered; the unit's
// event then releases its next Fetch. With offload, Adam runs on the host
// into a pinned staging slot while the copy stream moves the previous slots
// to the device, so later units are still being updated when the first ones
// are back.
Status EngineImpl::EnqueueUnitUpdate(size_t i, bool has_grad, int64_t boundary, bool active,
                                     const std::shared_ptr<const std::vector<char>>& has_grad_shared) {
  const size_t esize = DTypeSizeBytes(compute_dtype_);
  Unit& u = units_[i];
  // Where the new compute copy goes: a staging slot on its way to the
  // device (offload), the shard's pinned home itself (offload_param with
  // offload), the scratch on its way home (offload_param alone), or its
  // place on the device (no offload, or zero copy).
  const bool home = host_home(u);
  const bool use_slot = offload_ && !home && !zero_copy();
  const size_t slot = use_slot ? i % h_param_slots_.size() : 0;
  // offload_param nvme: the new shard goes home through a staging buffer.
  const bool to_store = u.shard_on_nvme;
  void* home_buf = to_store ? param_bufs_[kUpdateBuffer].data() : u.h_shard.data();
  void* staging = use_slot ? h_param_slots_[slot].data() : home && offload_ ? home_buf : nullptr;
  float* swap = nullptr;  // NVMe: the unit's [master | m | v] in its group's buffer
  // offload: the accumulated gradient, or its place in the gradient buffer,
  // or (kept in place) the reduced gradient in device memory.
  const bool in_place = grad_in_place(u);
  const void* grad = in_place ? static_cast<const void*>(u.grads + owned_begin(u)) : u.h_accum.data();
  if (nvme_) {
    const size_t g = swapper_->group_of(swap_id(i));
    swap = swapper_->state(swap_id(i));
    if (grad_on_nvme(i)) grad = swapper_->grad(swap_id(i));
    if (swapper_->group_units(g).front() == swap_id(i)) {
      ZINF_RETURN_IF_ERROR(
          Timed(&Window::io, "read sub-group " + std::to_string(g),
                [this, g, has = has_grad_shared](const StreamContext&) { return swapper_->ReadGroup(g, *has); }));
    }
  }
  const UpdateTarget target{staging, swap, grad, in_place, home, use_slot, to_store};
  Stream& gather_stream = use_slot ? *copy_stream_ : *stream_;
  if (use_slot) ZINF_RETURN_IF_ERROR(stream_->Wait(*slot_free_[slot]));
  if (!host_memory_ && !offload_) {
    ZINF_RETURN_IF_ERROR(TimeSpan(
        *stream_, "optimizer", u.name, [&] { return EnqueueDeviceUpdate(u, home, has_grad); },
        [](Window& w, double seconds) { w.optimizer += seconds; }));
  } else {
    ZINF_RETURN_IF_ERROR(Timed(&Window::optimizer, u.name, HostUpdateTask(u, target, has_grad, boundary, active)));
    // The gradient kept in place is read: backward may write the next one.
    if (in_place) ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
  }
  if (nvme_ && swapper_->group_units(swapper_->group_of(swap_id(i))).back() == swap_id(i)) {
    const size_t g = swapper_->group_of(swap_id(i));
    ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, g](const StreamContext&) {
      swapper_->IssueWrites(g);
      return Status::Ok();
    }));
  }
  if (home && !offload_ && owned_valid(u) > 0) {
    const uint64_t bytes = owned_valid(u) * esize;
    ZINF_RETURN_IF_ERROR(
        TimedCopies(*stream_, bytes, [&] { return device_.CopyToHost(home_buf, param_scratch_, bytes, *stream_); }));
  }
  if (to_store) {
    // Written before the unit's update counts as done (a gather reads it
    // next); the padding past the valid elements is zeros, as in a shard
    // kept in host memory. Meanwhile the disk still works on the
    // sub-group reads issued ahead.
    ZINF_RETURN_IF_ERROR(Timed(&Window::io, "write shard " + u.name, [this, i, home_buf, esize](const StreamContext&) {
      const Unit& w = units_[i];
      const uint64_t valid = std::max<int64_t>(0, owned_valid(w)) * esize;
      std::memset(static_cast<char*>(home_buf) + valid, 0, w.part.shard_elems * esize - valid);
      return SwapFailure(param_store_->Write(i, home_buf).Wait(), SwapKind::kParams);
    }));
  }
  if (use_slot) {
    ZINF_RETURN_IF_ERROR(slot_filled_[slot]->Record(*stream_));
    ZINF_RETURN_IF_ERROR(copy_stream_->Wait(*slot_filled_[slot]));
    const int64_t valid = owned_valid(u);
    if (valid > 0) {
      void* dst = param_home(u);
      ZINF_RETURN_IF_ERROR(TimedCopies(*copy_stream_, valid * esize, [&] {
        return device_.CopyToDevice(dst, staging, valid * esize, *copy_stream_);
      }));
    }
  }
  if (sharded() && !u.partitioned) {
    void* mine = static_cast<char*>(u.params) + u.part.shard_begin(rank_) * esize;
    ZINF_RETURN_IF_ERROR(Collective(gather_stream, "all_gather", u.part.padded_elems * esize, [&] {
      return comm_->AllGather(mine, u.params, u.part.shard_elems, compute_dtype_, gather_stream);
    }));
  }
  ZINF_RETURN_IF_ERROR(u.params_ready->Record(gather_stream));
  if (use_slot) ZINF_RETURN_IF_ERROR(slot_free_[slot]->Record(*copy_stream_));
  return Status::Ok();
}

Status EngineImpl::MaybeActiveUpdate(size_t i) {
  Unit& u = units_[i];
  if (!active_offload_ || micro_in_window_ != accumulation_ - 1 || u.active_updated || !u.partials_taken ||
      !u.released_after_grads || !u.accumulated) {
    return Status::Ok();
  }
  u.active_updated = true;
  ZINF_RETURN_IF_ERROR(stream_->Wait(*u.released));
  ZINF_RETURN_IF_ERROR(gathers_done_->Record(*gather_stream_));  // no gather still reads the shard
  ZINF_RETURN_IF_ERROR(stream_->Wait(*gathers_done_));
  return EnqueueUnitUpdate(i, /*has_grad=*/true, boundaries_ + 1, /*active=*/true, nullptr);
}

Status EngineImpl::EnqueueDeviceUpdate(Unit& u, bool home, bool has_grad) {
  Decision d;
  {
    MutexLock lock(mu_);
    d = decision_;
  }
  const int64_t valid = owned_valid(u);
  if (valid == 0) {  // only padding here: nothing to update, but the unit took a step
    if (!d.skip && has_grad) ++u.steps;
    return Status::Ok();
  }
  float* master = static_cast<float*>(u.master);
  void* param_dst = home ? param_scratch_ : param_home(u);
  if (d.skip || !has_grad) {  // the scratch is copied home regardless: refill it with the unchanged copy
    if (home) return kernels_.cast(master, DType::kFloat32, param_dst, compute_dtype_, valid, *stream_);
    return Status::Ok();
  }
  const bool copy = compute_dtype_ != DType::kFloat32;
  const size_t esize = DTypeSizeBytes(compute_dtype_);
  const auto groups = groups_snapshot_;
  for (const UnitLayout::GroupRun& r : u.GroupRuns(owned_begin(u), valid)) {
    ZINF_ASSIGN_OR_RETURN(math::AdamStepConstants constants,
                          cpu::MakeAdamStepConstants(GroupAdam(d.adam, *groups, r.group), u.steps + 1, d.grad_scale));
    ZINF_RETURN_IF_ERROR(kernels_
                             .adam_step(constants, master + r.offset, static_cast<float*>(u.exp_avg) + r.offset,
                                        static_cast<float*>(u.exp_avg_sq) + r.offset,
                                        static_cast<const float*>(owned_accum(u)) + r.offset,
                                        copy ? static_cast<char*>(param_dst) + r.offset * esize : nullptr,
                                        compute_dtype_, r.elems, *stream_)
                             .WithContext("unit '" + u.name + "'"));
  }
  ++u.steps;
  if (!copy) return device_.CopyOnDevice(param_dst, master, valid * 4, *stream_);
  return Status::Ok();
}

// The compute copy of a unit from its fp32 master (host; master[0] is element
// `first`, and it covers what this rank keeps: its shard when the unit is
// partitioned, else the whole unit): the master's rounding, written where
// this rank keeps it. Synchronizes (the staging vector dies here).
Status EngineImpl::WriteComputeCopy(Unit& u, const float* master, int64_t first) {
  const size_t esize = DTypeSizeBytes(compute_dtype_);
  const int64_t begin = u.partitioned ? u.part.shard_begin(rank_) : 0;
  const int64_t count = u.partitioned ? u.part.valid_in_shard(rank_) : u.part.num_elems;
  if (count <= 0) return Status::Ok();
  if (begin < first) return Internal("WriteComputeCopy: the master given starts after the range to write");
  if (u.shard_on_nvme) {
    if (!finalized_) return Status::Ok();  // registration: AddShardToStore writes it
    // Through the updates' staging buffer, once nothing else uses it.
    ZINF_RETURN_IF_ERROR(Synchronize());
    void* buf = param_bufs_[kUpdateBuffer].data();
    std::memset(buf, 0, param_bufs_[kUpdateBuffer].size_bytes());
    ZINF_RETURN_IF_ERROR(cpu::Cast(arena_, master + (begin - first), DType::kFloat32, buf, compute_dtype_, count));
    return SwapFailure(param_store_->Write(u.index, buf).Wait(), SwapKind::kParams);
  }
  if (host_home(u))
    return cpu::Cast(arena_, master + (begin - first), DType::kFloat32, u.h_shard.data(), compute_dtype_, count);
  std::vector<uint8_t> compute(count * esize);
  ZINF_RETURN_IF_ERROR(
      cpu::Cast(arena_, master + (begin - first), DType::kFloat32, compute.data(), compute_dtype_, count));
  ZINF_RETURN_IF_ERROR(
      device_.CopyToDevice(u.partitioned ? u.shard_params : u.params, compute.data(), compute.size(), *stream_));
  return stream_->Synchronize();
}

// Unit u's host update at the boundary (HostDevice, or the optimizer
// offloaded): Adam over the owned range with the boundary's decision, the new
// compute copy written where `t` says; a skipped or gradient-less unit keeps
// its state and refills a staging copy that goes on regardless.
StreamTask EngineImpl::HostUpdateTask(Unit& u, const UpdateTarget& t, bool has, int64_t boundary, bool active) {
  // The groups' hyper-parameters as they are now, when the update is enqueued.
  return [this, &u, staging = t.staging, swap = t.swap, grad = t.grad, grad_in_place = t.grad_in_place, home = t.home,
          use_slot = t.use_slot, to_store = t.to_store, has, boundary, active,
          groups = groups_snapshot_](const StreamContext& ctx) -> Status {
    RunHostUpdateHook(u.index, boundary);
    Decision d;
    {
      MutexLock lock(mu_);
      // Active: the previous boundary's decision ran before this task on
      // the engine stream, so the step count is this boundary's.
      d = active ? decider_.Predecide() : decision_;
    }
    const int64_t valid = owned_valid(u);
    if (valid == 0) {  // only padding on this rank: nothing to update, but the unit took a step
      if (!d.skip && has) ++u.steps;
      return Status::Ok();
    }
    cpu::AdamBuffers b;
    if (swap) {
      const int64_t owned = owned_elems(u);
      b.params = swap;
      b.exp_avg = swap + owned;
      b.exp_avg_sq = swap + 2 * owned;
    } else {
      b.params = static_cast<float*>(offload_ ? u.h_master.data() : ctx.Host(u.master));
      b.exp_avg = static_cast<float*>(offload_ ? u.h_exp_avg.data() : ctx.Host(u.exp_avg));
      b.exp_avg_sq = static_cast<float*>(offload_ ? u.h_exp_avg_sq.data() : ctx.Host(u.exp_avg_sq));
    }
    b.grads = !offload_ ? ctx.Host(owned_accum(u)) : grad_in_place ? ctx.Host(grad) : grad;
    b.grad_dtype = DType::kFloat32;
    b.num_elems = static_cast<size_t>(valid);
    // Offload writes through its staging unless zero copy writes in place.
    void* param_dst = staging ? staging : ctx.Host(home ? param_scratch_ : param_home(u));
    if (d.skip || !has) {
      // Skipped (an overflow, or no gradient for this unit this window).
      // A staging slot, the scratch or a parameter staging buffer is
      // copied on regardless: refill it with the unchanged compute copy
      // (always the rounding of the master).
      if (use_slot || (home && !offload_) || to_store) {
        return cpu::Cast(arena_, b.params, DType::kFloat32, param_dst, compute_dtype_, valid);
      }
      return Status::Ok();
    }
    // The new compute copy in the same pass (fp32: the master's bits).
    b.param_copy = param_dst;
    b.param_copy_dtype = compute_dtype_;
    // The unit's own step count, as an optimizer keeps one per parameter;
    // each run of one parameter group with its hyper-parameters.
    const size_t esize = DTypeSizeBytes(compute_dtype_);
    for (const UnitLayout::GroupRun& r : u.GroupRuns(owned_begin(u), valid)) {
      ZINF_ASSIGN_OR_RETURN(math::AdamStepConstants constants,
                            cpu::MakeAdamStepConstants(GroupAdam(d.adam, *groups, r.group), u.steps + 1, d.grad_scale));
      cpu::AdamBuffers run = b;
      run.params += r.offset;
      run.exp_avg += r.offset;
      run.exp_avg_sq += r.offset;
      run.grads = static_cast<const float*>(b.grads) + r.offset;
      if (run.param_copy) run.param_copy = static_cast<char*>(b.param_copy) + r.offset * esize;
      run.num_elems = static_cast<size_t>(r.elems);
      ZINF_RETURN_IF_ERROR(cpu::AdamStep(arena_, constants, run).WithContext("unit '" + u.name + "'"));
    }
    ++u.steps;
    return Status::Ok();
  };
}

}  // namespace zinf::sched
