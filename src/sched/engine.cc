// The engine for ZeRO stages 0-3, with the optimizer state on the device, in
// pinned host memory or on NVMe (offload_optimizer), and at stage 3 the
// parameter shards on the device, in pinned host memory or on NVMe
// (offload_param).
//
// Per unit, on the device (P = padded elements, S = shard = P / N):
//   params      compute dtype, P   — every rank holds the whole unit (stage 3:
//                                    only while gathered, and persistent units)
//   grads       fp32, P            — backward writes it each micro-step; for a
//                                    stage-3 partitioned unit only from its
//                                    GradBuffers call to its reduction
//   accum       fp32, P (stage 0/1) or S (stages 2/3) — the sum over micro-steps
//   master/m/v  fp32, P (stage 0) or S (stages 1-3)  — the owned range, where
//                                    offload_optimizer is none
// One engine stream runs, in enqueue order: the waits on the client's
// events, the collectives, the accumulation, the norm, the decision (skip,
// clip, loss scale) and the per-unit updates, each unit's end marked by an
// event that the next Fetch of that unit waits on. Stage 3's gathers run on
// a gather stream of their own, each after its unit's update.
//
// This file is the facade: registration and placement, the micro-step's
// end, and Create. The rest is in the files engine_impl.h lists.
#include <cmath>
#include <cstdio>

#include "sched/engine_impl.h"
#include "sched/rank_failures.h"

namespace zinf::sched {

Result<void*> EngineImpl::Alloc(uint64_t bytes, const std::string& what) {
  auto p = device_.Allocate(bytes, *stream_);
  if (!p.ok()) return p.status().WithContext(what);
  ZINF_RETURN_IF_ERROR(device_.Memset(*p, 0, bytes, *stream_));
  return *p;
}

Result<int> EngineImpl::AddParamGroup(const ParamGroupOptions& options) {
  if (finalized_)
    return FailedPrecondition("AddParamGroup after the first Fetch: define groups before the first micro-step");
  if (!std::isfinite(options.weight_decay) || options.weight_decay < 0) {
    return InvalidArgument("parameter group " + std::to_string(groups_.size()) +
                           ": weight_decay must be a finite value >= 0, got " + std::to_string(options.weight_decay));
  }
  if (!std::isfinite(options.lr)) {
    return InvalidArgument("parameter group " + std::to_string(groups_.size()) + ": lr must be finite");
  }
  groups_.push_back(options);
  groups_snapshot_ = std::make_shared<const std::vector<ParamGroupOptions>>(groups_);
  return static_cast<int>(groups_.size()) - 1;
}

Status EngineImpl::SetGroupLr(int group, double lr) {
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return InvalidArgument("SetGroupLr: no parameter group " + std::to_string(group) + " (" +
                           std::to_string(groups_.size()) + " defined)");
  }
  if (!std::isfinite(lr))
    return InvalidArgument("SetGroupLr: the lr of group " + std::to_string(group) + " is not finite");
  if (groups_[group].lr == lr) return Status::Ok();
  groups_[group].lr = lr;
  // Updates already enqueued keep the snapshot they took.
  groups_snapshot_ = std::make_shared<const std::vector<ParamGroupOptions>>(groups_);
  return Status::Ok();
}

cpu::AdamOptions EngineImpl::GroupAdam(const cpu::AdamOptions& decided, const std::vector<ParamGroupOptions>& groups,
                                       int group) {
  cpu::AdamOptions a = decided;
  const ParamGroupOptions& g = groups[group];
  if (group != 0) a.weight_decay = g.weight_decay;
  if (g.lr >= 0) a.lr = g.lr;
  return a;
}

Result<int> EngineImpl::AddUnit(const std::string& name, const std::vector<ParamSpec>& params) {
  return AddUnit(name, params, UnitOptions{});
}

