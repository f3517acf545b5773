// The stage-3 parameter coordinator, and the gradient buffers the client
// writes.
//
// Owns: each partitioned unit's gathered copy between its gather and its
// release (or drop), the Fetch trace and its prefetch, and the transient
// gradient buffers of partitioned units. Runs on the client's stream
// (Fetch, GradBuffers, Release) and the gather stream (Gather: shard read,
// copied up, all-gathered, each after its unit's last update). Waits for
// the unit's update (params_ready) before a gather and for the client's
// release before a drop. On several ranks, which units are gathered, and
// when, depends only on the Fetch trace and the element caps, never on this
// rank's allocator: a shortage there is an error, not a skipped prefetch.
#include "sched/engine_impl.h"

namespace zinf::sched {
namespace {

// On several ranks the gathers follow the trace and the element caps, which
// every rank computes alike. Skipping a prefetch, or dropping a unit held
// ahead, because this rank's allocator ran short would change this rank's
// all-gathers alone and pair its collectives with the wrong ones elsewhere;
// a shortage is an error instead.
constexpr const char* kRankLocalShortage =
    "device memory short on this rank (on several ranks a gather is never skipped or redone on one rank alone, so "
    "that every rank issues the same collectives in the same order): lower "
    "zero_optimization.stage3_prefetch_bucket_size or stage3_max_live_parameters, or raise the device memory";

}  // namespace

Result<UnitPointers> EngineImpl::Fetch(int unit, Stream& stream) {
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "Fetch"));
  ZINF_RETURN_IF_ERROR(Finalize());
  Unit& u = units_[unit];
  if (u.active_updated) {
    return FailedPrecondition("Fetch(unit '" + u.name +
                              "') after its gradients were ready in the window's last "
                              "micro-step: with zinf.active_offload its update has started (fetch every unit before "
                              "its GradsReady in a micro-step)");
  }
  u.fetched_this_micro = true;
  ZINF_RETURN_IF_ERROR(
      WaitTimed(stream, *u.params_ready, u, nvme_ ? "disk" : "optimizer", "update of unit '" + u.name + "'"));
  ZINF_RETURN_IF_ERROR(WaitTimed(stream, *u.grads_free, u, "comm", "gradient reduction of unit '" + u.name + "'"));
  if (u.partitioned) {
    u.fetch_stream = &stream;
    NoteFetch(unit);
    const bool hit = u.gathered && u.prefetched;
    ZINF_RETURN_IF_ERROR(Gather(u, /*prefetch=*/false));
    u.prefetched = false;
    u.client_holds = true;
    // Counted in the engine stream's order, so the step they belong to is
    // the one whose boundary follows them there.
    ZINF_RETURN_IF_ERROR(stream_->EnqueueShort([this, hit](const StreamContext&) {
      MutexLock lock(mu_);
      stream_counts_.fetches += 1;
      stream_counts_.prefetch_hits += hit;
      return Status::Ok();
    }));
    const char* cause = u.shard_on_nvme ? "disk" : distributed() ? "comm" : host_home(u) ? "copy" : "comm";
    ZINF_RETURN_IF_ERROR(WaitTimed(stream, *u.gathered_ready, u, cause, "all-gather of unit '" + u.name + "'"));
    ZINF_RETURN_IF_ERROR(Prefetch());
    return UnitPointers{u.gathered, compute_dtype_, u.part.num_elems, u.gathered_ptrs.at(u.gathered)};
  }
  return UnitPointers{u.params, compute_dtype_, u.part.num_elems, u.param_ptrs};
}

Result<UnitPointers> EngineImpl::GradBuffers(int unit) {
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "GradBuffers"));
  Unit& u = units_[unit];
  if (u.frozen) return InvalidArgument("GradBuffers(unit '" + u.name + "'): the unit is frozen (it has no gradients)");
  if (!u.partitioned) return UnitPointers{u.grads, DType::kFloat32, u.part.num_elems, u.grad_ptrs};
  if (!u.grads) {
    // On the stream of the unit's Fetch this micro-step (backward's,
    // usually, or the forward's when this comes first), else on the
    // engine's; a later Fetch on another stream waits for the allocation
    // through grads_free.
    Stream& s = u.fetch_stream ? *u.fetch_stream : *stream_;
    ZINF_RETURN_IF_ERROR(AllocateGrads(u, s, /*zero=*/false));
    if (!u.client_holds) ZINF_RETURN_IF_ERROR(u.grads_free->Record(s));
  }
  return UnitPointers{u.grads, DType::kFloat32, u.part.num_elems, u.grad_ptrs_at.at(u.grads)};
}

