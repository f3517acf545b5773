// Gradient accumulation and reduction.
//
// Owns: the reduce buckets (stage 2/3: units in the order their gradients
// became ready, each reduced once per micro-step, ranks' shards rank-major
// in the staging bucket), the accumulators on the device or in pinned host
// memory, and the norm partials of each unit's accumulated gradient. Runs
// on the engine stream, after the client's grads_ready event; frees each
// unit's gradients (grads_free) once reduced.
#include "sched/engine_impl.h"

namespace zinf::sched {

Status EngineImpl::GradsReady(int unit, Stream& stream) {
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "GradsReady"));
  ZINF_RETURN_IF_ERROR(Finalize());
  Unit& u = units_[unit];
  if (u.frozen) return InvalidArgument("GradsReady(unit '" + u.name + "'): the unit is frozen (it has no gradients)");
  if (u.grads_ready_this_micro) {
    return FailedPrecondition("GradsReady(unit '" + u.name + "') twice in one micro-step; call Step() between");
  }
  u.grads_ready_this_micro = true;
  if (nvme_ && !early_reads_ && micro_in_window_ == accumulation_ - 1) {
    // The optimizer state does not depend on the gradients: its first
    // sub-groups are read while backward still runs.
    early_reads_ = true;
    ZINF_RETURN_IF_ERROR(stream_->Enqueue([this](const StreamContext&) { return swapper_->IssueReads(0, nullptr); }));
  }
  if (u.partitioned && !u.grads) ZINF_RETURN_IF_ERROR(AllocateGrads(u, stream, /*zero=*/true));
  ZINF_RETURN_IF_ERROR(u.grads_ready->Record(stream));
  const int64_t P = u.part.padded_elems;
  if (stage_ < 2) {
    const bool first = !u.accumulated;
    u.accumulated = true;
    ZINF_RETURN_IF_ERROR(stream_->Wait(*u.grads_ready));
    if (distributed()) {
      ZINF_RETURN_IF_ERROR(Collective("all_reduce", P * 4, [&] {
        return comm_->AllReduce(u.grads, u.grads, P, DType::kFloat32, ReduceOp::kSum, *stream_);
      }));
    }
    if (offload_) {
      ZINF_RETURN_IF_ERROR(HostAccumulate(u, u.grads + owned_begin(u), first));
    } else {
      ZINF_RETURN_IF_ERROR(EnqueueAccumulate(u.accum, u.grads, P, first));
    }
    if (!grad_in_place(u)) ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
    ZINF_RETURN_IF_ERROR(EnqueuePartials(unit));
    return MaybeActiveUpdate(static_cast<size_t>(unit));
  }
  // Stages 2 and 3: into the open bucket; closed buckets go out now
  // (overlap_comm) or when the micro-step's last unit is ready (else Step()
  // closes it: units not fetched this micro-step have no gradients).
  const bool last =
      std::all_of(units_.begin(), units_.end(), [](const Unit& x) { return x.grads_ready_this_micro || x.frozen; });
  if (buckets_.Add(unit, P, last)) return FlushPendingBuckets();
  return Status::Ok();
}

Status EngineImpl::FlushPendingBuckets() {
  for (const std::vector<int>& b : buckets_.closed()) ZINF_RETURN_IF_ERROR(FlushBucket(b));
  buckets_.ClearClosed();
  return Status::Ok();
}

