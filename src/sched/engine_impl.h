// EngineImpl: the engine's state and the declarations its files share.
// Internal to src/sched (engine*.cc); clients use zinf/engine.h.
//
// The engine's work is split by responsibility, one file each:
//   engine.cc             the facade: registration and placement (AddUnit,
//                         Finalize), the micro-step's end (Step), Create
//   engine_params.cc      the stage-3 parameter coordinator: fetch, gather,
//                         trace, prefetch, reuse and release; gradient
//                         buffers of partitioned units
//   engine_grads.cc       gradient accumulation and reduction: GradsReady,
//                         reduce buckets in a deterministic order, the
//                         accumulators, the norm partials
//   engine_swap.cc        the optimizer state's NVMe home wired to the
//                         engine stream (OptimizerSwapper), the swapped
//                         gradients' staging, the parameter store
//   engine_update.cc      the boundary: the step decision (step_decision.h)
//                         and the update pipeline over every tier
//   engine_checkpoint.cc  engine checkpoints (Save, Load) and ReadState
//   engine_metrics.cc     timed stream tasks, collectives and StepStats
//
// Components with state of their own and unit tests of their own:
//   unit_table.h      the units' layouts: tensor spans, partitions, where
//                     their parameters live (UnitTable)
//   step_decision.h   norm, clip, skip, loss scale, lr (StepDecision)
//   fetch_trace.h     the stage-3 Fetch trace: prefetch and reuse (FetchTrace)
//   reduce_buckets.h  which gradients are reduced together, and when
//   swap_schedule.h   the order of the NVMe swapper's reads and writes
//   optimizer_swapper.h  the optimizer state's NVMe home: sub-groups, swap
//                     buffers, the pipelined reads and writes, swapped gradients
//
// Thread-safety: one client thread drives the engine (zinf/engine.h); its
// stream tasks run on the streams' threads. EngineImpl's members come in
// three groups: constant after construction; the client thread's, which the
// stream tasks read in the order enqueues and events set; and those guarded
// by mu_ (GUARDED_BY, and REQUIRES on the helpers that need it held), which
// clang checks (-Wthread-safety: cmake -DZINF_THREAD_SAFETY_ANALYSIS=ON).
#pragma once

#include "zinf/engine.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include <fcntl.h>

#include "common/communicator.h"
#include "common/logging.h"
#include "common/thread_annotations.h"
#include "common/units.h"
#include "cpu/adam.h"
#include "cpu/cast.h"
#include "cpu/kernels.h"
#include "cpu/norm.h"
#include "cpu/pinned_pool.h"
#include "nvme/engine_registrar.h"
#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "sched/checkpoint_io.h"
#include "sched/device_kernels.h"
#include "sched/fetch_trace.h"
#include "sched/gradient_placement.h"
#include "sched/loss_scaler.h"
#include "sched/lr_schedule.h"
#include "sched/optimizer_swapper.h"
#include "sched/partition.h"
#include "sched/plan.h"
#include "sched/reduce_buckets.h"
#include "sched/step_decision.h"
#include "sched/swap_schedule.h"
#include "sched/unit_table.h"