Result<int> EngineImpl::AddUnit(const std::string& name, const std::vector<ParamSpec>& params,
                                const UnitOptions& options) {
  if (finalized_) {
    return FailedPrecondition("unit '" + name +
                              "' registered after the first Fetch: register every unit before the first micro-step");
  }
  ZINF_ASSIGN_OR_RETURN(UnitLayout layout, table_.Layout(name, params, static_cast<int>(groups_.size())));
  layout.frozen = options.frozen;
  Unit u;
  static_cast<UnitLayout&>(u) = std::move(layout);
  const int64_t total = u.part.num_elems;
  // On any error below, what was allocated goes back.
  struct Cleanup {
    EngineImpl* e;
    Unit* u;
    ~Cleanup() {
      if (u) e->FreeUnit(*u);
    }
  } cleanup{this, &u};
  const uint64_t P = u.part.padded_elems;
  const std::string what = "unit '" + name + "'";
  const int64_t owned = owned_elems(u);
  if (host_home(u) && !u.shard_on_nvme) {
    ZINF_ASSIGN_OR_RETURN(u.h_shard, Pinned(u.part.shard_elems * DTypeSizeBytes(compute_dtype_),
                                            what + " parameter shard (offload_param)"));
  } else if (host_home(u)) {
    // Its home is the parameter store: AddShardToStore below.
  } else if (u.partitioned) {
    ZINF_ASSIGN_OR_RETURN(u.shard_params,
                          Alloc(u.part.shard_elems * DTypeSizeBytes(compute_dtype_), what + " parameter shard"));
  } else {
    ZINF_ASSIGN_OR_RETURN(u.params, Alloc(P * DTypeSizeBytes(compute_dtype_), what + " parameters"));
  }
  if (!u.partitioned && !u.frozen) {
    ZINF_ASSIGN_OR_RETURN(void* g, Alloc(P * 4, what + " gradients"));
    u.grads = static_cast<float*>(g);
  }
  if (u.frozen) {
    // A compute copy only: no accumulator, master or optimizer state.
  } else if (nvme_) {
    // The accumulator is allocated at Finalize, in host memory or the swap
    // store as the host budget allows.
  } else if (offload_) {
    ZINF_ASSIGN_OR_RETURN(u.h_master, Pinned(owned * 4, what + " fp32 master"));
    ZINF_ASSIGN_OR_RETURN(u.h_exp_avg, Pinned(owned * 4, what + " Adam m"));
    ZINF_ASSIGN_OR_RETURN(u.h_exp_avg_sq, Pinned(owned * 4, what + " Adam v"));
    if (!grad_in_place(u)) {
      ZINF_ASSIGN_OR_RETURN(u.h_accum, Pinned(owned * 4, what + " gradient accumulator"));
    }
  } else {
    ZINF_ASSIGN_OR_RETURN(void* a, Alloc((stage_ >= 2 ? u.part.shard_elems : P) * 4, what + " gradient accumulator"));
    u.accum = static_cast<float*>(a);
    ZINF_ASSIGN_OR_RETURN(void* m0, Alloc(owned * 4, what + " fp32 master"));
    ZINF_ASSIGN_OR_RETURN(void* m1, Alloc(owned * 4, what + " Adam m"));
    ZINF_ASSIGN_OR_RETURN(void* m2, Alloc(owned * 4, what + " Adam v"));
    u.master = static_cast<float*>(m0);
    u.exp_avg = static_cast<float*>(m1);
    u.exp_avg_sq = static_cast<float*>(m2);
  }
  for (auto* e : {&u.params_ready, &u.grads_free, &u.grads_ready, &u.released, &u.gathered_ready}) {
    ZINF_ASSIGN_OR_RETURN(*e, device_.CreateEvent());
  }
  const size_t esize = DTypeSizeBytes(compute_dtype_);
  for (int64_t off : u.tensor_offsets) {
    u.param_ptrs.push_back(static_cast<char*>(u.params) + off * esize);
    if (u.grads) u.grad_ptrs.push_back(u.grads + off);
  }

  // Initial values: fp32 master (widened exactly), compute copy rounded from it.
  std::vector<float> master(total, 0.0f);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].init) continue;
    const int64_t n = (i + 1 < params.size() ? u.tensor_offsets[i + 1] : total) - u.tensor_offsets[i];
    ZINF_RETURN_IF_ERROR(
        cpu::Cast(arena_, params[i].init, params[i].dtype, master.data() + u.tensor_offsets[i], DType::kFloat32, n));
  }
  ZINF_RETURN_IF_ERROR(WriteComputeCopy(u, master.data()));
  const int64_t begin = owned_begin(u), valid = owned_valid(u);
  if (u.frozen) {
  } else if (nvme_) {
    // Into the open sub-group below, once nothing else can fail.
  } else if (valid > 0 && offload_) {
    std::memcpy(u.h_master.data(), master.data() + begin, valid * 4);
  } else if (valid > 0) {
    ZINF_RETURN_IF_ERROR(device_.CopyToDevice(u.master, master.data() + begin, valid * 4, *stream_));
  }
  ZINF_RETURN_IF_ERROR(u.params_ready->Record(*stream_));
  ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
  ZINF_RETURN_IF_ERROR(stream_->Synchronize());  // the host vectors die here
  if (u.shard_on_nvme) ZINF_RETURN_IF_ERROR(AddShardToStore(u, master.data()));
  if (nvme_ && !u.frozen) {
    ZINF_RETURN_IF_ERROR(swapper_->AddUnit(u.name, owned_elems(u), master.data() + begin, std::max<int64_t>(valid, 0)));
    swap_unit_.push_back(num_units());
  }
  swap_index_.push_back(nvme_ && !u.frozen ? static_cast<int>(swap_unit_.size()) - 1 : -1);
  cleanup.u = nullptr;
  table_.Add(u);
  units_.push_back(std::move(u));
  return num_units() - 1;
}