Status EngineImpl::FlushBucket(const std::vector<int>& bucket) {
  // The unit's first accumulation of the window copies, the later ones add.
  auto first_of = [this](int i) {
    const bool first = !units_[i].accumulated;
    units_[i].accumulated = true;
    return first;
  };
  for (int i : bucket) ZINF_RETURN_IF_ERROR(stream_->Wait(*units_[i].grads_ready));
  const bool pack = bucket.size() > 1 && config_.zero.contiguous_gradients && distributed();
  if (!pack) {
    // One reduce-scatter per unit, in place: this rank's shard of the sum
    // lands at its own offset of the gradient buffer.
    for (int i : bucket) {
      Unit& u = units_[i];
      float* shard = u.grads + u.part.shard_begin(rank_);
      if (distributed()) {
        ZINF_RETURN_IF_ERROR(Collective("reduce_scatter", u.part.padded_elems * 4, [&] {
          return comm_->ReduceScatter(u.grads, shard, u.part.shard_elems, DType::kFloat32, ReduceOp::kSum, *stream_);
        }));
      }
      const bool first = first_of(i);
      ZINF_RETURN_IF_ERROR(offload_ ? HostAccumulate(u, shard, first)
                                    : EnqueueAccumulate(u.accum, shard, u.part.valid_in_shard(rank_), first));
      if (!grad_in_place(u)) ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
      ZINF_RETURN_IF_ERROR(FreeGradsIfTransient(u));
      ZINF_RETURN_IF_ERROR(EnqueuePartials(i));
      ZINF_RETURN_IF_ERROR(MaybeActiveUpdate(static_cast<size_t>(i)));
    }
    return Status::Ok();
  }
  // Contiguous: pack rank-major (every rank's shards of every unit in the
  // bucket), one reduce-scatter, then accumulate this rank's slices.
  int64_t count = 0;
  for (int i : bucket) count += units_[i].part.shard_elems;
  const int64_t needed = count * world_;
  if (needed > bucket_capacity_) {
    if (bucket_) ZINF_RETURN_IF_ERROR(device_.Free(bucket_, *stream_));
    bucket_ = nullptr;
    ZINF_ASSIGN_OR_RETURN(void* b, Alloc(needed * 4, "the reduce bucket"));
    bucket_ = static_cast<float*>(b);
    bucket_capacity_ = needed;
  }
  auto pack_bucket = [&]() -> Status {
    for (int r = 0; r < world_; ++r) {
      int64_t off = r * count;
      for (int i : bucket) {
        const Unit& u = units_[i];
        ZINF_RETURN_IF_ERROR(
            device_.CopyOnDevice(bucket_ + off, u.grads + u.part.shard_begin(r), u.part.shard_elems * 4, *stream_));
        off += u.part.shard_elems;
      }
    }
    return Status::Ok();
  };
  ZINF_RETURN_IF_ERROR(
      TimeSpan(*stream_, "copy", "pack bucket", pack_bucket, [](Window& w, double seconds) { w.copy += seconds; }));
  for (int i : bucket) ZINF_RETURN_IF_ERROR(FreeGradsIfTransient(units_[i]));  // packed: the bucket holds them now
  float* mine = bucket_ + rank_ * count;
  ZINF_RETURN_IF_ERROR(Collective("reduce_scatter", needed * 4, [&] {
    return comm_->ReduceScatter(bucket_, mine, count, DType::kFloat32, ReduceOp::kSum, *stream_);
  }));
  int64_t off = 0;
  for (int i : bucket) {
    Unit& u = units_[i];
    const bool first = first_of(i);
    ZINF_RETURN_IF_ERROR(offload_ ? HostAccumulate(u, mine + off, first)
                                  : EnqueueAccumulate(u.accum, mine + off, u.part.valid_in_shard(rank_), first));
    ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
    ZINF_RETURN_IF_ERROR(EnqueuePartials(i));
    ZINF_RETURN_IF_ERROR(MaybeActiveUpdate(static_cast<size_t>(i)));
    off += u.part.shard_elems;
  }
  return Status::Ok();
}

Status EngineImpl::HostAccumulate(Unit& u, const float* reduced, bool first) {
  if (grad_on_nvme(u.index)) return SwapAccumulate(static_cast<size_t>(&u - units_.data()), reduced, first);
  const int64_t n = owned_elems(u);
  if (grad_in_place(u)) {
    // The update reads it there (EnqueueUnitUpdate records grads_free).
    if (reduced != u.grads + owned_begin(u)) {
      return Internal("unit '" + u.name + "': a gradient kept in place was reduced somewhere else");
    }
    return Status::Ok();
  }
  float* a = static_cast<float*>(u.h_accum.data());
  if (zero_copy() && !first) return EnqueueHostAdd(a, false, reduced, true, n);  // the host reads the device's memory
  float* dst = first ? a : static_cast<float*>(h_grad_stage_.data());
  ZINF_RETURN_IF_ERROR(TimedCopies(*stream_, n * 4, [&] { return device_.CopyToHost(dst, reduced, n * 4, *stream_); }));
  if (first) return Status::Ok();
  return EnqueueHostAdd(a, false, dst, false, n);
}

// accum = reduced (first micro-step of the window) or accum + reduced: the
// same fp32 additions in the same order in every stage. Stages 2 and 3 take
// a shard's real elements only; its padding stays the zeros Alloc wrote.
Status EngineImpl::EnqueueAccumulate(float* accum, const float* reduced, int64_t elems, bool first) {
  if (elems <= 0) return Status::Ok();  // a shard of padding only
  if (first) return device_.CopyOnDevice(accum, reduced, elems * 4, *stream_);
  if (!host_memory_) return kernels_.add_in_place(accum, reduced, elems, *stream_);
  return EnqueueHostAdd(accum, true, reduced, true, elems);
}