namespace zinf::sched {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A registered unit: its layout (unit_table.h, fixed at registration) and
// the engine's state of it.
struct Unit : UnitLayout {
  // Device buffers.
  void* params = nullptr;        // the whole compute copy (stages 0-2, stage-3 persistent units)
  void* shard_params = nullptr;  // stage 3: the shard (shard_elems), on the device
  cpu::PinnedBuffer h_shard;     // stage 3 with offload_param: the shard's home in pinned host memory instead
  void* gathered = nullptr;      // stage 3: the gathered unit between Fetch and Release
  std::unique_ptr<Event> gathered_ready;
  // Stage 3: the tensor pointers of each address a gathered copy has had, so
  // the span a Fetch returned stays valid (tasks may read it later).
  std::map<void*, std::vector<void*>> gathered_ptrs;
  // Stage 3 (partitioned): allocated on the client's stream at GradBuffers
  // (or GradsReady) and freed once the reduction has consumed it, so only
  // the gradients between backward and their reduce bucket take device
  // memory; grad_ptrs_at keeps the tensor pointers of each address, so a
  // span GradBuffers returned stays valid.
  float* grads = nullptr;
  Stream* fetch_stream = nullptr;  // stage 3: the stream of the client's Fetch this micro-step (null before it)
  std::map<void*, std::vector<void*>> grad_ptrs_at;
  float* accum = nullptr;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // offload_optimizer cpu: the owned range's fp32 state in pinned host memory.
  cpu::PinnedBuffer h_master, h_exp_avg, h_exp_avg_sq, h_accum;
  std::vector<void*> param_ptrs, grad_ptrs;
  std::unique_ptr<Event> params_ready;  // engine stream: the unit's last update is done
  std::unique_ptr<Event> grads_free;    // engine stream: its gradients have been consumed
  std::unique_ptr<Event> grads_ready;   // client stream: backward wrote the gradients
  std::unique_ptr<Event> released;      // client stream: done with the parameters
  bool grads_ready_this_micro = false;
  bool fetched_this_micro = false;
  bool client_holds = false;  // stage 3: between the client's Fetch and Release
  bool prefetched = false;    // stage 3: gathered ahead of its Fetch (or kept for reuse), not yet fetched
  // This window: whether any micro-step's gradients were accumulated (a
  // unit with none is not updated: its master, m and v stay as they are) and
  // whether its norm partials were taken.
  bool accumulated = false;
  bool partials_taken = false;
  // zinf.active_offload: released after its GradsReady this micro-step, and
  // updated during this window's backward (the boundary passes it by).
  bool released_after_grads = false;
  bool active_updated = false;
  int64_t steps = 0;  // updates applied to this unit (its Adam bias-correction step)
};

// Host-device work on at most this many fp32 elements (64 KiB) is a short
// task (Stream::EnqueueShort): an idle stream runs it on the enqueuing
// thread, which costs less than waking the stream's own thread for it.
inline constexpr int64_t kShortTaskElems = int64_t{1} << 14;

struct Window {  // metrics accumulated since the last boundary
  double optimizer = 0, comm = 0, copy = 0, io = 0, stall = 0, longest_stall = 0;
  uint64_t copy_bytes = 0;
  std::string longest_stall_what;
  std::map<std::pair<std::string, std::string>, StepStats::Stall> stalls;  // by (unit, cause)
  std::map<std::string, StepStats::Collective> collectives;
  std::vector<TimelineSpan> timeline;
  int64_t timeline_dropped = 0;
  static constexpr size_t kMaxTimeline = 16384;
  void AddSpan(std::string lane, std::string what, double start, double end) {
    if (timeline.size() >= kMaxTimeline) {
      ++timeline_dropped;
      return;
    }
    timeline.push_back(TimelineSpan{std::move(lane), std::move(what), start, end});
  }
};

// What engine-stream tasks count between two boundaries: handed from the
// boundary's last engine-stream task to its window's close (which, with
// offload, runs later on the copy stream, after the next step's first
// engine-stream tasks may have run).
struct StreamCounts {
  int64_t fetches = 0, prefetch_hits = 0;
  uint64_t nvme_read = 0, nvme_written = 0;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const Config& config, Device& device, Communicator* comm, int64_t accumulation, LrSchedule schedule,
             LossScaler scaler, cpu::AdamOptions adam, DType compute_dtype, int threads)
      : config_(config),
        device_(device),
        comm_(comm),
        rank_(comm ? comm->rank() : 0),
        world_(comm ? comm->size() : 1),
        stage_(config.zero.stage),
        accumulation_(accumulation),
        compute_dtype_(compute_dtype),
        arena_(threads),
        offload_(config.zero.offload_optimizer.device != OffloadDevice::kNone),
        nvme_(config.zero.offload_optimizer.device == OffloadDevice::kNvme),
        param_offload_(config.zero.stage == 3 && config.zero.offload_param.device != OffloadDevice::kNone),
        param_nvme_(config.zero.stage == 3 && config.zero.offload_param.device == OffloadDevice::kNvme),
        host_memory_(device.kind() == DeviceKind::kHost),
        kernels_(KernelsFor(device.kind())),
        active_offload_(config.zinf.active_offload),
        table_(UnitTableOptions{.world = world_,
                                .stage = stage_,
                                .param_persistence_threshold = config.zero.stage3_param_persistence_threshold,
                                .model_persistence_threshold = config.zero.stage3_model_persistence_threshold,
                                .param_offload = param_offload_,
                                .param_nvme = param_nvme_,
                                .max_in_cpu = config.zero.offload_param.max_in_cpu}),
        buckets_(config.zero.reduce_bucket_size, config.zero.overlap_comm),
        groups_{ParamGroupOptions{.weight_decay = adam.weight_decay, .lr = -1}},
        groups_snapshot_(std::make_shared<const std::vector<ParamGroupOptions>>(groups_)),
        decider_(std::move(schedule), std::move(scaler), adam, config.gradient_clipping, world_,
                 config.zinf.accumulation_mean ? accumulation : 1) {}

  ~EngineImpl() override {
    if (stream_) {
      (void)stream_->Synchronize();
      (void)copy_stream_->Synchronize();
      (void)gather_stream_->Synchronize();
      // Nothing in flight into or out of buffers about to go back.
      if (swapper_) swapper_->WaitAll();
      for (const nvme::IoRequest& w : grad_stage_write_) {
        if (w.valid()) (void)w.Wait();
      }
      for (Unit& u : units_) FreeUnit(u);
      if (partials_) (void)device_.Free(partials_, *stream_);
      if (bucket_) (void)device_.Free(bucket_, *stream_);
      if (param_scratch_) (void)device_.Free(param_scratch_, *stream_);
      (void)stream_->Synchronize();
    }
  }