Status EngineImpl::Finalize() {
  if (finalized_) return finalize_status_;
  if (units_.empty()) return FailedPrecondition("no units registered: AddUnit before the first Fetch");
  // Stage 3: a unit that cannot be gathered whole is a plan error now, not
  // an out-of-memory error mid-step.
  const uint64_t budget = device_.memory_stats().budget_bytes;
  for (const Unit& u : units_) {
    if (!u.partitioned) continue;
    const int64_t n = u.part.padded_elems;
    const uint64_t bytes = static_cast<uint64_t>(n) * DTypeSizeBytes(compute_dtype_);
    if (n > config_.zero.stage3_max_live_parameters) {
      return InvalidArgument("unit '" + u.name + "' gathers " + std::to_string(n) +
                             " elements (padded), more than zero_optimization.stage3_max_live_parameters = " +
                             std::to_string(config_.zero.stage3_max_live_parameters) + ": raise it to at least " +
                             std::to_string(n) + " or split the unit");
    }
    if (budget > 0 && bytes > budget) {
      return OutOfMemory("unit '" + u.name + "' gathers " + FormatBytes(bytes) + ", more than the device budget of " +
                         FormatBytes(budget) + ": split the unit or raise the device memory");
    }
  }
  finalized_ = true;
  finalize_status_ = BuildAfterRegistration();
  if (!finalize_status_.ok()) {
    finalize_status_ =
        finalize_status_.WithContext("engine set-up before the first micro-step (the engine is unusable)");
  }
  return finalize_status_;
}