// Stage 3: a partitioned unit's gradient buffer, from the budget, usable by
// the client's work on `stream` from here. Backward writes only the
// tensors: the padding past them is zeroed where something reads it (a
// collective sums it, or the host copy of the owned range takes it along),
// and all of it for a unit whose GradsReady came without GradBuffers (no
// gradient written: zeros). With one rank and the optimizer on the device
// only the unit's own elements are accumulated (FlushBucket), so the
// padding, up to a 64 Ki-element block of a small unit, is left as it is.
Status EngineImpl::AllocateGrads(Unit& u, Stream& stream, bool zero) {
  const uint64_t bytes = static_cast<uint64_t>(u.part.padded_elems) * 4;
  auto g = AllocateForClient(bytes, stream);
  if (!g.ok()) return g.status().WithContext("gradients of unit '" + u.name + "' (stage 3)");
  u.grads = static_cast<float*>(*g);
  const int64_t from = zero ? 0 : u.part.num_elems;
  const int64_t to = zero || distributed() || offload_ ? u.part.padded_elems : u.part.num_elems;
  if (to > from) {
    ZINF_RETURN_IF_ERROR(device_.Memset(u.grads + from, 0, (to - from) * 4, stream));
  }
  std::vector<void*>& ptrs = u.grad_ptrs_at[u.grads];
  if (ptrs.empty()) {
    for (int64_t off : u.tensor_offsets) ptrs.push_back(u.grads + off);
  }
  return Status::Ok();
}

// Stage 3: the gradient buffer goes once the engine stream has consumed it.
Status EngineImpl::FreeGradsIfTransient(Unit& u) {
  if (!u.partitioned || !u.grads) return Status::Ok();
  ZINF_RETURN_IF_ERROR(device_.Free(u.grads, *stream_));
  u.grads = nullptr;
  return Status::Ok();
}

Status EngineImpl::Release(int unit, Stream& stream) {
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "Release"));
  Unit& u = units_[unit];
  if (u.gathered && u.client_holds) {
    // Stage 3: the gathered copy goes once `stream` is done with it, unless
    // the trace uses it again within stage3_max_reuse_distance.
    u.client_holds = false;
    if (KeepForReuse(unit)) {
      u.prefetched = true;
    } else {
      ZINF_RETURN_IF_ERROR(device_.Free(u.gathered, stream));
      u.gathered = nullptr;
      live_elems_ -= u.part.padded_elems;
    }
  }
  ZINF_RETURN_IF_ERROR(u.released->Record(stream));
  if (u.grads_ready_this_micro) {
    u.released_after_grads = true;
    return MaybeActiveUpdate(static_cast<size_t>(unit));
  }
  return Status::Ok();
}

void EngineImpl::NoteFetch(int unit) {
  const std::optional<FetchTrace::Divergence> d = fetch_trace_.Note(unit);
  if (d && !order_change_logged_) {
    order_change_logged_ = true;
    ZINF_LOG_INFO(
        "engine: the order of Fetch calls changed (call {} is unit '{}', the recorded order has {}): no "
        "prefetch until the new order is recorded (this is said once)",
        d->call + 1, units_[unit].name,
        d->expected >= 0 ? "'" + units_[d->expected].name + "'" : std::string("no more calls"));
  }
}

// Gathers the units the trace fetches next, while the elements gathered
// ahead stay within stage3_prefetch_bucket_size and everything gathered
// within stage3_max_live_parameters and the device budget.
Status EngineImpl::Prefetch() {
  const std::vector<int> ahead =
      fetch_trace_.Ahead([this](int u) { return units_[u].gathered != nullptr; }, live_elems_,
                         config_.zero.stage3_prefetch_bucket_size, config_.zero.stage3_max_live_parameters);
  for (int i : ahead) {
    Unit& w = units_[i];
    Status s = Gather(w, /*prefetch=*/true);
    // One rank: the device budget is full, the client's Fetch gathers it.
    if (s.code() == StatusCode::kOutOfMemory && !distributed()) break;
    if (s.code() == StatusCode::kOutOfMemory) return s.WithContext(kRankLocalShortage);
    ZINF_RETURN_IF_ERROR(s);
    w.prefetched = true;
  }
  return Status::Ok();
}