  void FreeUnit(Unit& u) {
    for (void* p : {u.params, u.shard_params, u.gathered, static_cast<void*>(u.grads), static_cast<void*>(u.accum),
                    static_cast<void*>(u.master), static_cast<void*>(u.exp_avg), static_cast<void*>(u.exp_avg_sq)}) {
      if (p) (void)device_.Free(p, *stream_);
    }
    u.params = u.shard_params = u.gathered = nullptr;
    u.grads = u.accum = u.master = u.exp_avg = u.exp_avg_sq = nullptr;
    for (cpu::PinnedBuffer* b : {&u.h_master, &u.h_exp_avg, &u.h_exp_avg_sq, &u.h_accum, &u.h_shard}) b->Release();
  }

  Status Init() {
    // Reductions that stage on the device (NCCL) take it from the budget.
    if (comm_) comm_->SetStagingDevice(&device_);
    ZINF_ASSIGN_OR_RETURN(stream_, device_.CreateStream());
    ZINF_ASSIGN_OR_RETURN(copy_stream_, device_.CreateStream());
    ZINF_ASSIGN_OR_RETURN(gather_stream_, device_.CreateStream());
    ZINF_ASSIGN_OR_RETURN(gathers_done_, device_.CreateEvent());
    ZINF_ASSIGN_OR_RETURN(decided_, device_.CreateEvent());
    ZINF_ASSIGN_OR_RETURN(updates_done_, device_.CreateEvent());
    for (auto& e : closed_events_) {
      ZINF_ASSIGN_OR_RETURN(e, device_.CreateEvent());
    }
    if (offload_ || param_offload_ || !host_memory_) {
      cpu::PinnedPoolOptions o;
      o.budget_bytes = PinnedBudgetBytes(config_);  // no limit beyond the machine's memory unless set
      // DeepSpeed's switches for page-locking.
      o.lock = (offload_ && config_.zero.offload_optimizer.pin_memory) || nvme_ || param_nvme_ ||
               (param_offload_ && config_.zero.offload_param.pin_memory);
      if (nvme_) {
        ZINF_ASSIGN_OR_RETURN(io_, nvme::IoEngine::Create(nvme::IoEngineOptionsFromConfig(config_)));
        registrar_ = std::make_unique<nvme::EngineRegistrar>(*io_);
        o.registrars.push_back(registrar_.get());
      }
      if (param_nvme_) {
        // Its own rings: a gather's shard read does not queue behind the
        // optimizer state's bulk reads and writes.
        ZINF_ASSIGN_OR_RETURN(param_io_, nvme::IoEngine::Create(nvme::IoEngineOptionsFromConfig(config_)));
        param_registrar_ = std::make_unique<nvme::EngineRegistrar>(*param_io_);
        o.registrars.push_back(param_registrar_.get());
      }
      if (!host_memory_) {  // copies to and from the device stay asynchronous and in stream order
        ZINF_ASSIGN_OR_RETURN(device_registrar_, kernels_.create_host_registrar(device_));
        o.registrars.push_back(device_registrar_.get());
        // Pinned memory on the NUMA node next to the GPU, where hwloc knows it.
        ZINF_ASSIGN_OR_RETURN(o.gpu_pci_bus_id, kernels_.pci_bus_id(device_));
      }
      ZINF_ASSIGN_OR_RETURN(pool_, cpu::PinnedPool::Create(std::move(o)));
      Log().log(host_memory_ ? spdlog::level::debug : spdlog::level::info,
                "engine: pinned host memory on NUMA node {} ({})", pool_->numa_node(), pool_->numa_reason());
    }
    if (nvme_) swapper_ = std::make_unique<OptimizerSwapper>(*io_, SwapperOptions());
    return Status::Ok();
  }
  OptimizerSwapper::Options SwapperOptions();

  int num_units() const override { return static_cast<int>(units_.size()); }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int zero_stage() const override { return stage_; }
  DType compute_dtype() const override { return compute_dtype_; }
  int64_t gradient_accumulation_steps() const override { return accumulation_; }
  int optimizer_threads() const override { return arena_.max_concurrency(); }
  Result<int64_t> unit_elems(int unit) const override {
    ZINF_RETURN_IF_ERROR(CheckUnit(unit, "unit_elems"));
    return units_[unit].part.num_elems;
  }