Status EngineImpl::BuildAfterRegistration() {
  {
    std::vector<int64_t> gathered_elems;
    for (const Unit& u : units_) gathered_elems.push_back(u.part.padded_elems);
    fetch_trace_ = FetchTrace(std::move(gathered_elems));
  }
  int64_t offset = 0;
  for (const Unit& u : units_) {
    norm_layout_.unit_block_offset.push_back(offset);
    const int64_t blocks = u.frozen ? 0 : owned_elems(u) / kNormBlock;  // a frozen unit has no gradient
    norm_layout_.unit_blocks.push_back(blocks);
    offset += blocks;
  }
  norm_layout_.blocks_per_rank = offset;
  const int64_t regions = stage_ == 0 ? 1 : world_;
  norm_layout_.regions = static_cast<int>(regions);
  ZINF_ASSIGN_OR_RETURN(void* p, Alloc(norm_layout_.blocks_per_rank * regions * sizeof(double), "norm partials"));
  partials_ = static_cast<double*>(p);
  if (!host_memory_) {
    ZINF_ASSIGN_OR_RETURN(h_partials_,
                          Pinned(norm_layout_.blocks_per_rank * regions * sizeof(double), "norm partials read-back"));
  }
  if (offload_) {
    int64_t max_owned = 0;
    for (const Unit& u : units_) {
      if (!u.frozen) max_owned = std::max(max_owned, owned_elems(u));
    }
    // With zero copy, neither the gradients nor the new compute copies
    // pass through staging (swapped gradients still do).
    if (!zero_copy() || nvme_) {
      ZINF_ASSIGN_OR_RETURN(h_grad_stage_, Pinned(max_owned * 4, "gradient staging"));
    }
    const int64_t slots = zero_copy() ? 0 : std::clamp<int64_t>(config_.zero.offload_optimizer.buffer_count, 2, 64);
    for (int64_t i = 0; i < slots; ++i) {
      ZINF_ASSIGN_OR_RETURN(cpu::PinnedBuffer b,
                            Pinned(max_owned * DTypeSizeBytes(compute_dtype_), "parameter staging"));
      h_param_slots_.push_back(std::move(b));
      ZINF_ASSIGN_OR_RETURN(auto filled, device_.CreateEvent());
      ZINF_ASSIGN_OR_RETURN(auto free_event, device_.CreateEvent());
      slot_filled_.push_back(std::move(filled));
      slot_free_.push_back(std::move(free_event));
    }
  }
  if (param_offload_ && !offload_) {
    // The optimizer runs where the master is (the device) and the new shard
    // goes home to the host through one scratch buffer, unit by unit.
    int64_t max_shard = 0;
    for (const Unit& u : units_) {
      if (host_home(u) && !u.frozen) max_shard = std::max(max_shard, u.part.shard_elems);
    }
    if (max_shard > 0) {
      ZINF_ASSIGN_OR_RETURN(param_scratch_, Alloc(max_shard * DTypeSizeBytes(compute_dtype_),
                                                  "parameter update scratch (offload_param)"));
    }
  }
  // The optimizer's swap last: what host memory is left decides where the
  // gradients accumulate.
  if (param_nvme_) ZINF_RETURN_IF_ERROR(SetUpParamSwap());
  if (nvme_) ZINF_RETURN_IF_ERROR(SetUpSwap());
  {  // the initial state written above is not a step's I/O
    MutexLock lock(mu_);
    io_base_ = IoTotals();
  }
  // Released starts out complete: the first boundary waits on nothing.
  for (Unit& u : units_) ZINF_RETURN_IF_ERROR(u.released->Record(*stream_));
  ZINF_RETURN_IF_ERROR(SetTimelineOrigin());
  const uint64_t params = std::accumulate(units_.begin(), units_.end(), uint64_t{0},
                                          [](uint64_t s, const Unit& u) { return s + u.part.num_elems; });
  std::string scaler, schedule;
  {
    MutexLock lock(mu_);
    scaler = decider_.scaler().Describe();
    schedule = decider_.schedule().Describe();
  }
  ZINF_LOG_INFO("engine: rank {}/{}, ZeRO stage {}, {} units, {} parameters, {} compute, accumulation {}, {}, {}",
                rank_, world_, stage_, units_.size(), FormatCount(static_cast<double>(params)),
                DTypeName(compute_dtype_), accumulation_, scaler, schedule);
  return Status::Ok();
}

Result<cpu::PinnedBuffer> EngineImpl::Pinned(uint64_t bytes, const std::string& what) {
  auto b = pool_->Acquire(std::max<uint64_t>(bytes, 1));
  if (!b.ok()) return b.status().WithContext(what);
  std::memset(b->data(), 0, bytes);
  return std::move(*b);
}