// Whether the trace fetches `unit` again within stage3_max_reuse_distance
// elements (of the units fetched in between), with the live cap respected.
bool EngineImpl::KeepForReuse(int unit) const {
  return fetch_trace_.ReusedWithin(unit, live_elems_, config_.zero.stage3_max_live_parameters,
                                   config_.zero.stage3_max_reuse_distance);
}

// Frees a gathered copy the engine holds (prefetched, or kept after the
// client's Release), after the client's last use of it.
Status EngineImpl::DropGathered(Unit& u) {
  ZINF_RETURN_IF_ERROR(gather_stream_->Wait(*u.released));
  ZINF_RETURN_IF_ERROR(device_.Free(u.gathered, *gather_stream_));
  u.gathered = nullptr;
  u.prefetched = false;
  live_elems_ -= u.part.padded_elems;
  return Status::Ok();
}

Result<void*> EngineImpl::AllocateForClient(uint64_t bytes, Stream& stream) {
  auto p = device_.Allocate(bytes, stream);
  if (p.ok() || p.status().code() != StatusCode::kOutOfMemory) return p;
  if (distributed()) return p.status().WithContext(kRankLocalShortage);
  // One rank: what the engine holds ahead of use gives way to what the client needs now.
  ZINF_RETURN_IF_ERROR(DropEngineHeld());
  return device_.Allocate(bytes, stream);
}

Status EngineImpl::DropEngineHeld() {
  for (Unit& u : units_) {
    if (u.gathered && !u.client_holds) ZINF_RETURN_IF_ERROR(DropGathered(u));
  }
  return Status::Ok();
}

// Stage 3: the whole unit from every rank's shard, into device memory from
// the budget, on the gather stream after the shard's last update (the
// shard read from NVMe or copied up from the host first when it lives there).
Status EngineImpl::Gather(Unit& u, bool prefetch) {
  if (u.gathered) return Status::Ok();  // still held since the last Fetch, prefetched or kept
  Stream& gs = *gather_stream_;
  const size_t esize = DTypeSizeBytes(compute_dtype_);
  const uint64_t bytes = u.part.padded_elems * esize;
  // A prefetch takes only free memory (Prefetch decides what a shortage means).
  auto full = prefetch ? device_.Allocate(bytes, gs) : AllocateForClient(bytes, gs);
  if (!full.ok()) return full.status().WithContext("gathering unit '" + u.name + "'");
  u.gathered = *full;
  live_elems_ += u.part.padded_elems;
  ZINF_RETURN_IF_ERROR(gs.Wait(*u.params_ready));
  const void* shard = u.shard_params;
  if (host_home(u)) {  // the shard comes up from the host into its place in the gathered buffer
    void* mine = static_cast<char*>(u.gathered) + u.part.shard_begin(rank_) * esize;
    const void* src = u.h_shard.data();
    if (u.shard_on_nvme) {  // first from the parameter store into the gathers' staging buffer
      void* buf = param_bufs_[kGatherBuffer].data();
      src = buf;
      const int index = static_cast<int>(&u - units_.data());
      auto read = [this, index, buf](const StreamContext&) -> Status {
        return param_store_->Read(index, buf)
            .Wait()
            .WithContext("parameter shard of unit '" + units_[index].name + "'");
      };
      ZINF_RETURN_IF_ERROR(Timed(&Window::io, "read shard " + u.name, std::move(read), &gs));
    }
    ZINF_RETURN_IF_ERROR(TimedCopies(gs, u.part.shard_elems * esize,
                                     [&] { return device_.CopyToDevice(mine, src, u.part.shard_elems * esize, gs); }));
    shard = mine;
  }
  if (distributed()) {
    ZINF_RETURN_IF_ERROR(Collective(gs, "all_gather", u.part.padded_elems * esize, [&] {
      return comm_->AllGather(shard, u.gathered, u.part.shard_elems, compute_dtype_, gs);
    }));
  } else if (!host_home(u)) {
    // One rank: the unit's own elements (its tensors' views and ReadState
    // read no further; the padding, up to a 64 Ki-element block, is not read).
    ZINF_RETURN_IF_ERROR(device_.CopyOnDevice(u.gathered, shard, u.part.num_elems * esize, gs));
  }
  ZINF_RETURN_IF_ERROR(u.gathered_ready->Record(gs));
  std::vector<void*>& ptrs = u.gathered_ptrs[u.gathered];
  if (ptrs.empty()) {
    for (int64_t off : u.tensor_offsets) ptrs.push_back(static_cast<char*>(u.gathered) + off * esize);
  }
  return Status::Ok();
}

}  // namespace zinf::sched