  Result<int> AddUnit(const std::string& name, const std::vector<ParamSpec>& params) override;
  Result<int> AddUnit(const std::string& name, const std::vector<ParamSpec>& params,
                      const UnitOptions& options) override;
  Result<int> AddParamGroup(const ParamGroupOptions& options) override;
  Status SetGroupLr(int group, double lr) override;
  Result<UnitPointers> Fetch(int unit, Stream& stream) override;
  Result<UnitPointers> GradBuffers(int unit) override;
  Status GradsReady(int unit, Stream& stream) override;
  Status Release(int unit, Stream& stream) override;
  Result<bool> Step() override EXCLUDES(mu_);
  Status Trace(Stream& stream, const std::string& lane, const std::string& what,
               const std::function<Status()>& enqueue) override;
  Result<int64_t> TraceBegin(Stream& stream) override EXCLUDES(mu_);
  Status TraceEnd(int64_t token, Stream& stream, const std::string& lane, const std::string& what) override
      EXCLUDES(mu_);
  Status ReportLoss(double loss) override EXCLUDES(mu_);
  Result<float> loss_scale() override EXCLUDES(mu_);
  Status Synchronize() override EXCLUDES(mu_) {
    Status a = stream_->Synchronize();
    Status b = copy_stream_->Synchronize();
    Status c = gather_stream_->Synchronize();
    ResolveSpans();
    return !a.ok() ? a : !b.ok() ? b : c;
  }
  Result<StepStats> Stats() override EXCLUDES(mu_);
  Result<StepStats> Stats(int64_t boundary) override EXCLUDES(mu_);
  Result<std::string> Save(const std::string& dir, const std::string& client_state) override EXCLUDES(mu_);
  Result<std::string> Load(const std::string& path) override EXCLUDES(mu_);
  Status ReadState(int unit, StateKind kind, float* host_dst) override;
  Status WriteState(int unit, StateKind kind, const float* host_src) override EXCLUDES(mu_);
  Status Broadcast(void* host, size_t bytes, int root) override EXCLUDES(mu_);

 private:
  bool sharded() const { return stage_ >= 1 && world_ > 1; }
  bool distributed() const { return world_ > 1; }
  // The owned range of the optimizer state: the whole unit in stage 0.
  int64_t owned_begin(const Unit& u) const { return stage_ == 0 ? 0 : u.part.shard_begin(rank_); }
  int64_t owned_elems(const Unit& u) const { return stage_ == 0 ? u.part.padded_elems : u.part.shard_elems; }
  int64_t owned_valid(const Unit& u) const { return stage_ == 0 ? u.part.num_elems : u.part.valid_in_shard(rank_); }
  // The accumulated gradient of the owned range.
  float* owned_accum(const Unit& u) const { return stage_ >= 2 ? u.accum : u.accum + owned_begin(u); }
  // Where the owned range of the compute copy lives on the device.
  // Stage 3 with offload_param: a partitioned unit's shard lives in pinned
  // host memory (cpu; nvme within max_in_cpu elements) or in the parameter
  // store (nvme), and reaches the device only to be gathered.
  bool host_home(const Unit& u) const { return u.partitioned && param_offload_; }
  char* param_home(const Unit& u) const {
    return u.partitioned ? static_cast<char*>(u.shard_params)
                         : static_cast<char*>(u.params) + owned_begin(u) * DTypeSizeBytes(compute_dtype_);
  }

  Status CheckUnit(int unit, const char* what) const {
    if (unit < 0 || unit >= num_units()) {
      return InvalidArgument(std::string(what) + ": no unit " + std::to_string(unit) + " (" +
                             std::to_string(num_units()) + " registered)");
    }
    return Status::Ok();
  }
  // The optimizer options of parameter group `group`: the boundary's
  // decided ones (the schedule's lr, the config's weight decay) with the
  // group's weight decay and its own lr when it has one.
  static cpu::AdamOptions GroupAdam(const cpu::AdamOptions& decided, const std::vector<ParamGroupOptions>& groups,
                                    int group);
  // A frozen unit's compute copy of this rank's checkpoint slice
  // ([shard_begin, + valid_in_shard)), widened to fp32.
  Status ReadFrozenSlice(Unit& u, std::vector<float>* out);
  Status ReadFrozenUnit(ckpt::CheckpointReader& reader, Unit& u);
  // Builds what the first micro-step needs (norm layout, staging, the swap
  // set-up). Idempotent; once past the checks that leave nothing built, a
  // failure is sticky: every later call returns it, because the engine is
  // half built.
  Status Finalize();
  Status BuildAfterRegistration();
  struct ExcludeIo;
  Result<void*> Alloc(uint64_t bytes, const std::string& what);
  Status AllocateGrads(Unit& u, Stream& stream, bool zero);
  Status FreeGradsIfTransient(Unit& u);