std::string EngineImpl::ResumeHint() const {
  return "resume from the last complete checkpoint" + (last_checkpoint_.empty()
                                                           ? std::string(" (this engine has saved or loaded none)")
                                                           : " (" + last_checkpoint_ + ")");
}

Status EngineImpl::ReportLoss(double loss) {
  MutexLock lock(mu_);
  if (!broken_.ok()) return broken_;
  if (std::isfinite(loss) || !config_.zinf.stop_on_nonfinite_loss) return Status::Ok();
  char text[32];
  std::snprintf(text, sizeof text, "%g", loss);
  broken_ =
      FailedPrecondition("the loss is " + std::string(text) + " in micro-step " + std::to_string(micro_in_window_ + 1) +
                         " of optimizer step " + std::to_string(boundaries_ + 1) +
                         " (zinf.stop_on_nonfinite_loss): no further steps; " + ResumeHint());
  return broken_;
}

Result<bool> EngineImpl::Step() {
  ZINF_RETURN_IF_ERROR(Finalize());
  ResolveSpans();  // what has been timed so far; logs the steps closed before the last boundary
  {
    MutexLock lock(mu_);
    if (!broken_.ok()) return broken_;
  }
  for (const Unit& u : units_) {
    if (u.fetched_this_micro && !u.grads_ready_this_micro && !u.frozen) {
      return FailedPrecondition("Step() before GradsReady(unit '" + u.name +
                                "'): every unit fetched in a micro-step must have its gradients ready before the "
                                "micro-step ends (a unit not fetched has none)");
    }
  }
  buckets_.CloseOpen();  // some units were not fetched: the last bucket closes here
  ZINF_RETURN_IF_ERROR(FlushPendingBuckets());
  for (Unit& u : units_) {
    u.grads_ready_this_micro = u.fetched_this_micro = u.released_after_grads = false;
    // The client may destroy its streams between micro-steps: a GradBuffers
    // before the unit's next Fetch allocates on the engine stream.
    u.fetch_stream = nullptr;
  }
  // Stage 3: what was gathered ahead and not used goes (an update may
  // follow); this micro-step's order becomes the trace when it differs.
  ZINF_RETURN_IF_ERROR(DropEngineHeld());
  fetch_trace_.EndMicroStep();
  if (++micro_in_window_ < accumulation_) return false;
  micro_in_window_ = 0;
  ZINF_RETURN_IF_ERROR(EnqueueBoundary());
  return true;
}

Result<float> EngineImpl::loss_scale() {
  bool pending;
  {
    MutexLock lock(mu_);
    pending = decision_pending_ && decider_.scaler().dynamic();
  }
  if (pending) {
    ZINF_RETURN_IF_ERROR(decided_->Synchronize());
    MutexLock lock(mu_);
    decision_pending_ = false;
  }
  MutexLock lock(mu_);
  return static_cast<float>(decider_.scaler().scale());
}

}  // namespace zinf::sched