// accum[i] = accum[i] + reduced[i] on the engine stream, by the CPU; each
// in host memory, or (*_device) in device memory the host addresses.
Status EngineImpl::EnqueueHostAdd(float* accum, bool accum_device, const float* reduced, bool reduced_device,
                                  int64_t elems) {
  auto task = [=, this](const StreamContext& ctx) {
    float* a = static_cast<float*>(accum_device ? ctx.Host(accum) : accum);
    const float* r = static_cast<const float*>(reduced_device ? ctx.Host(reduced) : reduced);
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, elems, int64_t{1} << 16),
                        [&](const tbb::blocked_range<int64_t>& range) {
                          for (int64_t i = range.begin(); i < range.end(); ++i) a[i] = a[i] + r[i];
                        });
    });
    return Status::Ok();
  };
  return elems <= kShortTaskElems ? stream_->EnqueueShort(task) : stream_->Enqueue(task);
}

// The per-block partials of unit i's owned accumulated gradient, once its
// last micro-step of the window is accumulated: during backward, off the
// boundary's critical path.
Status EngineImpl::EnqueuePartials(size_t i, bool now) {
  if (units_[i].frozen || (!now && micro_in_window_ != accumulation_ - 1)) return Status::Ok();
  const int region = stage_ == 0 ? 0 : rank_;
  const bool zero = !units_[i].accumulated;
  units_[i].partials_taken = true;
  // offload: the accumulated gradient in host memory (a swapped one in the
  // staging buffer it went out from, or read back into one).
  const void* host_accum = units_[i].h_accum.data();
  if (grad_on_nvme(i) && !zero) {
    int stage = grad_stage_of_[i];
    if (stage < 0) {
      ZINF_ASSIGN_OR_RETURN(stage, AcquireGradStage(i));
      ZINF_RETURN_IF_ERROR(ReadSwappedGrads(i, stage));
    }
    host_accum = swapper_->grad_stage(stage);
  }
  if (!host_memory_) return DevicePartials(i, region, zero, host_accum);
  return stream_->Enqueue([this, region, i, zero, host_accum](const StreamContext& ctx) -> Status {
    double* out = static_cast<double*>(ctx.Host(partials_)) + region * norm_layout_.blocks_per_rank;
    const Unit& u = units_[i];
    const int64_t n = owned_elems(u);
    if (zero) {  // no gradient this window: nothing in the norm
      std::fill_n(out + norm_layout_.unit_block_offset[i], cpu::NumNormBlocks(n), 0.0);
      return Status::Ok();
    }
    const void* accum = grad_in_place(u) ? ctx.Host(u.grads + owned_begin(u))
                        : offload_       ? host_accum
                                         : ctx.Host(owned_accum(u));
    return cpu::SumSquaresBlocks(arena_, accum, DType::kFloat32, n,
                                 std::span<double>(out + norm_layout_.unit_block_offset[i], cpu::NumNormBlocks(n)))
        .status();
  });
}

// EnqueuePartials on a device whose memory the host cannot address: the
// kernel over a device-resident accumulation; with offload, the host's
// partials of the pinned accumulation, copied down into their place.
Status EngineImpl::DevicePartials(size_t i, int region, bool zero, const void* host_accum) {
  const Unit& u = units_[i];
  const int64_t n = owned_elems(u);
  const int64_t blocks = n / kNormBlock;
  double* out = partials_ + region * norm_layout_.blocks_per_rank + norm_layout_.unit_block_offset[i];
  if (zero) return device_.Memset(out, 0, blocks * sizeof(double), *stream_);  // +0.0 is all zero bits
  if (!offload_) return kernels_.sum_squares_blocks(owned_accum(u), n, out, *stream_);
  double* host = static_cast<double*>(h_partials_.data()) + norm_layout_.unit_block_offset[i];
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, host_accum, n, host, blocks](const StreamContext&) {
    return cpu::SumSquaresBlocks(arena_, host_accum, DType::kFloat32, n, std::span<double>(host, blocks)).status();
  }));
  return device_.CopyToDevice(out, host, blocks * sizeof(double), *stream_);
}

}  // namespace zinf::sched