  // Engine-stream helpers.
  Status Collective(const char* kind, uint64_t bytes, const std::function<Status()>& enqueue) {
    return Collective(*stream_, kind, bytes, enqueue);
  }
  Status Collective(Stream& stream, const char* kind, uint64_t bytes, const std::function<Status()>& enqueue);
  // Device copies bracketed by timestamps, counted as copy time.
  Status TimedCopies(Stream& stream, uint64_t bytes, const std::function<Status()>& enqueue);
  // Adds the reduced owned range (device, owned_elems) into the host accumulator.
  Status HostAccumulate(Unit& u, const float* reduced, bool first);
  Status EnqueueHostAdd(float* accum, bool accum_device, const float* reduced, bool reduced_device, int64_t elems);
  Result<cpu::PinnedBuffer> Pinned(uint64_t bytes, const std::string& what);
  // offload_optimizer nvme, at Finalize: the swapper's set-up (the last
  // sub-group written, gradients placed, buffers) and the accumulators of
  // the gradients kept in host memory.
  Status SetUpSwap();
  // zinf.offload_zero_copy, where the host addresses the device's memory:
  // the host's Adam reads and writes the unit's own buffers, with no
  // copies through pinned staging.
  bool zero_copy() const { return offload_ && host_memory_ && config_.zinf.offload_zero_copy; }
  // With zero copy, the optimizer state in host memory and one micro-step
  // per step, unit u's reduced gradient stays where the reduction left it
  // (the owned range of u.grads) until its update has read it, and
  // grads_free is recorded after the update; not where a packed bucket or
  // a stage-3 gradient buffer freed once reduced holds it. (With the state
  // on NVMe the gradients keep their placement: gradient_placement.h.)
  bool grad_in_place(const Unit& u) const {
    return zero_copy() && !nvme_ && accumulation_ == 1 && !u.frozen && !u.partitioned &&
           !(stage_ >= 2 && distributed() && config_.zero.contiguous_gradients);
  }
  bool grad_on_nvme(size_t i) const { return swapper_ && !units_[i].frozen && swapper_->grad_on_nvme(swap_id(i)); }
  // Unit i's index in the optimizer swapper (frozen units have none: -1),
  // and back.
  int swap_id(size_t i) const { return swap_index_[i]; }
  std::vector<int> swap_index_;  // by unit
  std::vector<int> swap_unit_;   // by swapper index
  // offload_param nvme, at registration: the store grown for the unit's
  // shard, which is written there.
  Status AddShardToStore(const Unit& u, const float* master);
  // Sets this rank's owned range of a unit's master, m and v from whole-unit
  // host arrays, and rebuilds the compute copy (the master's rounding).
  Status WriteComputeCopy(Unit& u, const float* master, int64_t first = 0);
  // Checkpoints: this rank's slices of every unit's master, m, v into one
  // file, streamed from where they live; and back, from the slices of any
  // world size that overlap what this rank keeps.
  Status WriteShards(const std::string& path, nlohmann::json* table);
  Status ReadShards(ckpt::CheckpointReader& reader);
  Result<nvme::IoEngine*> CheckpointIo();
  // Whether every rank's `mine` is OK (collective): the first failure here,
  // or kAborted-like kUnavailable naming a failed rank. A rank that cannot
  // take part (no memory for the flag) aborts the communicator.
  // reached (optional): set when every rank took part, so that every rank
  // is past the work the agreement is about.
  Status AgreeOk(const Status& mine, bool* reached = nullptr);
  // Unit i's norm partials: at its last micro-step of the window (or `now`;
  // zeros when it has no gradient this window).
  Status EnqueuePartials(size_t i, bool now = false);
  Status DevicePartials(size_t i, int region, bool zero, const void* host_accum);
  // Unit u's update by the device's kernels (optimizer state in device
  // memory, not host-addressable), with the boundary's decision made.
  Status EnqueueDeviceUpdate(Unit& u, bool home, bool has_grad) EXCLUDES(mu_);
  // An I/O failure of a step's swap transfers: the state on disk is mixed
  // (or the window's gradients lost), the engine refuses further steps
  // (broken_).
  enum class SwapKind { kState, kParams, kGradients };
  Status SwapFailure(Status s, SwapKind kind = SwapKind::kState) EXCLUDES(mu_);
  // "resume from the last complete checkpoint (<path>)" for the messages of
  // broken_.
  std::string ResumeHint() const REQUIRES(mu_);
  // A swapped gradient's accumulation: into a staging buffer (after the
  // stored one is read back, unless `first`), then written to the store.
  Status SwapAccumulate(size_t i, const float* reduced, bool first);
  // Enqueue order: the next staging buffer for unit i, free once its last
  // write finished; and unit i's stored gradient read into it.
  Result<int> AcquireGradStage(size_t i);
  Status ReadSwappedGrads(size_t i, int stage);
  Status WaitGradWrites();
  Status SetUpParamSwap();
  // A task on `stream` (default: the engine stream) whose time adds to
  // `field`, and to the timeline as `what` (in the field's lane).
  Status Timed(double Window::*field, std::string what, StreamTask task, Stream* stream = nullptr);
  Status EnqueueAccumulate(float* accum, const float* reduced, int64_t elems, bool first);
  Status FlushBucket(const std::vector<int>& bucket);
  Status FlushPendingBuckets();
  Status EnqueueBoundary();
  // Where a unit's host update at the boundary reads and writes.
  struct UpdateTarget {
    void* staging = nullptr;     // the new compute copy's staging (a slot, or the shard's pinned home), or null
    float* swap = nullptr;       // NVMe: the unit's [master | m | v] in its sub-group's buffer
    const void* grad = nullptr;  // offload: the accumulated gradient (a device pointer when grad_in_place)
    bool grad_in_place = false;  // grad is the reduced gradient in device memory the host addresses
    bool home = false;           // the shard's home is on the host (offload_param)
    bool use_slot = false;       // the new compute copy goes up through a staging slot
    bool to_store = false;       // the new shard goes to the parameter store
  };
  // `active`: an update started during backward (zinf.active_offload),
  // whose constants come from StepDecision::Predecide when it runs.
  StreamTask HostUpdateTask(Unit& u, const UpdateTarget& t, bool has_grad, int64_t boundary, bool active);
  // Unit i's update on its tier and its way back to the device (the
  // boundary's, or an active one), ending in its params_ready.
  Status EnqueueUnitUpdate(size_t i, bool has_grad, int64_t boundary, bool active,
                           const std::shared_ptr<const std::vector<char>>& has_grad_shared);
  // zinf.active_offload: starts unit i's update once, in the window's last
  // micro-step, when its gradient is accumulated and it is released.
  Status MaybeActiveUpdate(size_t i);
  Status EnqueueSwapDrain();
  Status EnqueueWindowClose(int64_t boundary);
  Status WaitTimed(Stream& stream, Event& event, const Unit& u, const char* cause, const std::string& what);
  // Device work timed without host code on its stream: a timing event
  // recorded before `enqueue`'s work and one after; once both have
  // completed, ResolveSpans passes the seconds between them to `account`,
  // with the window the work was enqueued in.
  // A timing event (a spare one, or new) recorded on `stream`.
  Result<std::unique_ptr<Event>> RecordTimingEvent(Stream& stream) EXCLUDES(mu_);
  // TimeSpan's second half: the end event, and the span kept for ResolveSpans.
  Status EndSpan(std::unique_ptr<Event> start, Stream& stream, std::string lane, std::string what,
                 std::function<void(Window&, double)> account) EXCLUDES(mu_);
  // The span also goes on the window's timeline, in `lane` as `what`.
  Status TimeSpan(Stream& stream, const char* lane, std::string what, const std::function<Status()>& enqueue,
                  std::function<void(Window&, double)> account);
  // The timeline's origin: a timing event on the engine stream and the host
  // time it completed at (set once, at the end of the set-up).
  Status SetTimelineOrigin() EXCLUDES(mu_);
  // Seconds since the origin of a host time.
  double TimelineSeconds(Clock::time_point t) const REQUIRES(mu_) { return Seconds(timeline_origin_host_, t); }
  // The NVMe engines' busy intervals since the last call, on the timeline.
  void TakeDiskBusy(Window& w) REQUIRES(mu_);
  // On host threads only (an event's time is a device call): accounts the
  // spans whose events have completed, and logs each step one boundary
  // after it closed (or at Synchronize) with its timed work in it.
  void ResolveSpans() EXCLUDES(mu_);
  // A closed step's StepStats with its timed work added.
  StepStats WithSpans(const StepStats& closed) const REQUIRES(mu_);
  // Stage 3 prefetch: follows the client's Fetch calls against the trace,
  // gathers ahead along it, keeps a released unit gathered when the trace
  // uses it again soon, and drops what the engine holds.
  void NoteFetch(int unit);
  Status Prefetch();
  bool KeepForReuse(int unit) const;
  Status DropGathered(Unit& u);
  Status DropEngineHeld();
  Status Gather(Unit& u, bool prefetch);
  // Device memory the client's work needs now. On one rank a shortage first
  // drops what the engine holds ahead of use; on several ranks it is an
  // error (the gathers must stay the same on every rank).
  Result<void*> AllocateForClient(uint64_t bytes, Stream& stream);
  void Decide(const double* partials_host, int64_t boundary) EXCLUDES(mu_);