namespace zinf {

Result<std::unique_ptr<Engine>> Engine::Create(const Config& config, Device& device, Communicator* comm) {
  const ZeroConfig& z = config.zero;
  if (z.stage < 0 || z.stage > 3) {
    return InvalidArgument("zero_optimization.stage = " + std::to_string(z.stage) + ": expected 0, 1, 2 or 3");
  }
  if (z.offload_optimizer.device == OffloadDevice::kNvme && z.offload_optimizer.nvme_path.empty()) {
    return InvalidArgument(
        "zero_optimization.offload_optimizer.device = \"nvme\" needs offload_optimizer.nvme_path: one or more "
        "directories on NVMe");
  }
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
    return InvalidArgument("zero_optimization.offload_param needs stage 3 (stage is " + std::to_string(z.stage) +
                           "): set \"stage\": 3 or remove offload_param");
  }
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.nvme_path.empty()) {
    return InvalidArgument(
        "zero_optimization.offload_param.device = \"nvme\" needs offload_param.nvme_path: one or more directories "
        "on NVMe");
  }
  if (device.kind() == DeviceKind::kHost && sched::CommunicatesDeviceMemory(comm)) {
    return InvalidArgument("device " + device.name() +
                           ": an NCCL communicator needs the engine on a CUDA device (\"zinf\": {\"device\": "
                           "\"cuda\"}); on the cpu device use the MPI communicator, or none for one rank");
  }
  if (device.kind() != DeviceKind::kHost && comm && comm->size() > 1 && !sched::CommunicatesDeviceMemory(comm)) {
    return InvalidArgument("device " + device.name() + " with " + std::to_string(comm->size()) +
                           " ranks: the communicator's collectives work on host memory; on a CUDA device use the "
                           "NCCL communicator (gpu/nccl_comm.h)");
  }
  if (z.stage >= 2 && z.reduce_bucket_size < sched::kNormBlock) {
    return InvalidArgument("zero_optimization.reduce_bucket_size = " + std::to_string(z.reduce_bucket_size) +
                           " elements is smaller than one norm block (65536 elements): raise it to at least 65536");
  }
  if (config.fp16.enabled && config.bf16.enabled) {
    return InvalidArgument("fp16.enabled and bf16.enabled are both true: enable at most one");
  }
  if (!(config.gradient_clipping >= 0) || !std::isfinite(config.gradient_clipping)) {
    return InvalidArgument("gradient_clipping must be a finite number >= 0 (0 = off)");
  }
  const int world = comm ? comm->size() : 1;
  if (config.zinf.active_offload) {
    auto refuse = [](const std::string& why) {
      return InvalidArgument("zinf.active_offload needs " + why + ": set it false, or change the config");
    };
    if (z.offload_optimizer.device != OffloadDevice::kCpu) {
      return refuse("zero_optimization.offload_optimizer.device = \"cpu\" (the optimizer in host memory)");
    }
    if (config.gradient_clipping > 0) return refuse("gradient_clipping = 0 (clipping needs the global norm first)");
    if (config.fp16.enabled) return refuse("no fp16 (the loss scale's overflow check needs every gradient first)");
  }
  ZINF_ASSIGN_OR_RETURN(BatchSizes batch, ResolveBatchSizes(config, world));
  const OptimizerConfig& oc = config.optimizer;
  cpu::AdamOptions adam;
  adam.lr = oc.lr;
  adam.beta1 = oc.beta1;
  adam.beta2 = oc.beta2;
  adam.eps = oc.eps;
  adam.weight_decay = oc.weight_decay;
  adam.bias_correction = oc.bias_correction;
  adam.mode = oc.decoupled_weight_decay() ? cpu::AdamMode::kAdamW : cpu::AdamMode::kAdam;
  if (auto c = cpu::MakeAdamStepConstants(adam, 1, 1.0); !c.ok()) return c.status().WithContext("optimizer.params");
  ZINF_ASSIGN_OR_RETURN(sched::LrSchedule schedule, sched::LrSchedule::Create(config.scheduler, oc.lr));
  ZINF_ASSIGN_OR_RETURN(sched::LossScaler scaler, sched::LossScaler::Create(config.fp16));
  const DType compute = config.bf16.enabled   ? DType::kBFloat16
                        : config.fp16.enabled ? DType::kFloat16
                                              : DType::kFloat32;
  int threads = static_cast<int>(config.zinf.optimizer_threads);
  if (threads <= 0) {
    // The machine's threads shared among the ranks on it: N ranks with an
    // arena of every thread each would oversubscribe the cores N times.
    const int local = comm ? comm->local_size() : 1;
    threads = std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / std::max(1, local));
  }
  auto engine = std::make_unique<sched::EngineImpl>(config, device, comm, batch.gradient_accumulation_steps,
                                                    std::move(schedule), std::move(scaler), adam, compute, threads);
  ZINF_RETURN_IF_ERROR(engine->Init());
  if (comm && comm->size() > 1) return sched::StopRanksTogether(std::move(engine), *comm);
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace zinf