  // Constant after construction.
  const Config config_;
  Device& device_;
  Communicator* comm_;
  const int rank_, world_, stage_;
  const int64_t accumulation_;
  const DType compute_dtype_;
  tbb::task_arena arena_;

  const bool offload_;        // offload_optimizer cpu or nvme: the optimizer runs on the host
  const bool nvme_;           // offload_optimizer nvme: master, m, v in the swap store
  const bool param_offload_;  // stage 3, offload_param cpu or nvme: partitioned units' shards off the device
  const bool param_nvme_;     // stage 3, offload_param nvme: shards past max_in_cpu in the parameter store
  // HostDevice: device memory is host memory and the engine's arithmetic on
  // it runs as host tasks (ctx.Host) in arena_. Otherwise (CUDA) it runs as
  // the device's kernels (kernels_), and the boundary's decision is read
  // back to the host before the updates are enqueued.
  const bool host_memory_;
  const DeviceKernels& kernels_;  // the registry's table for the device's kind
  const bool active_offload_;     // zinf.active_offload (Engine::Create checked its conditions)

  // Not guarded by mu_, by design. Set up on the client thread (Init,
  // AddUnit, Finalize) before any stream task that reads them is enqueued,
  // or the client thread's own (one client thread drives an engine,
  // zinf/engine.h) and read by the engine's stream tasks only in the order
  // the client's enqueues and the streams' events set: a task reads what the
  // client wrote before enqueueing it, and the client touches what a task
  // writes only after an event (or a Synchronize) says the task is done.
  std::unique_ptr<MemoryRegistrar> device_registrar_;  // CUDA: page-locks the pool's buffers for async copies
  void* param_scratch_ = nullptr;  // offload_param without offload_optimizer: the new shard on its way home
  std::unique_ptr<nvme::IoEngine> io_;
  std::unique_ptr<nvme::EngineRegistrar> registrar_;
  std::unique_ptr<nvme::IoEngine> param_io_;  // offload_param nvme: the parameter store's I/O
  std::unique_ptr<nvme::EngineRegistrar> param_registrar_;
  // Bytes both engines moved so far.
  nvme::IoEngineStats IoTotals() const {
    nvme::IoEngineStats t;
    for (const nvme::IoEngine* e : {io_.get(), param_io_.get()}) {
      if (!e) continue;
      const nvme::IoEngineStats s = e->stats();
      t.bytes_read += s.bytes_read;
      t.bytes_written += s.bytes_written;
    }
    return t;
  }
  std::unique_ptr<cpu::PinnedPool> pool_;
  // offload_optimizer nvme: the optimizer state's home on NVMe (sub-groups,
  // swap buffers, swapped gradients). Its boundary calls run as engine-stream
  // tasks.
  std::unique_ptr<OptimizerSwapper> swapper_;
  uint64_t param_capacity_ = 0;  // bytes asked of the parameter store so far (it grows as shards come)
  // offload_param nvme: the shards past max_in_cpu in their own store
  // (tensor id = unit index), and two staging buffers of the largest shard:
  // gathers read into one (gather stream), updates write from the other
  // (engine stream), each transfer complete before the buffer is reused.
  std::unique_ptr<nvme::SwapStore> param_store_;
  std::vector<cpu::PinnedBuffer> param_bufs_;
  static constexpr size_t kGatherBuffer = 0, kUpdateBuffer = 1;
  // Swapped gradients' accumulations on their way to the store, through
  // the swapper's two staging buffers.
  nvme::IoRequest grad_stage_write_[2];      // their writes (engine stream only)
  int next_grad_stage_ = 0;                  // enqueue order
  std::vector<int> grad_stage_of_;           // enqueue order: the staging buffer still holding unit i's gradient, or -1
  bool early_reads_ = false;                 // this window's first sub-group reads were issued during backward
  std::unique_ptr<nvme::IoEngine> ckpt_io_;  // checkpoint I/O when the optimizer is not on NVMe
  cpu::PinnedBuffer h_grad_stage_;           // one unit's reduced gradient on its way to the accumulator
  std::vector<cpu::PinnedBuffer> h_param_slots_;  // new compute-copy shards on their way to the device
  std::vector<std::unique_ptr<Event>> slot_filled_, slot_free_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Stream> copy_stream_;  // offload: host-to-device copies of updated shards and their gathers
  // Stage 3: the gathers (shard read from NVMe, copied up, all-gathered),
  // each after its unit's update, so the next forward's first units arrive
  // while the engine stream still updates the later ones.
  std::unique_ptr<Stream> gather_stream_;
  std::unique_ptr<Event> gathers_done_;  // the boundary's updates wait for every gather still reading a shard
  std::unique_ptr<Event> decided_;       // recorded after each boundary's decision
  std::unique_ptr<Event> updates_done_;  // offload: the engine stream's last task of a boundary
  // Boundary b's window closed: closed_events_[b % 8], recorded after its
  // StepStats are kept (a wait for b waits for nothing after it unless the
  // host has run 8 boundaries ahead).
  std::array<std::unique_ptr<Event>, 8> closed_events_;
  UnitTable table_;  // the units' layouts and placement rules, fixed at registration
  std::vector<Unit> units_;
  // Stage 3 prefetch: the order of one micro-step's Fetch calls, and the
  // gathered elements the engine holds ahead of use.
  FetchTrace fetch_trace_;
  bool order_change_logged_ = false;
  int64_t live_elems_ = 0;  // gathered elements of every unit (client's and prefetched)
  bool finalized_ = false;
  Status finalize_status_;       // the set-up's failure, once finalized_
  int64_t micro_in_window_ = 0;  // micro-steps since the last boundary
  int64_t boundaries_ = 0;
  // Stages 2 and 3: the reduce buckets (the open one, and those closed but
  // held until the micro-step ends when overlap_comm is off).
  ReduceBuckets buckets_;
  float* bucket_ = nullptr;  // rank-major staging of a multi-unit bucket
  int64_t bucket_capacity_ = 0;
  // Norm partials: rank-major [rank][unit][shard block], doubles.
  double* partials_ = nullptr;
  cpu::PinnedBuffer
      h_partials_;  // CUDA: all ranks' partials read back for the decision (and offload's, on their way down)
  NormPartialsLayout norm_layout_;  // blocks_per_rank: sum over units of owned blocks (stage 0: all blocks)
  // Parameter groups (0: the config's), changed on the client's thread
  // only; every update task takes the snapshot current when it is enqueued.
  std::vector<ParamGroupOptions> groups_;
  std::shared_ptr<const std::vector<ParamGroupOptions>> groups_snapshot_;

  // Work enqueued by EnqueueBoundary belongs to its own boundary's window,
  // work enqueued between boundaries to the next one (client thread).
  bool in_boundary_ = false;

  // Guarded by mu_: shared between the client thread and the engine's
  // stream tasks, with no order between them.
  Mutex mu_;
  // An I/O failure mid-step (the state on disk is mixed), a non-finite loss,
  // a step that cannot be skipped, or a failed Load: no further steps.
  Status broken_ GUARDED_BY(mu_);
  // broken_ is a failed Load's (the streams are fine: another Load may fix it).
  bool broken_by_load_ GUARDED_BY(mu_) = false;
  std::string last_checkpoint_ GUARDED_BY(mu_);  // the last one saved or loaded, for the message of broken_
  int64_t first_boundary_ GUARDED_BY(mu_) = 1;   // this engine's first since it started or loaded
  nvme::IoEngineStats io_base_ GUARDED_BY(mu_);  // IoTotals() at the last boundary, less checkpoint I/O since
  StreamCounts stream_counts_ GUARDED_BY(mu_);   // since the last boundary, in the engine stream's order
  std::map<int64_t, StreamCounts> closing_ GUARDED_BY(mu_);  // per boundary, until its window closes
  uint64_t nvme_total_read_ GUARDED_BY(mu_) = 0;             // over every closed window
  uint64_t nvme_total_written_ GUARDED_BY(mu_) = 0;
  StepDecision decider_ GUARDED_BY(mu_);  // the loss scaler and the applied steps
  Decision decision_ GUARDED_BY(mu_);
  // Each boundary's decision and the steps applied with it, until its
  // window closes.
  std::map<int64_t, std::pair<Decision, int64_t>> decided_steps_ GUARDED_BY(mu_);
  Window window_ GUARDED_BY(mu_);
  std::map<int64_t, StepStats> closed_ GUARDED_BY(mu_);  // the last 64 boundaries' metrics, by boundary
  // Timed spans (TimeSpan) not yet accounted; the windows they added up
  // to, by boundary (kept as long as closed_ keeps the boundary); spare
  // timing events; the last boundary logged.
  struct Span {
    std::unique_ptr<Event> start, end;
    int64_t window = 0;
    std::function<void(Window&, double)> account;
    std::string lane, what;
  };
  std::unique_ptr<Event> timeline_origin_ GUARDED_BY(mu_);  // null until SetTimelineOrigin
  Clock::time_point timeline_origin_host_ GUARDED_BY(mu_);
  // TraceBegin's start events until their TraceEnd, by token.
  static constexpr size_t kMaxOpenTraces = 4096;
  std::map<int64_t, std::unique_ptr<Event>> open_traces_ GUARDED_BY(mu_);
  int64_t next_trace_ GUARDED_BY(mu_) = 1;
  std::deque<Span> spans_ GUARDED_BY(mu_);
  std::map<int64_t, Window> timed_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Event>> spare_timing_events_ GUARDED_BY(mu_);
  int64_t logged_through_ GUARDED_BY(mu_) = 0;
  bool decision_pending_ GUARDED_BY(mu_) = false;  // a boundary was enqueued whose decision the host has not waited for
};

// Checkpoint and ReadState I/O through the engine's I/O engines is left out
// of the steps' NVMe bytes.
struct EngineImpl::ExcludeIo {
  EngineImpl* e;
  nvme::IoEngineStats before;
  explicit ExcludeIo(EngineImpl* engine) : e(engine), before(engine->IoTotals()) {}
  ~ExcludeIo() {
    const nvme::IoEngineStats after = e->IoTotals();
    MutexLock lock(e->mu_);
    e->io_base_.bytes_read += after.bytes_read - before.bytes_read;
    e->io_base_.bytes_written += after.bytes_written - before.bytes_written;
  }
};

}  // namespace zinf::sched
