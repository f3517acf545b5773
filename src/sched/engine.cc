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
#include "zinf/engine.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include <fcntl.h>

#include "common/communicator.h"
#include "common/logging.h"
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
#include "sched/gradient_placement.h"
#include "sched/loss_scaler.h"
#include "sched/lr_schedule.h"
#include "sched/partition.h"
#include "sched/plan.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Unit {
  std::string name;
  std::vector<std::string> tensor_names;
  std::vector<int64_t> tensor_offsets;  // elements from the unit's start
  std::vector<std::vector<int64_t>> tensor_shapes;
  UnitPartition part;
  // Device buffers.
  void* params = nullptr;        // the whole compute copy (stages 0-2, stage-3 persistent units)
  bool partitioned = false;      // stage 3: only this rank's shard lives here, gathered on Fetch
  void* shard_params = nullptr;  // stage 3: the shard (shard_elems), on the device
  PinnedBuffer h_shard;          // stage 3 with offload_param: the shard's home in pinned host memory instead
  bool shard_on_nvme = false;    // offload_param nvme past max_in_cpu: the shard's home is the parameter store
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
  Stream* fetch_stream = nullptr;  // stage 3: the stream of the client's current Fetch
  std::map<void*, std::vector<void*>> grad_ptrs_at;
  float* accum = nullptr;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // offload_optimizer cpu: the owned range's fp32 state in pinned host memory.
  PinnedBuffer h_master, h_exp_avg, h_exp_avg_sq, h_accum;
  // offload_optimizer nvme: whether the accumulated gradient lives in the
  // swap store (host memory short) rather than in h_accum.
  bool grad_on_nvme = false;
  int index = -1;  // in units_
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
  int64_t steps = 0;  // updates applied to this unit (its Adam bias-correction step)
};

// The decision of one boundary, made by a task on the engine stream and read
// by the tasks after it (and by the host once they ran).
struct Decision {
  bool skip = false;
  AdamOptions adam{};       // with the step's lr
  double grad_scale = 1;    // clipping, 1/loss_scale and the mean, folded
  double loss_scale = 1, next_loss_scale = 1, lr = 0, grad_norm = 0, clip_coef = 1;
};

struct Window {  // metrics accumulated since the last boundary
  double optimizer = 0, comm = 0, copy = 0, io = 0, stall = 0, longest_stall = 0;
  uint64_t copy_bytes = 0;
  std::string longest_stall_what;
  std::map<std::pair<std::string, std::string>, StepStats::Stall> stalls;  // by (unit, cause)
  std::map<std::string, StepStats::Collective> collectives;
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
             LossScaler scaler, AdamOptions adam, DType compute_dtype, int threads)
      : config_(config),
        device_(device),
        comm_(comm),
        rank_(comm ? comm->rank() : 0),
        world_(comm ? comm->size() : 1),
        stage_(config.zero.stage),
        accumulation_(accumulation),
        schedule_(std::move(schedule)),
        scaler_(std::move(scaler)),
        adam_(adam),
        compute_dtype_(compute_dtype),
        arena_(threads),
        offload_(config.zero.offload_optimizer.device != OffloadDevice::kNone),
        nvme_(config.zero.offload_optimizer.device == OffloadDevice::kNvme),
        param_offload_(config.zero.stage == 3 && config.zero.offload_param.device != OffloadDevice::kNone),
        param_nvme_(config.zero.stage == 3 && config.zero.offload_param.device == OffloadDevice::kNvme),
        host_memory_(device.kind() == DeviceKind::kHost) {}

  ~EngineImpl() override {
    if (stream_) {
      (void)stream_->Synchronize();
      (void)copy_stream_->Synchronize();
      (void)gather_stream_->Synchronize();
      // Nothing in flight into or out of buffers about to go back.
      for (auto* requests : {&group_read_, &group_write_}) {
        for (const nvme::IoRequest& r : *requests) {
          if (r.valid()) (void)r.Wait();
        }
      }
      for (const auto& reads : group_grad_read_) {
        for (const nvme::IoRequest& r : reads) (void)r.Wait();
      }
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
                    static_cast<void*>(u.master),
                    static_cast<void*>(u.exp_avg), static_cast<void*>(u.exp_avg_sq)}) {
      if (p) (void)device_.Free(p, *stream_);
    }
    u.params = u.shard_params = u.gathered = nullptr;
    u.grads = u.accum = u.master = u.exp_avg = u.exp_avg_sq = nullptr;
    for (PinnedBuffer* b : {&u.h_master, &u.h_exp_avg, &u.h_exp_avg_sq, &u.h_accum, &u.h_shard}) b->Release();
  }

  Status Init() {
    ZINF_ASSIGN_OR_RETURN(stream_, device_.CreateStream());
    ZINF_ASSIGN_OR_RETURN(copy_stream_, device_.CreateStream());
    ZINF_ASSIGN_OR_RETURN(gather_stream_, device_.CreateStream());
    ZINF_ASSIGN_OR_RETURN(gathers_done_, device_.CreateEvent());
    ZINF_ASSIGN_OR_RETURN(decided_, device_.CreateEvent());
    ZINF_ASSIGN_OR_RETURN(updates_done_, device_.CreateEvent());
    if (offload_ || param_offload_ || !host_memory_) {
      PinnedPoolOptions o;
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
        ZINF_ASSIGN_OR_RETURN(device_registrar_, sched::CreateHostRegistrarFor(device_));
        o.registrars.push_back(device_registrar_.get());
      }
      ZINF_ASSIGN_OR_RETURN(pool_, PinnedPool::Create(std::move(o)));
    }
    return Status::Ok();
  }

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
  Result<UnitPointers> Fetch(int unit, Stream& stream) override;
  Result<UnitPointers> GradBuffers(int unit) override;
  Status GradsReady(int unit, Stream& stream) override;
  Status Release(int unit, Stream& stream) override;
  Result<bool> Step() override;
  Result<float> loss_scale() override;
  Status Synchronize() override {
    Status a = stream_->Synchronize();
    Status b = copy_stream_->Synchronize();
    Status c = gather_stream_->Synchronize();
    return !a.ok() ? a : !b.ok() ? b : c;
  }
  Result<StepStats> Stats() override;
  Result<std::string> Save(const std::string& dir, const std::string& client_state) override;
  Result<std::string> Load(const std::string& path) override;
  Status ReadState(int unit, StateKind kind, float* host_dst) override;

 private:
  bool sharded() const { return stage_ >= 1 && world_ > 1; }
  bool distributed() const { return world_ > 1; }
  // The owned range of the optimizer state: the whole unit in stage 0.
  int64_t owned_begin(const Unit& u) const { return stage_ == 0 ? 0 : u.part.shard_begin(rank_); }
  int64_t owned_elems(const Unit& u) const { return stage_ == 0 ? u.part.padded_elems : u.part.shard_elems; }
  int64_t owned_valid(const Unit& u) const {
    return stage_ == 0 ? u.part.num_elems : u.part.valid_in_shard(rank_);
  }
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
  Status Finalize();
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
  Result<PinnedBuffer> Pinned(uint64_t bytes, const std::string& what);
  Status SetUpSwap();
  // offload_optimizer nvme, at registration: the unit joins the open
  // sub-group (a new one when it would exceed sub_group_size) with its
  // initial [master | 0 | 0]; a sub-group is written to the store, grown for
  // it, when the next one opens (the last at Finalize). Host memory: one
  // sub-group, whatever the model size.
  Status StageInitialState(const Unit& u, const float* master, int64_t valid);
  Status FlushInitialGroup();
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
  // or kAborted-like kUnavailable naming a failed rank.
  Status AgreeOk(const Status& mine);
  // Unit i's norm partials: at its last micro-step of the window (or `now`;
  // zeros when it has no gradient this window).
  Status EnqueuePartials(size_t i, bool now = false);
  Status DevicePartials(size_t i, int region, bool zero, const void* host_accum);
  // Unit u's update by the device's kernels (optimizer state in device
  // memory, not host-addressable), with the boundary's decision made.
  Status EnqueueDeviceUpdate(Unit& u, bool home, bool has_grad);
  Status ReadGroup(size_t g, const std::vector<char>& has_grad);
  // Engine stream: issues the reads of groups g .. g + buffers - 2 not yet
  // issued; the step's first ones go out as its last backward starts (the
  // state alone: `has_grad` null), the swapped gradients at the boundary.
  Status IssueReads(size_t g, const std::vector<char>* has_grad);
  void IssueWrites(size_t g);
  // An I/O failure of a step's swap transfers: the state on disk is mixed
  // (or the window's gradients lost), the engine refuses further steps
  // (broken_).
  enum class SwapKind { kState, kParams, kGradients };
  Status SwapFailure(Status s, SwapKind kind = SwapKind::kState);
  Result<uint64_t> PlaceGradients(int64_t buffers, int64_t max_group);
  // A swapped gradient's accumulation: into a staging buffer (after the
  // stored one is read back, unless `first`), then written to the store.
  Status SwapAccumulate(size_t i, const float* reduced, bool first);
  // Enqueue order: the next staging buffer for unit i, free once its last
  // write finished; and unit i's stored gradient read into it.
  Result<int> AcquireGradStage(size_t i);
  Status ReadSwappedGrads(size_t i, int stage);
  Status WaitGradWrites();
  Status SetUpParamSwap();
  // A task on `stream` (default: the engine stream) whose time adds to `field`.
  Status Timed(double Window::*field, StreamTask task, Stream* stream = nullptr);
  Status EnqueueAccumulate(float* accum, const float* reduced, int64_t elems, bool first);
  Status FlushBucket(const std::vector<int>& bucket);
  Status FlushPendingBuckets();
  Status EnqueueBoundary();
  Status WaitTimed(Stream& stream, Event& event, const Unit& u, const char* cause, const std::string& what);
  // Stage 3 prefetch: follows the client's Fetch calls against the trace,
  // gathers ahead along it, keeps a released unit gathered when the trace
  // uses it again soon, and drops what the engine holds.
  void NoteFetch(int unit);
  Status Prefetch();
  bool KeepForReuse(int unit) const;
  Status DropGathered(Unit& u);
  Status DropEngineHeld();
  Status Gather(Unit& u, bool prefetch);
  void Decide(const double* partials_host);

  const Config config_;
  Device& device_;
  Communicator* comm_;
  const int rank_, world_, stage_;
  const int64_t accumulation_;
  const LrSchedule schedule_;
  LossScaler scaler_;  // guarded by mu_
  const AdamOptions adam_;
  const DType compute_dtype_;
  tbb::task_arena arena_;

  const bool offload_;  // offload_optimizer cpu or nvme: the optimizer runs on the host
  const bool nvme_;     // offload_optimizer nvme: master, m, v in the swap store
  const bool param_offload_;  // stage 3, offload_param cpu or nvme: partitioned units' shards off the device
  const bool param_nvme_;     // stage 3, offload_param nvme: shards past max_in_cpu in the parameter store
  // HostDevice: device memory is host memory and the engine's arithmetic on
  // it runs as host tasks (ctx.Host). Otherwise (CUDA) it runs as the
  // kernels of sched/device_kernels.h, and the boundary's decision is read
  // back to the host before the updates are enqueued.
  const bool host_memory_;
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
  std::unique_ptr<PinnedPool> pool_;
  // NVMe: sub-groups of whole units (forward order), one swap tensor each
  // holding [master | m | v] of every unit's owned range, and buffer_count
  // pinned buffers the pipeline cycles through.
  struct Group {
    std::vector<int> units;
    int64_t elems = 0;  // sum of the units' owned elements
  };
  std::vector<Group> groups_;
  std::vector<int> group_of_unit_;
  std::vector<int64_t> offset_in_group_;  // elements: the unit's master; m and v follow, owned_elems apart
  std::unique_ptr<nvme::SwapStore> store_;
  std::vector<PinnedBuffer> nvme_bufs_;
  int64_t group_limit_ = 0;        // elements: sub_group_size, capped at one swap buffer
  uint64_t store_capacity_ = 0;    // bytes asked of the store so far (it grows as tensors come)
  uint64_t param_capacity_ = 0;    // the same for the parameter store
  size_t groups_written_ = 0;      // sub-groups whose initial state is in the store
  std::unique_ptr<float, decltype(&std::free)> init_group_{nullptr, &std::free};  // the open sub-group's initial state
  // offload_param nvme: the shards past max_in_cpu in their own store
  // (tensor id = unit index), and two staging buffers of the largest shard:
  // gathers read into one (gather stream), updates write from the other
  // (engine stream), each transfer complete before the buffer is reused.
  std::unique_ptr<nvme::SwapStore> param_store_;
  std::vector<PinnedBuffer> param_bufs_;
  static constexpr size_t kGatherBuffer = 0, kUpdateBuffer = 1;
  int64_t cpu_shard_elems_ = 0;  // offload_param nvme: shard elements kept in host memory (max_in_cpu)
  std::vector<nvme::IoRequest> group_read_, group_write_;  // this boundary's requests (engine stream only)
  // Gradients swapped to the store (PlaceGradients): tensor kGradTensor + unit
  // index; read back into grad_bufs_[g % buffers] at grad_offset_ (bytes).
  static constexpr nvme::TensorId kGradTensor = nvme::TensorId{1} << 32;
  int64_t swapped_grad_units_ = 0;
  std::vector<PinnedBuffer> grad_bufs_;
  std::vector<int64_t> grad_offset_;
  std::vector<std::vector<nvme::IoRequest>> group_grad_read_;  // this boundary's (engine stream only)
  PinnedBuffer grad_stage_[2];            // accumulations on their way to the store
  nvme::IoRequest grad_stage_write_[2];   // their writes (engine stream only)
  int next_grad_stage_ = 0;               // enqueue order
  std::vector<int> grad_stage_of_;        // enqueue order: the staging buffer still holding unit i's gradient, or -1
  bool early_reads_ = false;  // this window's first sub-group reads were issued during backward
  Status broken_;  // an I/O failure mid-step: the state on disk is mixed, no further steps
  bool broken_by_load_ = false;  // broken_ is a failed Load's (the streams are fine: another Load may fix it)
  std::string last_checkpoint_;  // the last one saved or loaded, for the message of broken_ (mu_)
  std::unique_ptr<nvme::IoEngine> ckpt_io_;  // checkpoint I/O when the optimizer is not on NVMe
  PinnedBuffer h_grad_stage_;               // one unit's reduced gradient on its way to the accumulator
  std::vector<PinnedBuffer> h_param_slots_;  // new compute-copy shards on their way to the device
  std::vector<std::unique_ptr<Event>> slot_filled_, slot_free_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Stream> copy_stream_;  // offload: host-to-device copies of updated shards and their gathers
  // Stage 3: the gathers (shard read from NVMe, copied up, all-gathered),
  // each after its unit's update, so the next forward's first units arrive
  // while the engine stream still updates the later ones.
  std::unique_ptr<Stream> gather_stream_;
  std::unique_ptr<Event> gathers_done_;  // the boundary's updates wait for every gather still reading a shard
  std::unique_ptr<Event> decided_;  // recorded after each boundary's decision
  std::unique_ptr<Event> updates_done_;  // offload: the engine stream's last task of a boundary
  std::vector<Unit> units_;
  // Stage 3 prefetch: the order of one micro-step's Fetch calls (recorded
  // in the first, compared in every later one), this micro-step's calls so
  // far, and the gathered elements the engine holds ahead of use.
  std::vector<int> trace_, recording_;
  bool trace_followed_ = false;  // this micro-step's calls match the trace so far
  bool order_change_logged_ = false;
  int64_t live_elems_ = 0;        // gathered elements of every unit (client's and prefetched)
  int64_t persistent_elems_ = 0;  // stage 3: elements of the units kept whole
  bool finalized_ = false;
  int64_t micro_in_window_ = 0;  // micro-steps since the last boundary
  int64_t boundaries_ = 0;
  // Stage 2 buckets: the open one (units whose gradients are ready) and, when
  // overlap_comm is off, those closed but held until the micro-step ends.
  std::vector<int> open_bucket_;
  int64_t open_bucket_elems_ = 0;
  std::vector<std::vector<int>> closed_buckets_;
  float* bucket_ = nullptr;  // rank-major staging of a multi-unit bucket
  int64_t bucket_capacity_ = 0;
  // Norm partials: rank-major [rank][unit][shard block], doubles.
  double* partials_ = nullptr;
  PinnedBuffer h_partials_;  // CUDA: all ranks' partials read back for the decision (and offload's, on their way down)
  int64_t blocks_per_rank_ = 0;  // sum over units of owned blocks (stage 0: all blocks)
  std::vector<int64_t> unit_block_offset_;  // into a rank's region

  std::mutex mu_;  // guards everything below, scaler_, and the Window
  nvme::IoEngineStats io_base_;  // IoTotals() at the last boundary, less checkpoint I/O since
  StreamCounts stream_counts_;   // since the last boundary, in the engine stream's order
  std::map<int64_t, StreamCounts> closing_;  // per boundary, until its window closes
  uint64_t nvme_total_read_ = 0, nvme_total_written_ = 0;  // over every closed window
  Decision decision_;
  int64_t steps_applied_ = 0;
  Window window_;
  std::optional<StepStats> last_stats_;
  bool decision_pending_ = false;  // a boundary was enqueued whose decision the host has not waited for
};

// Checkpoint and ReadState I/O through the engine's I/O engines is left out
// of the steps' NVMe bytes.
struct EngineImpl::ExcludeIo {
  EngineImpl* e;
  nvme::IoEngineStats before;
  explicit ExcludeIo(EngineImpl* engine) : e(engine), before(engine->IoTotals()) {}
  ~ExcludeIo() {
    const nvme::IoEngineStats after = e->IoTotals();
    std::lock_guard lock(e->mu_);
    e->io_base_.bytes_read += after.bytes_read - before.bytes_read;
    e->io_base_.bytes_written += after.bytes_written - before.bytes_written;
  }
};

Result<void*> EngineImpl::Alloc(uint64_t bytes, const std::string& what) {
  auto p = device_.Allocate(bytes, *stream_);
  if (!p.ok()) return p.status().WithContext(what);
  ZINF_RETURN_IF_ERROR(device_.Memset(*p, 0, bytes, *stream_));
  return *p;
}

Result<int> EngineImpl::AddUnit(const std::string& name, const std::vector<ParamSpec>& params) {
  if (finalized_) {
    return FailedPrecondition("unit '" + name +
                              "' registered after the first Fetch: register every unit before the first micro-step");
  }
  if (params.empty()) return InvalidArgument("unit '" + name + "' has no parameters");
  for (const Unit& u : units_) {
    if (u.name == name) return InvalidArgument("a unit named '" + name + "' is already registered");
  }
  Unit u;
  u.index = num_units();
  u.name = name;
  int64_t total = 0;
  for (const ParamSpec& p : params) {
    int64_t n = 1;
    for (int64_t d : p.shape) {
      if (d <= 0 || n > (int64_t{1} << 40) / d) {
        return InvalidArgument("parameter '" + p.name + "' of unit '" + name +
                               "': every dimension must be positive and the tensor under 2^40 elements");
      }
      n *= d;
    }
    u.tensor_names.push_back(p.name);
    u.tensor_shapes.push_back(p.shape);
    u.tensor_offsets.push_back(total);
    total += n;
  }
  u.part = PartitionUnit(total, world_);
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
  // Stage 3: units up to stage3_param_persistence_threshold stay whole,
  // until they add up to stage3_model_persistence_threshold.
  u.partitioned = stage_ == 3 && (total > config_.zero.stage3_param_persistence_threshold ||
                                  persistent_elems_ + total > config_.zero.stage3_model_persistence_threshold);
  // offload_param nvme: shards stay in host memory while they add up to
  // max_in_cpu elements; the others live in the parameter store.
  u.shard_on_nvme = host_home(u) && param_nvme_ &&
                    cpu_shard_elems_ + u.part.shard_elems > config_.zero.offload_param.max_in_cpu;
  if (host_home(u) && !u.shard_on_nvme) {
    ZINF_ASSIGN_OR_RETURN(u.h_shard, Pinned(u.part.shard_elems * DTypeSizeBytes(compute_dtype_),
                                            what + " parameter shard (offload_param)"));
  } else if (host_home(u)) {
    // Its home is the parameter store: AddShardToStore below.
  } else if (u.partitioned) {
    ZINF_ASSIGN_OR_RETURN(u.shard_params, Alloc(u.part.shard_elems * DTypeSizeBytes(compute_dtype_),
                                                what + " parameter shard"));
  } else {
    ZINF_ASSIGN_OR_RETURN(u.params, Alloc(P * DTypeSizeBytes(compute_dtype_), what + " parameters"));
  }
  if (!u.partitioned) {
    ZINF_ASSIGN_OR_RETURN(void* g, Alloc(P * 4, what + " gradients"));
    u.grads = static_cast<float*>(g);
  }
  if (nvme_) {
    // The accumulator is allocated at Finalize, in host memory or the swap
    // store as the host budget allows.
  } else if (offload_) {
    ZINF_ASSIGN_OR_RETURN(u.h_master, Pinned(owned * 4, what + " fp32 master"));
    ZINF_ASSIGN_OR_RETURN(u.h_exp_avg, Pinned(owned * 4, what + " Adam m"));
    ZINF_ASSIGN_OR_RETURN(u.h_exp_avg_sq, Pinned(owned * 4, what + " Adam v"));
    ZINF_ASSIGN_OR_RETURN(u.h_accum, Pinned(owned * 4, what + " gradient accumulator"));
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
    ZINF_RETURN_IF_ERROR(Cast(arena_, params[i].init, params[i].dtype, master.data() + u.tensor_offsets[i],
                              DType::kFloat32, n));
  }
  ZINF_RETURN_IF_ERROR(WriteComputeCopy(u, master.data()));
  const int64_t begin = owned_begin(u), valid = owned_valid(u);
  if (nvme_) {
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
  if (nvme_) ZINF_RETURN_IF_ERROR(StageInitialState(u, master.data() + begin, std::max<int64_t>(valid, 0)));
  cleanup.u = nullptr;
  if (stage_ == 3 && !u.partitioned) persistent_elems_ += total;
  if (host_home(u) && !u.shard_on_nvme) cpu_shard_elems_ += u.part.shard_elems;
  units_.push_back(std::move(u));
  return num_units() - 1;
}

Status EngineImpl::Finalize() {
  if (finalized_) return Status::Ok();
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
  int64_t offset = 0;
  for (const Unit& u : units_) {
    unit_block_offset_.push_back(offset);
    offset += owned_elems(u) / kNormBlock;
  }
  blocks_per_rank_ = offset;
  const int64_t regions = stage_ == 0 ? 1 : world_;
  ZINF_ASSIGN_OR_RETURN(void* p, Alloc(blocks_per_rank_ * regions * sizeof(double), "norm partials"));
  partials_ = static_cast<double*>(p);
  if (!host_memory_) {
    ZINF_ASSIGN_OR_RETURN(h_partials_, Pinned(blocks_per_rank_ * regions * sizeof(double), "norm partials read-back"));
  }
  if (offload_) {
    int64_t max_owned = 0;
    for (const Unit& u : units_) max_owned = std::max(max_owned, owned_elems(u));
    ZINF_ASSIGN_OR_RETURN(h_grad_stage_, Pinned(max_owned * 4, "gradient staging"));
    const int64_t slots = std::clamp<int64_t>(config_.zero.offload_optimizer.buffer_count, 2, 64);
    for (int64_t i = 0; i < slots; ++i) {
      ZINF_ASSIGN_OR_RETURN(PinnedBuffer b, Pinned(max_owned * DTypeSizeBytes(compute_dtype_), "parameter staging"));
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
      if (host_home(u)) max_shard = std::max(max_shard, u.part.shard_elems);
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
    std::lock_guard lock(mu_);
    io_base_ = IoTotals();
  }
  // Released starts out complete: the first boundary waits on nothing.
  for (Unit& u : units_) ZINF_RETURN_IF_ERROR(u.released->Record(*stream_));
  const uint64_t params = std::accumulate(units_.begin(), units_.end(), uint64_t{0},
                                          [](uint64_t s, const Unit& u) { return s + u.part.num_elems; });
  ZINF_LOG_INFO("engine: rank {}/{}, ZeRO stage {}, {} units, {} parameters, {} compute, accumulation {}, {}, {}",
                rank_, world_, stage_, units_.size(), FormatCount(static_cast<double>(params)),
                DTypeName(compute_dtype_), accumulation_, scaler_.Describe(), schedule_.Describe());
  return Status::Ok();
}

Status EngineImpl::StageInitialState(const Unit& u, const float* master, int64_t valid) {
  // A sub-group's swap buffer is one registered pinned buffer: at most
  // kMaxBufferBytes of [master | m | v], whatever sub_group_size asks.
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
    group_limit_ = std::min<int64_t>(config_.zero.sub_group_size, buffer_cap);
    if (group_limit_ < config_.zero.sub_group_size) {
      ZINF_LOG_INFO("engine: sub-groups of at most {} elements (sub_group_size {} capped: a sub-group's 12 B/element "
                    "swap buffer is one pinned buffer of at most {})",
                    group_limit_, config_.zero.sub_group_size, FormatBytes(PinnedPool::kMaxBufferBytes));
    }
  }
  if (n > group_limit_) {
    return InvalidArgument("zero_optimization.sub_group_size = " + std::to_string(group_limit_) +
                           " is smaller than unit '" + u.name + "' (" + std::to_string(n) +
                           " elements on this rank): sub-groups are whole units; raise sub_group_size to at least " +
                           std::to_string(n));
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
  if (!init_group_) {
    const uint64_t bytes = (static_cast<uint64_t>(group_limit_) * 12 + 4095) / 4096 * 4096;
    // Virtual until touched: what the largest sub-group uses is resident.
    init_group_.reset(static_cast<float*>(std::aligned_alloc(4096, bytes)));
    if (!init_group_) return OutOfMemory("the initial state of a sub-group (" + FormatBytes(bytes) + ")");
  }
  if (groups_.empty() || groups_.back().elems + n > group_limit_) {
    ZINF_RETURN_IF_ERROR(FlushInitialGroup());
    groups_.emplace_back();
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
  const size_t nbuf = nvme_bufs_.size();
  size_t end = std::min(groups_.size(), g + std::max<size_t>(1, nbuf - 1));
  if (config_.zinf.aio.phased_swaps) {
    // Phases: g's batch (nbuf groups, one per buffer) is read only once
    // every write of the batch before it has finished, and its own writes
    // go out after its last update (IssueWrites).
    const size_t first = g / nbuf * nbuf;
    end = std::min(groups_.size(), first + nbuf);
    if (!group_read_[g].valid() && first >= nbuf) {
      for (size_t h = first - nbuf; h < first; ++h) {
        if (group_write_[h].valid()) ZINF_RETURN_IF_ERROR(SwapFailure(group_write_[h].Wait()));
      }
    }
  }
  for (size_t h = g; h < end; ++h) {
    if (!group_read_[h].valid()) {
      if (h >= nbuf && group_write_[h - nbuf].valid()) ZINF_RETURN_IF_ERROR(SwapFailure(group_write_[h - nbuf].Wait()));
      group_read_[h] = store_->Read(h, nvme_bufs_[h % nbuf].data());
    }
    // Swapped gradients are final only once backward is over: read at the
    // boundary, those of units that have one this window.
    if (!has_grad || swapped_grad_units_ == 0 || !group_grad_read_[h].empty()) continue;
    for (int i : groups_[h].units) {
      if (!units_[i].grad_on_nvme || !(*has_grad)[i]) continue;
      char* dst = static_cast<char*>(grad_bufs_[h % nbuf].data()) + grad_offset_[i];
      group_grad_read_[h].push_back(store_->Read(kGradTensor + i, dst));
    }
  }
  return Status::Ok();
}

// Sub-group g updated: its write goes out now, or (phased swaps) with the
// rest of its batch once the batch's last group is updated, when none of
// the batch's reads is still in flight.
void EngineImpl::IssueWrites(size_t g) {
  const size_t nbuf = nvme_bufs_.size();
  size_t first = g;
  if (config_.zinf.aio.phased_swaps) {
    if ((g + 1) % nbuf != 0 && g + 1 != groups_.size()) return;
    first = g / nbuf * nbuf;
  }
  for (size_t h = first; h <= g; ++h) group_write_[h] = store_->Write(h, nvme_bufs_[h % nbuf].data());
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

// The per-block partials of unit i's owned accumulated gradient, once its
// last micro-step of the window is accumulated: during backward, off the
// boundary's critical path.
Status EngineImpl::EnqueuePartials(size_t i, bool now) {
  if (!now && micro_in_window_ != accumulation_ - 1) return Status::Ok();
  const int region = stage_ == 0 ? 0 : rank_;
  const bool zero = !units_[i].accumulated;
  units_[i].partials_taken = true;
  // offload: the accumulated gradient in host memory (a swapped one in the
  // staging buffer it went out from, or read back into one).
  const void* host_accum = units_[i].h_accum.data();
  if (units_[i].grad_on_nvme && !zero) {
    int stage = grad_stage_of_[i];
    if (stage < 0) {
      ZINF_ASSIGN_OR_RETURN(stage, AcquireGradStage(i));
      ZINF_RETURN_IF_ERROR(ReadSwappedGrads(i, stage));
    }
    host_accum = grad_stage_[stage].data();
  }
  if (!host_memory_) return DevicePartials(i, region, zero, host_accum);
  return stream_->Enqueue([this, region, i, zero, host_accum](const StreamContext& ctx) -> Status {
    double* out = static_cast<double*>(ctx.Host(partials_)) + region * blocks_per_rank_;
    const Unit& u = units_[i];
    const int64_t n = owned_elems(u);
    if (zero) {  // no gradient this window: nothing in the norm
      std::fill_n(out + unit_block_offset_[i], NumNormBlocks(n), 0.0);
      return Status::Ok();
    }
    const void* accum = offload_ ? host_accum : ctx.Host(owned_accum(u));
    return SumSquaresBlocks(arena_, accum, DType::kFloat32, n,
                            std::span<double>(out + unit_block_offset_[i], NumNormBlocks(n)))
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
  double* out = partials_ + region * blocks_per_rank_ + unit_block_offset_[i];
  if (zero) return device_.Memset(out, 0, blocks * sizeof(double), *stream_);  // +0.0 is all zero bits
  if (!offload_) return sched::DeviceSumSquaresBlocks(owned_accum(u), n, out, *stream_);
  double* host = static_cast<double*>(h_partials_.data()) + unit_block_offset_[i];
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, host_accum, n, host, blocks](const StreamContext&) {
    return SumSquaresBlocks(arena_, host_accum, DType::kFloat32, n, std::span<double>(host, blocks)).status();
  }));
  return device_.CopyToDevice(out, host, blocks * sizeof(double), *stream_);
}

Status EngineImpl::EnqueueDeviceUpdate(Unit& u, bool home, bool has_grad) {
  Decision d;
  {
    std::lock_guard lock(mu_);
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
    if (home) return sched::DeviceCast(master, DType::kFloat32, param_dst, compute_dtype_, valid, *stream_);
    return Status::Ok();
  }
  ZINF_ASSIGN_OR_RETURN(AdamStepConstants constants, MakeAdamStepConstants(d.adam, u.steps + 1, d.grad_scale));
  const bool copy = compute_dtype_ != DType::kFloat32;
  ZINF_RETURN_IF_ERROR(sched::DeviceAdamStep(constants, master, static_cast<float*>(u.exp_avg),
                                             static_cast<float*>(u.exp_avg_sq),
                                             static_cast<const float*>(owned_accum(u)), copy ? param_dst : nullptr,
                                             compute_dtype_, valid, *stream_)
                           .WithContext("unit '" + u.name + "'"));
  ++u.steps;
  if (!copy) return device_.CopyOnDevice(param_dst, master, valid * 4, *stream_);
  return Status::Ok();
}

Status EngineImpl::WaitTimed(Stream& stream, Event& event, const Unit& u, const char* cause, const std::string& what) {
  ZINF_ASSIGN_OR_RETURN(bool done, event.Query());
  if (done) return Status::Ok();
  auto start = std::make_shared<Clock::time_point>();
  ZINF_RETURN_IF_ERROR(stream.Enqueue([start](const StreamContext&) {
    *start = Clock::now();
    return Status::Ok();
  }));
  ZINF_RETURN_IF_ERROR(stream.Wait(event));
  return stream.Enqueue([this, start, what, unit = u.name, cause](const StreamContext&) {
    const double s = Seconds(*start, Clock::now());
    std::lock_guard lock(mu_);
    StepStats::Stall& st = window_.stalls[{unit, cause}];
    st.unit = unit;
    st.cause = cause;
    st.count += 1;
    st.seconds += s;
    window_.stall += s;
    if (s > window_.longest_stall) {
      window_.longest_stall = s;
      window_.longest_stall_what = what;
    }
    return Status::Ok();
  });
}

Result<UnitPointers> EngineImpl::Fetch(int unit, Stream& stream) {
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "Fetch"));
  ZINF_RETURN_IF_ERROR(Finalize());
  Unit& u = units_[unit];
  u.fetched_this_micro = true;
  ZINF_RETURN_IF_ERROR(WaitTimed(stream, *u.params_ready, u, nvme_ ? "disk" : "optimizer",
                                 "update of unit '" + u.name + "'"));
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
    ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, hit](const StreamContext&) {
      std::lock_guard lock(mu_);
      stream_counts_.fetches += 1;
      stream_counts_.prefetch_hits += hit;
      return Status::Ok();
    }));
    const char* cause = u.shard_on_nvme ? "disk" : distributed() ? "comm" : host_home(u) ? "copy" : "comm";
    ZINF_RETURN_IF_ERROR(WaitTimed(stream, *u.gathered_ready, u, cause,
                                   "all-gather of unit '" + u.name + "'"));
    ZINF_RETURN_IF_ERROR(Prefetch());
    return UnitPointers{u.gathered, compute_dtype_, u.part.num_elems, u.gathered_ptrs.at(u.gathered)};
  }
  return UnitPointers{u.params, compute_dtype_, u.part.num_elems, u.param_ptrs};
}

Result<UnitPointers> EngineImpl::GradBuffers(int unit) {
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "GradBuffers"));
  Unit& u = units_[unit];
  if (!u.partitioned) return UnitPointers{u.grads, DType::kFloat32, u.part.num_elems, u.grad_ptrs};
  if (!u.grads) {
    // On the stream of the unit's Fetch (backward's, usually, or the
    // forward's when this comes first); a later Fetch on another stream
    // waits for the allocation through grads_free.
    Stream& s = u.fetch_stream ? *u.fetch_stream : *stream_;
    ZINF_RETURN_IF_ERROR(AllocateGrads(u, s, /*zero=*/false));
    if (!u.client_holds) ZINF_RETURN_IF_ERROR(u.grads_free->Record(s));
  }
  return UnitPointers{u.grads, DType::kFloat32, u.part.num_elems, u.grad_ptrs_at.at(u.grads)};
}

// Stage 3: a partitioned unit's gradient buffer, from the budget, usable by
// the client's work on `stream` from here. The padding past the tensors is
// zeroed (backward writes only the tensors), or all of it for a unit whose
// GradsReady came without GradBuffers (no gradient written: zeros).
Status EngineImpl::AllocateGrads(Unit& u, Stream& stream, bool zero) {
  const uint64_t bytes = static_cast<uint64_t>(u.part.padded_elems) * 4;
  auto g = device_.Allocate(bytes, stream);
  if (!g.ok() && g.status().code() == StatusCode::kOutOfMemory) {
    // What the engine holds ahead of use gives way to what the client needs now.
    ZINF_RETURN_IF_ERROR(DropEngineHeld());
    g = device_.Allocate(bytes, stream);
  }
  if (!g.ok()) return g.status().WithContext("gradients of unit '" + u.name + "' (stage 3)");
  u.grads = static_cast<float*>(*g);
  const int64_t from = zero ? 0 : u.part.num_elems;
  if (u.part.padded_elems > from) {
    ZINF_RETURN_IF_ERROR(device_.Memset(u.grads + from, 0, (u.part.padded_elems - from) * 4, stream));
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
  return u.released->Record(stream);
}

void EngineImpl::NoteFetch(int unit) {
  const size_t pos = recording_.size();
  recording_.push_back(unit);
  if (pos == 0) trace_followed_ = !trace_.empty();
  if (trace_followed_ && (pos >= trace_.size() || trace_[pos] != unit)) {
    trace_followed_ = false;
    if (!order_change_logged_) {
      order_change_logged_ = true;
      ZINF_LOG_INFO("engine: the order of Fetch calls changed (call {} is unit '{}', the recorded order has {}): no "
                    "prefetch until the new order is recorded (this is said once)",
                    pos + 1, units_[unit].name,
                    pos < trace_.size() ? "'" + units_[trace_[pos]].name + "'" : std::string("no more calls"));
    }
  }
}

// Gathers the units the trace fetches next, while the elements gathered
// ahead stay within stage3_prefetch_bucket_size and everything gathered
// within stage3_max_live_parameters and the device budget.
Status EngineImpl::Prefetch() {
  if (!trace_followed_) return Status::Ok();
  const int64_t bucket = config_.zero.stage3_prefetch_bucket_size;
  const int64_t live_cap = config_.zero.stage3_max_live_parameters;
  int64_t ahead = 0;
  for (size_t j = recording_.size(); j < trace_.size(); ++j) {
    Unit& w = units_[trace_[j]];
    if (w.gathered) continue;
    if (ahead + w.part.padded_elems > bucket || live_elems_ + w.part.padded_elems > live_cap) break;
    Status s = Gather(w, /*prefetch=*/true);
    if (s.code() == StatusCode::kOutOfMemory) break;  // the device budget is full: the client's Fetch gathers it
    ZINF_RETURN_IF_ERROR(s);
    w.prefetched = true;
    ahead += w.part.padded_elems;
  }
  return Status::Ok();
}

// Whether the trace fetches `unit` again within stage3_max_reuse_distance
// elements (of the units fetched in between), with the live cap respected.
bool EngineImpl::KeepForReuse(int unit) const {
  if (!trace_followed_ || live_elems_ > config_.zero.stage3_max_live_parameters) return false;
  int64_t distance = 0;
  for (size_t j = recording_.size(); j < trace_.size(); ++j) {
    if (trace_[j] == unit) return distance <= config_.zero.stage3_max_reuse_distance;
    distance += units_[trace_[j]].part.padded_elems;
    if (distance > config_.zero.stage3_max_reuse_distance) return false;
  }
  return false;
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
  auto full = device_.Allocate(u.part.padded_elems * esize, gs);
  if (!full.ok() && !prefetch && full.status().code() == StatusCode::kOutOfMemory) {
    // What the engine holds ahead of use gives way to what the client asks for.
    ZINF_RETURN_IF_ERROR(DropEngineHeld());
    full = device_.Allocate(u.part.padded_elems * esize, gs);
  }
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
        return param_store_->Read(index, buf).Wait().WithContext("parameter shard of unit '" + units_[index].name + "'");
      };
      ZINF_RETURN_IF_ERROR(Timed(&Window::io, std::move(read), &gs));
    }
    ZINF_RETURN_IF_ERROR(TimedCopies(gs, u.part.shard_elems * esize, [&] {
      return device_.CopyToDevice(mine, src, u.part.shard_elems * esize, gs);
    }));
    shard = mine;
  }
  if (distributed()) {
    ZINF_RETURN_IF_ERROR(Collective(gs, "all_gather", u.part.padded_elems * esize, [&] {
      return comm_->AllGather(shard, u.gathered, u.part.shard_elems, compute_dtype_, gs);
    }));
  } else if (!host_home(u)) {
    ZINF_RETURN_IF_ERROR(device_.CopyOnDevice(u.gathered, shard, u.part.shard_elems * esize, gs));
  }
  ZINF_RETURN_IF_ERROR(u.gathered_ready->Record(gs));
  std::vector<void*>& ptrs = u.gathered_ptrs[u.gathered];
  if (ptrs.empty()) {
    for (int64_t off : u.tensor_offsets) ptrs.push_back(static_cast<char*>(u.gathered) + off * esize);
  }
  return Status::Ok();
}

Result<PinnedBuffer> EngineImpl::Pinned(uint64_t bytes, const std::string& what) {
  auto b = pool_->Acquire(std::max<uint64_t>(bytes, 1));
  if (!b.ok()) return b.status().WithContext(what);
  std::memset(b->data(), 0, bytes);
  return std::move(*b);
}

Status EngineImpl::TimedCopies(Stream& stream, uint64_t bytes, const std::function<Status()>& enqueue) {
  auto start = std::make_shared<Clock::time_point>();
  ZINF_RETURN_IF_ERROR(stream.Enqueue([start](const StreamContext&) {
    *start = Clock::now();
    return Status::Ok();
  }));
  ZINF_RETURN_IF_ERROR(enqueue());
  return stream.Enqueue([this, start, bytes](const StreamContext&) {
    const double s = Seconds(*start, Clock::now());
    std::lock_guard lock(mu_);
    window_.copy += s;
    window_.copy_bytes += bytes;
    return Status::Ok();
  });
}

Status EngineImpl::HostAccumulate(Unit& u, const float* reduced, bool first) {
  if (u.grad_on_nvme) return SwapAccumulate(static_cast<size_t>(&u - units_.data()), reduced, first);
  const int64_t n = owned_elems(u);
  float* dst = static_cast<float*>(first ? u.h_accum.data() : h_grad_stage_.data());
  ZINF_RETURN_IF_ERROR(TimedCopies(*stream_, n * 4, [&] { return device_.CopyToHost(dst, reduced, n * 4, *stream_); }));
  if (first) return Status::Ok();
  return stream_->Enqueue([this, a = static_cast<float*>(u.h_accum.data()), r = dst, n](const StreamContext&) {
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, int64_t{1} << 16), [&](const tbb::blocked_range<int64_t>& range) {
        for (int64_t i = range.begin(); i < range.end(); ++i) a[i] = a[i] + r[i];
      });
    });
    return Status::Ok();
  });
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

Status EngineImpl::Collective(Stream& stream, const char* kind, uint64_t bytes,
                              const std::function<Status()>& enqueue) {
  auto start = std::make_shared<Clock::time_point>();
  ZINF_RETURN_IF_ERROR(stream.Enqueue([start](const StreamContext&) {
    *start = Clock::now();
    return Status::Ok();
  }));
  ZINF_RETURN_IF_ERROR(enqueue());
  return stream.Enqueue([this, start, kind, bytes](const StreamContext&) {
    const double s = Seconds(*start, Clock::now());
    std::lock_guard lock(mu_);
    window_.comm += s;
    StepStats::Collective& c = window_.collectives[kind];
    c.kind = kind;
    c.calls += 1;
    c.bytes += bytes;
    return Status::Ok();
  });
}

Status EngineImpl::Timed(double Window::*field, StreamTask task, Stream* stream) {
  return (stream ? *stream : *stream_).Enqueue([this, field, task = std::move(task)](const StreamContext& ctx) {
    const auto start = Clock::now();
    Status s = task(ctx);
    const double seconds = Seconds(start, Clock::now());
    std::lock_guard lock(mu_);
    window_.*field += seconds;
    return s;
  });
}

// accum = reduced (first micro-step of the window) or accum + reduced: the
// same fp32 additions in the same order in every stage.
Status EngineImpl::EnqueueAccumulate(float* accum, const float* reduced, int64_t elems, bool first) {
  if (first) return device_.CopyOnDevice(accum, reduced, elems * 4, *stream_);
  if (!host_memory_) return sched::DeviceAddInPlace(accum, reduced, elems, *stream_);
  return stream_->Enqueue([this, accum, reduced, elems](const StreamContext& ctx) {
    float* a = static_cast<float*>(ctx.Host(accum));
    const float* r = static_cast<const float*>(ctx.Host(reduced));
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, elems, int64_t{1} << 16),
                        [&](const tbb::blocked_range<int64_t>& range) {
                          for (int64_t i = range.begin(); i < range.end(); ++i) a[i] = a[i] + r[i];
                        });
    });
    return Status::Ok();
  });
}

Status EngineImpl::GradsReady(int unit, Stream& stream) {
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "GradsReady"));
  ZINF_RETURN_IF_ERROR(Finalize());
  Unit& u = units_[unit];
  if (u.grads_ready_this_micro) {
    return FailedPrecondition("GradsReady(unit '" + u.name + "') twice in one micro-step; call Step() between");
  }
  u.grads_ready_this_micro = true;
  if (nvme_ && !early_reads_ && micro_in_window_ == accumulation_ - 1) {
    // The optimizer state does not depend on the gradients: its first
    // sub-groups are read while backward still runs.
    early_reads_ = true;
    ZINF_RETURN_IF_ERROR(stream_->Enqueue([this](const StreamContext&) { return IssueReads(0, nullptr); }));
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
    ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
    return EnqueuePartials(unit);
  }
  // Stage 2: into the open bucket; closed buckets go out now (overlap_comm)
  // or when the micro-step's last unit is ready.
  const int64_t cap = config_.zero.reduce_bucket_size;
  if (!open_bucket_.empty() && open_bucket_elems_ + P > cap) {
    closed_buckets_.push_back(std::move(open_bucket_));
    open_bucket_.clear();
    open_bucket_elems_ = 0;
  }
  open_bucket_.push_back(unit);
  open_bucket_elems_ += P;
  const bool last = std::all_of(units_.begin(), units_.end(), [](const Unit& x) { return x.grads_ready_this_micro; });
  if (last) {  // else Step() closes it (units not fetched this micro-step have no gradients)
    closed_buckets_.push_back(std::move(open_bucket_));
    open_bucket_.clear();
    open_bucket_elems_ = 0;
  }
  if (config_.zero.overlap_comm || last) return FlushPendingBuckets();
  return Status::Ok();
}

Status EngineImpl::FlushPendingBuckets() {
  for (const std::vector<int>& b : closed_buckets_) ZINF_RETURN_IF_ERROR(FlushBucket(b));
  closed_buckets_.clear();
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
                                    : EnqueueAccumulate(u.accum, shard, u.part.shard_elems, first));
      ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
      ZINF_RETURN_IF_ERROR(FreeGradsIfTransient(u));
      ZINF_RETURN_IF_ERROR(EnqueuePartials(i));
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
  const auto copy_start = std::make_shared<Clock::time_point>();
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([copy_start](const StreamContext&) {
    *copy_start = Clock::now();
    return Status::Ok();
  }));
  for (int r = 0; r < world_; ++r) {
    int64_t off = r * count;
    for (int i : bucket) {
      const Unit& u = units_[i];
      ZINF_RETURN_IF_ERROR(device_.CopyOnDevice(bucket_ + off, u.grads + u.part.shard_begin(r),
                                                u.part.shard_elems * 4, *stream_));
      off += u.part.shard_elems;
    }
  }
  for (int i : bucket) ZINF_RETURN_IF_ERROR(FreeGradsIfTransient(units_[i]));  // packed: the bucket holds them now
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, copy_start](const StreamContext&) {
    const double s = Seconds(*copy_start, Clock::now());
    std::lock_guard lock(mu_);
    window_.copy += s;
    return Status::Ok();
  }));
  float* mine = bucket_ + rank_ * count;
  ZINF_RETURN_IF_ERROR(Collective("reduce_scatter", needed * 4, [&] {
    return comm_->ReduceScatter(bucket_, mine, count, DType::kFloat32, ReduceOp::kSum, *stream_);
  }));
  int64_t off = 0;
  for (int i : bucket) {
    Unit& u = units_[i];
    const bool first = first_of(i);
    ZINF_RETURN_IF_ERROR(offload_ ? HostAccumulate(u, mine + off, first)
                                  : EnqueueAccumulate(u.accum, mine + off, u.part.shard_elems, first));
    ZINF_RETURN_IF_ERROR(u.grads_free->Record(*stream_));
    ZINF_RETURN_IF_ERROR(EnqueuePartials(i));
    off += u.part.shard_elems;
  }
  return Status::Ok();
}

Result<bool> EngineImpl::Step() {
  ZINF_RETURN_IF_ERROR(Finalize());
  {
    std::lock_guard lock(mu_);
    if (!broken_.ok()) return broken_;
  }
  for (const Unit& u : units_) {
    if (u.fetched_this_micro && !u.grads_ready_this_micro) {
      return FailedPrecondition("Step() before GradsReady(unit '" + u.name +
                                "'): every unit fetched in a micro-step must have its gradients ready before the "
                                "micro-step ends (a unit not fetched has none)");
    }
  }
  if (!open_bucket_.empty()) {  // some units were not fetched: the last bucket closes here
    closed_buckets_.push_back(std::move(open_bucket_));
    open_bucket_.clear();
    open_bucket_elems_ = 0;
  }
  ZINF_RETURN_IF_ERROR(FlushPendingBuckets());
  for (Unit& u : units_) u.grads_ready_this_micro = u.fetched_this_micro = false;
  // Stage 3: what was gathered ahead and not used goes (an update may
  // follow); this micro-step's order becomes the trace when it differs.
  ZINF_RETURN_IF_ERROR(DropEngineHeld());
  if (recording_ != trace_) trace_ = recording_;
  recording_.clear();
  trace_followed_ = false;
  if (++micro_in_window_ < accumulation_) return false;
  micro_in_window_ = 0;
  ZINF_RETURN_IF_ERROR(EnqueueBoundary());
  return true;
}

void EngineImpl::Decide(const double* partials) {
  // Global block order: unit by unit, and inside a unit rank by rank (the
  // shards' order), block by block — the order of the unsharded unit.
  double total = 0;
  const int regions = stage_ == 0 ? 1 : world_;
  for (size_t i = 0; i < units_.size(); ++i) {
    const int64_t blocks = owned_elems(units_[i]) / kNormBlock;
    for (int r = 0; r < regions; ++r) {
      const double* p = partials + r * blocks_per_rank_ + unit_block_offset_[i];
      for (int64_t b = 0; b < blocks; ++b) total += p[b];
    }
  }
  std::lock_guard lock(mu_);
  Decision d;
  d.loss_scale = scaler_.scale();
  const double mean_div = d.loss_scale * static_cast<double>(world_) * static_cast<double>(accumulation_);
  d.grad_norm = std::sqrt(total) / mean_div;
  d.skip = !std::isfinite(total);
  if (!d.skip && config_.gradient_clipping > 0) {
    const double c = config_.gradient_clipping / (d.grad_norm + 1e-6);
    if (c < 1) d.clip_coef = c;
  }
  d.lr = schedule_.LrAt(steps_applied_);
  d.adam = adam_;
  d.adam.lr = d.lr;
  d.grad_scale = d.clip_coef / mean_div;
  if (!d.skip) {
    // Options were validated at Create; a schedule's lr cannot be bad.
    if (auto c = MakeAdamStepConstants(d.adam, steps_applied_ + 1, d.grad_scale); !c.ok()) {
      ZINF_LOG_ERROR("engine: {}", c.status().ToString());
      d.skip = true;
    }
  }
  scaler_.Update(d.skip);
  d.next_loss_scale = scaler_.scale();
  if (!d.skip) ++steps_applied_;
  decision_ = d;
}

Status EngineImpl::EnqueueBoundary() {
  ++boundaries_;
  early_reads_ = false;
  const int64_t boundary = boundaries_;
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
    if (!units_[i].partials_taken) ZINF_RETURN_IF_ERROR(EnqueuePartials(i, /*now=*/true));
    has_grad[i] = units_[i].accumulated;
    units_[i].accumulated = units_[i].partials_taken = false;
  }
  // Every swapped gradient is on disk before the boundary reads them back.
  if (swapped_grad_units_ > 0) {
    ZINF_RETURN_IF_ERROR(Timed(&Window::io, [this](const StreamContext&) { return WaitGradWrites(); }));
  }
  const auto has_grad_shared = std::make_shared<const std::vector<char>>(has_grad);
  if (sharded()) {
    double* mine = partials_ + rank_ * blocks_per_rank_;
    ZINF_RETURN_IF_ERROR(Collective("all_gather", blocks_per_rank_ * world_ * sizeof(double), [&] {
      // Doubles travel as pairs of fp32 words: all-gather only moves bytes.
      return comm_->AllGather(mine, partials_, 2 * blocks_per_rank_, DType::kFloat32, *stream_);
    }));
  }
  if (host_memory_) {
    ZINF_RETURN_IF_ERROR(stream_->Enqueue([this](const StreamContext& ctx) {
      Decide(static_cast<const double*>(ctx.Host(partials_)));
      return Status::Ok();
    }));
  } else {
    // The kernels below take the decision as launch arguments: read the
    // partials back (this waits for the step's last reduction) and decide here.
    const int regions = stage_ == 0 ? 1 : world_;
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(h_partials_.data(), partials_, blocks_per_rank_ * regions * sizeof(double),
                                            *stream_));
    ZINF_RETURN_IF_ERROR(stream_->Synchronize());
    Decide(static_cast<const double*>(h_partials_.data()));
  }
  ZINF_RETURN_IF_ERROR(decided_->Record(*stream_));
  {
    std::lock_guard lock(mu_);
    decision_pending_ = true;
  }
  // Per unit, in forward order: Adam over the owned range, the new compute
  // copy written in the same pass, then (sharded) every rank's new shard
  // gathered; the unit's event then releases its next Fetch. With offload,
  // Adam runs on the host into a pinned staging slot while the copy stream
  // moves the previous slots to the device, so later units are still being
  // updated when the first ones are back.
  const size_t esize = DTypeSizeBytes(compute_dtype_);
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    // Where the new compute copy goes: a staging slot on its way to the
    // device (offload), the shard's pinned home itself (offload_param with
    // offload), the scratch on its way home (offload_param alone), or its
    // place on the device.
    const bool home = host_home(u);
    const bool use_slot = offload_ && !home;
    const size_t slot = use_slot ? i % h_param_slots_.size() : 0;
    // offload_param nvme: the new shard goes home through a staging buffer.
    const bool to_store = u.shard_on_nvme;
    void* home_buf = to_store ? param_bufs_[kUpdateBuffer].data() : u.h_shard.data();
    void* staging = use_slot ? h_param_slots_[slot].data() : home && offload_ ? home_buf : nullptr;
    float* swap = nullptr;  // NVMe: the unit's [master | m | v] in its group's buffer
    const void* grad = u.h_accum.data();  // offload: the accumulated gradient, or its place in the gradient buffer
    if (nvme_) {
      const size_t g = group_of_unit_[i];
      swap = static_cast<float*>(nvme_bufs_[g % nvme_bufs_.size()].data()) + offset_in_group_[i];
      if (u.grad_on_nvme) grad = static_cast<char*>(grad_bufs_[g % grad_bufs_.size()].data()) + grad_offset_[i];
      if (groups_[g].units.front() == static_cast<int>(i)) {
        ZINF_RETURN_IF_ERROR(Timed(&Window::io, [this, g, has = has_grad_shared](const StreamContext&) {
          return ReadGroup(g, *has);
        }));
      }
    }
    auto update = [this, &u, staging, swap, grad, home, use_slot, to_store, esize,
                   has = has_grad[i] != 0](const StreamContext& ctx) -> Status {
      Decision d;
      {
        std::lock_guard lock(mu_);
        d = decision_;
      }
      const int64_t valid = owned_valid(u);
      if (valid == 0) {  // only padding on this rank: nothing to update, but the unit took a step
        if (!d.skip && has) ++u.steps;
        return Status::Ok();
      }
      AdamBuffers b;
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
      b.grads = offload_ ? grad : ctx.Host(owned_accum(u));
      b.grad_dtype = DType::kFloat32;
      b.num_elems = static_cast<size_t>(valid);
      void* param_dst = offload_ ? staging : ctx.Host(home ? param_scratch_ : param_home(u));
      if (d.skip || !has) {
        // Skipped (an overflow, or no gradient for this unit this window).
        // A staging slot, the scratch or a parameter staging buffer is
        // copied on regardless: refill it with the unchanged compute copy
        // (always the rounding of the master).
        if (use_slot || (home && !offload_) || to_store) {
          return Cast(arena_, b.params, DType::kFloat32, param_dst, compute_dtype_, valid);
        }
        return Status::Ok();
      }
      if (compute_dtype_ != DType::kFloat32) {
        b.param_copy = param_dst;
        b.param_copy_dtype = compute_dtype_;
      }
      // The unit's own step count, as an optimizer keeps one per parameter.
      ZINF_ASSIGN_OR_RETURN(AdamStepConstants constants, MakeAdamStepConstants(d.adam, u.steps + 1, d.grad_scale));
      ZINF_RETURN_IF_ERROR(AdamStep(arena_, constants, b).WithContext("unit '" + u.name + "'"));
      ++u.steps;
      if (compute_dtype_ == DType::kFloat32) std::memcpy(param_dst, b.params, valid * 4);
      return Status::Ok();
    };
    Stream& gather_stream = use_slot ? *copy_stream_ : *stream_;
    if (use_slot) ZINF_RETURN_IF_ERROR(stream_->Wait(*slot_free_[slot]));
    if (!host_memory_ && !offload_) {
      ZINF_RETURN_IF_ERROR(EnqueueDeviceUpdate(u, home, has_grad[i] != 0));
    } else {
      ZINF_RETURN_IF_ERROR(Timed(&Window::optimizer, std::move(update)));
    }
    if (nvme_ && groups_[group_of_unit_[i]].units.back() == static_cast<int>(i)) {
      const size_t g = group_of_unit_[i];
      ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, g](const StreamContext&) {
        IssueWrites(g);
        return Status::Ok();
      }));
    }
    if (home && !offload_ && owned_valid(u) > 0) {
      const uint64_t bytes = owned_valid(u) * esize;
      ZINF_RETURN_IF_ERROR(TimedCopies(*stream_, bytes, [&] {
        return device_.CopyToHost(home_buf, param_scratch_, bytes, *stream_);
      }));
    }
    if (to_store) {
      // Written before the unit's update counts as done (a gather reads it
      // next); the padding past the valid elements is zeros, as in a shard
      // kept in host memory. Meanwhile the disk still works on the
      // sub-group reads issued ahead.
      ZINF_RETURN_IF_ERROR(Timed(&Window::io, [this, i, home_buf, esize](const StreamContext&) {
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
  }
  if (nvme_) {  // the step ends when every sub-group is back on disk
    ZINF_RETURN_IF_ERROR(Timed(&Window::io, [this](const StreamContext&) -> Status {
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
    }));
  }
  // The step's counts in the engine stream's order: every read and write of
  // the step has completed here.
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, boundary](const StreamContext&) {
    std::lock_guard lock(mu_);
    StreamCounts c = stream_counts_;
    stream_counts_ = StreamCounts{};
    const nvme::IoEngineStats now = IoTotals();
    c.nvme_read = now.bytes_read - io_base_.bytes_read;
    c.nvme_written = now.bytes_written - io_base_.bytes_written;
    io_base_ = now;
    closing_[boundary] = c;
    return Status::Ok();
  }));
  // Close the window: the step's metrics, logged in one line (with offload,
  // after the last copy back and the engine stream's last task).
  if (offload_) {
    ZINF_RETURN_IF_ERROR(updates_done_->Record(*stream_));
    ZINF_RETURN_IF_ERROR(copy_stream_->Wait(*updates_done_));
  }
  return (offload_ ? *copy_stream_ : *stream_).Enqueue([this, boundary](const StreamContext&) {
    StepStats s;
    {
      std::lock_guard lock(mu_);
      const Decision& d = decision_;
      s.step = steps_applied_;
      s.boundary = boundary;
      s.skipped = d.skip;
      s.loss_scale = d.loss_scale;
      s.next_loss_scale = d.next_loss_scale;
      s.lr = d.lr;
      s.grad_norm = d.grad_norm;
      s.clip_coef = d.clip_coef;
      s.optimizer_seconds = window_.optimizer;
      s.comm_seconds = window_.comm;
      s.copy_seconds = window_.copy;
      s.io_seconds = window_.io;
      s.copy_bytes = window_.copy_bytes;
      if (auto it = closing_.find(boundary); it != closing_.end()) {
        s.fetches = it->second.fetches;
        s.prefetch_hits = it->second.prefetch_hits;
        s.nvme_bytes_read = it->second.nvme_read;
        s.nvme_bytes_written = it->second.nvme_written;
        closing_.erase(it);
      }
      nvme_total_read_ += s.nvme_bytes_read;
      nvme_total_written_ += s.nvme_bytes_written;
      s.nvme_bytes_read_total = nvme_total_read_;
      s.nvme_bytes_written_total = nvme_total_written_;
      s.stall_seconds = window_.stall;
      s.longest_stall = window_.longest_stall_what;
      for (auto& [key, st] : window_.stalls) s.stalls.push_back(st);
      for (auto& [kind, c] : window_.collectives) s.collectives.push_back(c);
      window_ = Window{};
    }
    s.device_bytes_in_use = device_.memory_stats().in_use_bytes;
    if (pool_) {
      const PinnedPoolStats ps = pool_->stats();
      s.host_pinned_bytes = ps.pinned_bytes;
      s.host_peak_pinned_bytes = ps.peak_pinned_bytes;
    }
    ZINF_LOG_INFO("{}", s.ToString());
    std::lock_guard lock(mu_);
    last_stats_ = std::move(s);
    return Status::Ok();
  });
}

Result<float> EngineImpl::loss_scale() {
  bool pending;
  {
    std::lock_guard lock(mu_);
    pending = decision_pending_ && scaler_.dynamic();
  }
  if (pending) {
    ZINF_RETURN_IF_ERROR(decided_->Synchronize());
    std::lock_guard lock(mu_);
    decision_pending_ = false;
  }
  std::lock_guard lock(mu_);
  return static_cast<float>(scaler_.scale());
}

Result<StepStats> EngineImpl::Stats() {
  ZINF_RETURN_IF_ERROR(Synchronize());
  std::lock_guard lock(mu_);
  if (!last_stats_) return FailedPrecondition("Stats(): no optimizer step has been taken yet");
  return *last_stats_;
}

Status EngineImpl::ReadState(int unit, StateKind kind, float* host_dst) {
  ExcludeIo exclude(this);
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "ReadState"));
  ZINF_RETURN_IF_ERROR(Finalize());
  ZINF_RETURN_IF_ERROR(Synchronize());
  Unit& u = units_[unit];
  const int64_t n = u.part.num_elems;
  if (kind == StateKind::kComputeParams) {
    std::vector<uint8_t> raw(n * DTypeSizeBytes(compute_dtype_));
    const bool gather = u.partitioned && !u.gathered;
    if (gather) ZINF_RETURN_IF_ERROR(Gather(u, /*prefetch=*/false));
    if (u.partitioned) ZINF_RETURN_IF_ERROR(stream_->Wait(*u.gathered_ready));
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(raw.data(), u.partitioned ? u.gathered : u.params, raw.size(), *stream_));
    if (gather) ZINF_RETURN_IF_ERROR(u.released->Record(*stream_));  // DropGathered frees after this copy
    if (gather) ZINF_RETURN_IF_ERROR(DropGathered(u));
    ZINF_RETURN_IF_ERROR(stream_->Synchronize());
    return Cast(arena_, raw.data(), compute_dtype_, host_dst, DType::kFloat32, n);
  }
  const PinnedBuffer& host_buf = kind == StateKind::kMaster   ? u.h_master
                                 : kind == StateKind::kExpAvg ? u.h_exp_avg
                                                              : u.h_exp_avg_sq;
  const void* host_state = host_buf.data();
  std::unique_ptr<float, decltype(&std::free)> swapped(nullptr, &std::free);
  if (nvme_) {  // read the unit's sub-group back from the store
    const size_t g = group_of_unit_[unit];
    ZINF_ASSIGN_OR_RETURN(uint64_t padded, store_->PaddedBytes(g));
    swapped.reset(static_cast<float*>(std::aligned_alloc(4096, padded)));
    if (!swapped) return OutOfMemory("ReadState: " + FormatBytes(padded) + " for a sub-group");
    ZINF_RETURN_IF_ERROR(store_->Read(g, swapped.get()).Wait());
    const int k = kind == StateKind::kMaster ? 0 : kind == StateKind::kExpAvg ? 1 : 2;
    host_state = swapped.get() + offset_in_group_[unit] + k * owned_elems(u);
  }
  float* state = kind == StateKind::kMaster ? u.master : kind == StateKind::kExpAvg ? u.exp_avg : u.exp_avg_sq;
  if (!sharded()) {
    if (offload_) {
      std::memcpy(host_dst, host_state, n * 4);
      return Status::Ok();
    }
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(host_dst, state, n * 4, *stream_));
    return stream_->Synchronize();
  }
  // Sharded: gather every rank's shard on the device (collective).
  const int64_t S = u.part.shard_elems;
  ZINF_ASSIGN_OR_RETURN(void* tmp, Alloc(u.part.padded_elems * 4, "ReadState gather buffer"));
  float* mine = static_cast<float*>(tmp) + u.part.shard_begin(rank_);
  Status s = offload_ ? device_.CopyToDevice(mine, host_state, S * 4, *stream_)
                      : device_.CopyOnDevice(mine, state, S * 4, *stream_);
  if (s.ok()) s = comm_->AllGather(mine, tmp, S, DType::kFloat32, *stream_);
  if (s.ok()) s = device_.CopyToHost(host_dst, tmp, n * 4, *stream_);
  Status sync = stream_->Synchronize();
  Status f = device_.Free(tmp, *stream_);
  if (!s.ok()) return s;
  if (!sync.ok()) return sync;
  return f;
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
    ZINF_RETURN_IF_ERROR(Cast(arena_, master + (begin - first), DType::kFloat32, buf, compute_dtype_, count));
    return SwapFailure(param_store_->Write(u.index, buf).Wait(), SwapKind::kParams);
  }
  if (host_home(u)) return Cast(arena_, master + (begin - first), DType::kFloat32, u.h_shard.data(), compute_dtype_, count);
  std::vector<uint8_t> compute(count * esize);
  ZINF_RETURN_IF_ERROR(Cast(arena_, master + (begin - first), DType::kFloat32, compute.data(), compute_dtype_, count));
  ZINF_RETURN_IF_ERROR(
      device_.CopyToDevice(u.partitioned ? u.shard_params : u.params, compute.data(), compute.size(), *stream_));
  return stream_->Synchronize();
}

namespace {
constexpr int kCheckpointFormat = ckpt::CheckpointReader::kFormat;  // 2: slices 4 KiB-aligned, tensor shapes
constexpr const char* const* kKindNames = ckpt::CheckpointReader::kKindNames;
}  // namespace

// Waits for every request still in flight when it goes out of scope.
struct DrainRequests {
  std::vector<nvme::IoRequest>& requests;
  ~DrainRequests() {
    for (auto& r : requests) {
      if (r.valid()) (void)r.Wait();
    }
  }
};

Result<nvme::IoEngine*> EngineImpl::CheckpointIo() {
  if (io_) return io_.get();
  if (!ckpt_io_) {
    ZINF_ASSIGN_OR_RETURN(ckpt_io_, nvme::IoEngine::Create(nvme::IoEngineOptionsFromConfig(config_)));
  }
  return ckpt_io_.get();
}

Status EngineImpl::AgreeOk(const Status& mine) {
  if (!distributed()) return mine;
  // Each rank contributes 1 + its rank when it failed; the max names one.
  float flag = mine.ok() ? 0.0f : static_cast<float>(rank_ + 1);
  ZINF_ASSIGN_OR_RETURN(void* buf, Alloc(2 * sizeof(float), "checkpoint agreement"));
  float* d = static_cast<float*>(buf);
  Status s = device_.CopyToDevice(d, &flag, sizeof flag, *stream_);
  if (s.ok()) s = comm_->AllReduce(d, d + 1, 1, DType::kFloat32, ReduceOp::kMax, *stream_);
  float worst = 0;
  if (s.ok()) s = device_.CopyToHost(&worst, d + 1, sizeof worst, *stream_);
  Status sync = stream_->Synchronize();
  Status f = device_.Free(buf, *stream_);
  if (!mine.ok()) return mine;
  if (!s.ok()) return s;
  if (!sync.ok()) return sync;
  if (!f.ok()) return f;
  if (worst > 0) {
    return Unavailable("rank " + std::to_string(static_cast<int>(worst) - 1) + " failed (its own error says why)");
  }
  return Status::Ok();
}

Status EngineImpl::WriteShards(const std::string& path, nlohmann::json* table) {
  ZINF_ASSIGN_OR_RETURN(nvme::IoEngine * io, CheckpointIo());
  ZINF_ASSIGN_OR_RETURN(std::shared_ptr<nvme::File> file, ckpt::OpenDataFile(*io, path, /*write=*/true));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::SliceWriter> w, ckpt::SliceWriter::Create(*io, file));
  // NVMe: each sub-group is read once, the next one read ahead in the
  // engine's swap buffers (idle between steps).
  const size_t nb = nvme_bufs_.size();
  std::vector<nvme::IoRequest> reads(nvme_ ? groups_.size() : 0);
  auto read_group = [&](size_t g) {
    if (g < reads.size() && !reads[g].valid()) reads[g] = store_->Read(g, nvme_bufs_[g % nb].data());
  };
  DrainRequests drain{reads};  // never leave a read in flight into the engine's buffers
  std::vector<float> staged;  // offload none: one slice copied off the device
  int64_t current_group = -1;
  uint64_t bytes_out = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& u = units_[i];
    const int64_t begin = u.part.shard_begin(rank_), count = u.part.valid_in_shard(rank_);
    const int64_t at = begin - owned_begin(u);  // the slice's place in the owned range
    const float* src[3] = {nullptr, nullptr, nullptr};
    if (nvme_) {
      const size_t g = group_of_unit_[i];
      if (static_cast<int64_t>(g) != current_group) {
        read_group(g);
        Status r = reads[g].Wait();
        reads[g] = {};
        if (!r.ok()) return r;
        current_group = static_cast<int64_t>(g);
        if (nb > 1) read_group(g + 1);
      }
      const float* base = static_cast<const float*>(nvme_bufs_[g % nb].data()) + offset_in_group_[i];
      for (int k = 0; k < 3; ++k) src[k] = base + k * owned_elems(u) + at;
    } else if (offload_) {
      const PinnedBuffer* h[3] = {&u.h_master, &u.h_exp_avg, &u.h_exp_avg_sq};
      for (int k = 0; k < 3; ++k) src[k] = static_cast<const float*>(h[k]->data()) + at;
    } else {
      const float* d[3] = {u.master, u.exp_avg, u.exp_avg_sq};
      for (int k = 0; k < 3; ++k) src[k] = d[k] + at;
    }
    if (count <= 0) continue;
    const uint64_t bytes = static_cast<uint64_t>(count) * 4;
    for (int k = 0; k < 3; ++k) {
      const float* p = src[k];
      if (!offload_) {  // device memory: through a host copy
        staged.resize(count);
        ZINF_RETURN_IF_ERROR(device_.CopyToHost(staged.data(), p, bytes, *stream_));
        ZINF_RETURN_IF_ERROR(stream_->Synchronize());
        p = staged.data();
      }
      const uint64_t offset = w->BeginSlice();
      ZINF_RETURN_IF_ERROR(w->Append(p, bytes));
      ZINF_ASSIGN_OR_RETURN(uint64_t xxh3, w->EndSlice());
      table->push_back({{"unit", u.name}, {"kind", kKindNames[k]}, {"begin", begin}, {"count", count},
                        {"offset", offset}, {"xxh3", xxh3}});
      bytes_out += bytes;
    }
  }
  ZINF_RETURN_IF_ERROR(w->Finish());
  ZINF_LOG_DEBUG("checkpoint: rank {} wrote {} to {}", rank_, FormatBytes(bytes_out), path);
  return Status::Ok();
}

Result<std::string> EngineImpl::Save(const std::string& dir, const std::string& client_state) {
  ExcludeIo exclude(this);
  // Every check that can fail on one rank alone is agreed on before any
  // rank goes further: no rank is left waiting in a collective.
  auto client = nlohmann::json::parse(client_state, nullptr, false);
  Status prepared = Finalize();
  if (prepared.ok() && micro_in_window_ != 0) {
    prepared = FailedPrecondition("Save between optimizer steps only: " + std::to_string(micro_in_window_) + " of " +
                                  std::to_string(accumulation_) + " micro-steps of this step are done");
  }
  if (prepared.ok()) {
    std::lock_guard lock(mu_);
    prepared = broken_;
  }
  if (prepared.ok() && client.is_discarded()) prepared = InvalidArgument("Save: client_state is not valid JSON");
  if (prepared.ok()) prepared = Synchronize();
  namespace fs = std::filesystem;
  const std::string name = "step-" + std::to_string(boundaries_);
  const std::string tmp = (fs::path(dir) / (name + ".tmp")).string();
  const std::string final_dir = (fs::path(dir) / name).string();
  if (rank_ == 0 && prepared.ok()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    fs::remove_all(tmp, ec);  // left by a save that crashed
    if (!fs::create_directories(tmp, ec) && ec) prepared = IoError("cannot create " + tmp + ": " + ec.message());
  }
  ZINF_RETURN_IF_ERROR(AgreeOk(prepared));
  // A failure from here on removes step-N.tmp: the previous checkpoint and
  // `latest` are untouched.
  auto abandon = [&](const Status& s) -> Status {
    if (rank_ == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    return s;
  };
  // This rank's file: its shard range of every unit, whatever the stage.
  const std::string bin = "rank-" + std::to_string(rank_) + ".bin";
  nlohmann::json table = nlohmann::json::array();
  Status written = WriteShards((fs::path(tmp) / bin).string(), &table);
  if (written.ok()) {
    written = ckpt::WriteFileAtomic((fs::path(tmp) / ("rank-" + std::to_string(rank_) + ".json")).string(),
                                    nlohmann::json{{"file", bin}, {"align", ckpt::kSliceAlign}, {"tensors", table}}.dump(1));
  }
  if (Status all = AgreeOk(written); !all.ok()) return abandon(all);
  Status committed;
  if (rank_ == 0) {
    nlohmann::json units = nlohmann::json::array();
    for (const Unit& u : units_) {
      nlohmann::json params = nlohmann::json::array();
      for (size_t t = 0; t < u.tensor_names.size(); ++t) {
        params.push_back({{"name", u.tensor_names[t]}, {"shape", u.tensor_shapes[t]}, {"offset", u.tensor_offsets[t]}});
      }
      // steps: the updates this unit has had (fewer than steps_applied when
      // some steps did not fetch it).
      units.push_back({{"name", u.name}, {"elements", u.part.num_elems}, {"params", params}, {"steps", u.steps}});
    }
    LossScaler::State ls;
    int64_t steps_applied;
    {
      std::lock_guard lock(mu_);
      ls = scaler_.state();
      steps_applied = steps_applied_;
    }
    nlohmann::json manifest = {
        {"format", kCheckpointFormat},        {"world_size", world_},
        {"stage", stage_},                    {"compute_dtype", std::string(DTypeName(compute_dtype_))},
        {"boundaries", boundaries_},          {"steps_applied", steps_applied},
        {"loss_scale", {{"scale", ls.scale}, {"cur_hysteresis", ls.cur_hysteresis}, {"iter", ls.iter},
                        {"last_overflow_iter", ls.last_overflow_iter}, {"overflows", ls.overflows}}},
        {"units", units},                     {"config", nlohmann::json::parse(config_.ToJson(0), nullptr, false)},
        {"client_state", client}};
    committed = ckpt::WriteFileAtomic((fs::path(tmp) / "manifest.json").string(), manifest.dump(1));
    if (committed.ok()) committed = ckpt::FsyncDir(tmp);
    if (committed.ok()) {
      // Saved at this step before (a save right after a load): the new
      // directory and the old one swap places atomically, so `latest` never
      // names a missing directory; the old one is removed afterwards.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
      } else if (errno != ENOENT || ::rename(tmp.c_str(), final_dir.c_str()) != 0) {
        committed = IoError("rename " + tmp + " -> " + final_dir + ": " + std::strerror(errno));
      }
    }
    if (!committed.ok()) committed = abandon(committed);
    // From here step-N is complete; a failure below leaves `latest` at the
    // previous checkpoint, which is intact.
    if (committed.ok()) committed = ckpt::FsyncDir(dir);
    if (committed.ok()) committed = ckpt::WriteFileAtomic((fs::path(dir) / "latest").string(), name + "\n");
  }
  ZINF_RETURN_IF_ERROR(AgreeOk(committed));
  {
    std::lock_guard lock(mu_);
    last_checkpoint_ = final_dir;
  }
  return final_dir;
}

Status EngineImpl::ReadShards(ckpt::CheckpointReader& reader) {
  using Range = ckpt::CheckpointReader::Range;
  if (nvme_) {
    // A sub-group's [master | m | v] is read straight into a swap buffer
    // (every slice of the sub-group in one read-ahead stream) and written to
    // the store while the next sub-group is read into the next buffer.
    const size_t nb = nvme_bufs_.size();
    std::vector<nvme::IoRequest> writes(nb);
    DrainRequests drain{writes};  // never leave a write in flight from the engine's buffers
    // The compute copies of a sub-group's units run on a helper thread while
    // the next sub-group is read (the disk stays busy); joined before the
    // engine stream is used again here or its buffer is refilled.
    std::thread copier;
    Status copied;
    auto join_copier = [&]() -> Status {
      if (copier.joinable()) copier.join();
      return copied;
    };
    struct JoinCopier {  // on every return path
      std::thread& t;
      ~JoinCopier() {
        if (t.joinable()) t.join();
      }
    } join_on_exit{copier};
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (nb == 1) ZINF_RETURN_IF_ERROR(join_copier());  // the copier reads the buffer about to be refilled
      nvme::IoRequest& previous = writes[g % nb];
      if (previous.valid()) {
        Status s = previous.Wait();
        previous = {};
        ZINF_RETURN_IF_ERROR(s);
      }
      float* buf = static_cast<float*>(nvme_bufs_[g % nb].data());
      std::vector<Range> ranges;
      std::vector<char> whole(groups_[g].units.size(), 0);  // the compute copy is whole here, the master sharded
      for (size_t j = 0; j < groups_[g].units.size(); ++j) {
        const int i = groups_[g].units[j];
        const Unit& u = units_[i];
        const int64_t ob = owned_begin(u), ov = std::max<int64_t>(owned_valid(u), 0), oe = owned_elems(u);
        float* base = buf + offset_in_group_[i];
        for (int k = 0; k < 3; ++k) std::fill(base + k * oe + ov, base + (k + 1) * oe, 0.0f);
        whole[j] = !(u.partitioned || (ob == 0 && ov == u.part.num_elems));
        for (int k = whole[j] ? 1 : 0; k < 3; ++k) ranges.push_back({u.name, k, u.part.num_elems, ob, ov, base + k * oe});
      }
      ZINF_RETURN_IF_ERROR(reader.ReadRanges(ranges));
      ZINF_RETURN_IF_ERROR(join_copier());
      // Units whose whole master is needed: one at a time (memory: one unit).
      for (size_t j = 0; j < groups_[g].units.size(); ++j) {
        if (!whole[j]) continue;
        const int i = groups_[g].units[j];
        Unit& u = units_[i];
        std::vector<float> master(u.part.num_elems);
        ZINF_RETURN_IF_ERROR(reader.ReadRange(u.name, 0, u.part.num_elems, 0, u.part.num_elems, master.data()));
        const int64_t ov = owned_valid(u);
        if (ov > 0) std::memcpy(buf + offset_in_group_[i], master.data() + owned_begin(u), ov * 4);
        ZINF_RETURN_IF_ERROR(WriteComputeCopy(u, master.data(), 0));
      }
      writes[g % nb] = store_->Write(g, buf);
      copier = std::thread([this, g, buf, whole = std::move(whole), &copied] {
        for (size_t j = 0; j < groups_[g].units.size() && copied.ok(); ++j) {
          if (whole[j]) continue;
          const int i = groups_[g].units[j];
          copied = WriteComputeCopy(units_[i], buf + offset_in_group_[i], owned_begin(units_[i]));
        }
      });
    }
    ZINF_RETURN_IF_ERROR(join_copier());
    for (auto& w : writes) {
      if (!w.valid()) continue;
      Status s = w.Wait();
      w = {};
      ZINF_RETURN_IF_ERROR(s);
    }
    return Status::Ok();
  }
  std::vector<float> state[3];
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    const int64_t ob = owned_begin(u), ov = owned_valid(u);
    // The master covers the whole unit where its compute copy is whole here.
    const int64_t first[3] = {u.partitioned ? ob : 0, ob, ob};
    const int64_t len[3] = {u.partitioned ? ov : u.part.num_elems, ov, ov};
    std::vector<Range> ranges;
    for (int k = 0; k < 3; ++k) {
      state[k].assign(std::max<int64_t>(len[k], 0), 0.0f);
      ranges.push_back({u.name, k, u.part.num_elems, first[k], std::max<int64_t>(len[k], 0), state[k].data()});
    }
    ZINF_RETURN_IF_ERROR(reader.ReadRanges(ranges));
    // Place the owned range where the state lives.
    const float* owned[3] = {state[0].data() + (ob - first[0]), state[1].data(), state[2].data()};
    if (ov > 0) {
      if (offload_) {
        PinnedBuffer* dst[3] = {&u.h_master, &u.h_exp_avg, &u.h_exp_avg_sq};
        for (int k = 0; k < 3; ++k) std::memcpy(dst[k]->data(), owned[k], ov * 4);
      } else {
        float* dst[3] = {u.master, u.exp_avg, u.exp_avg_sq};
        for (int k = 0; k < 3; ++k) ZINF_RETURN_IF_ERROR(device_.CopyToDevice(dst[k], owned[k], ov * 4, *stream_));
      }
    }
    ZINF_RETURN_IF_ERROR(WriteComputeCopy(u, state[0].data(), first[0]));
  }
  return Status::Ok();
}

Result<std::string> EngineImpl::Load(const std::string& path) {
  ExcludeIo exclude(this);
  // Every check that can fail on one rank alone (a path only some ranks
  // see, a damaged table) is agreed on before any rank reads state.
  std::unique_ptr<ckpt::CheckpointReader> reader;
  auto prepare = [&]() -> Status {
    {
      std::lock_guard lock(mu_);
      if (!broken_.ok() && !broken_by_load_) {
        return FailedPrecondition("this engine stopped after an I/O failure during a step (" + broken_.message() +
                                  "): create a new engine and load the checkpoint there");
      }
    }
    ZINF_RETURN_IF_ERROR(Finalize());
    ZINF_RETURN_IF_ERROR(Synchronize());
    ZINF_ASSIGN_OR_RETURN(nvme::IoEngine * io, CheckpointIo());
    ZINF_ASSIGN_OR_RETURN(reader, ckpt::CheckpointReader::Open(*io, path));
    try {
      // The units must be the same (names and sizes); list every difference.
      std::string diffs;
      const auto& saved = reader->manifest().at("units");
      if (saved.size() != units_.size()) {
        diffs += " the checkpoint has " + std::to_string(saved.size()) + " units, this engine " +
                 std::to_string(units_.size()) + ";";
      }
      for (size_t i = 0; i < std::min<size_t>(saved.size(), units_.size()); ++i) {
        const std::string sname = saved[i].at("name");
        const int64_t selems = saved[i].at("elements");
        if (sname != units_[i].name || selems != units_[i].part.num_elems) {
          diffs += " unit " + std::to_string(i) + " is '" + sname + "' (" + std::to_string(selems) +
                   " elements) there, '" + units_[i].name + "' (" + std::to_string(units_[i].part.num_elems) +
                   ") here;";
        }
      }
      if (!diffs.empty()) {
        return InvalidArgument("checkpoint " + reader->dir() + " does not match the registered units:" + diffs);
      }
    } catch (const nlohmann::json::exception& e) {
      return DataLoss(reader->dir() + "/manifest.json: malformed (" + std::string(e.what()) + ")");
    }
    return Status::Ok();
  };
  ZINF_RETURN_IF_ERROR(AgreeOk(prepare()));
  const std::string& ckpt_dir = reader->dir();
  const nlohmann::json& manifest = reader->manifest();
  const std::string manifest_path = ckpt_dir + "/manifest.json";
  try {
    // A failure part-way leaves this rank's state mixed: no steps until a
    // Load succeeds.
    if (Status s = AgreeOk(ReadShards(*reader)); !s.ok()) {
      std::lock_guard lock(mu_);
      broken_ = Status(s.code(), "Load from " + ckpt_dir + " failed part-way, the engine's state is mixed (load a "
                                 "checkpoint again): " + s.message());
      broken_by_load_ = true;
      return s;
    }
    const auto& ls = manifest.at("loss_scale");
    std::lock_guard lock(mu_);
    broken_ = Status::Ok();
    broken_by_load_ = false;
    scaler_.Restore({ls.at("scale").get<double>(), ls.at("cur_hysteresis").get<int64_t>(), ls.at("iter").get<int64_t>(),
                     ls.at("last_overflow_iter").get<int64_t>(), ls.at("overflows").get<int64_t>()});
    steps_applied_ = manifest.at("steps_applied").get<int64_t>();
    const auto& saved_units = manifest.at("units");
    for (size_t i = 0; i < units_.size(); ++i) {
      units_[i].steps = saved_units[i].value("steps", steps_applied_);
    }
    boundaries_ = manifest.at("boundaries").get<int64_t>();
    decision_pending_ = false;
    micro_in_window_ = 0;
    last_checkpoint_ = ckpt_dir;
    return manifest.at("client_state").dump();
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(manifest_path + " or a rank table: malformed (" + std::string(e.what()) + ")");
  }
}

}  // namespace

std::string StepStats::ToString() const {
  std::string out = "step " + std::to_string(step);
  if (skipped) out += " SKIPPED (overflow)";
  char buf[256];
  std::snprintf(buf, sizeof buf, " | lr %.3g grad_norm %.4g", lr, grad_norm);
  out += buf;
  if (clip_coef < 1) {
    std::snprintf(buf, sizeof buf, " (clipped x%.3g)", clip_coef);
    out += buf;
  }
  if (loss_scale != 1 || next_loss_scale != 1) {
    std::snprintf(buf, sizeof buf, " loss_scale %g", loss_scale);
    out += buf;
    if (next_loss_scale != loss_scale) {
      std::snprintf(buf, sizeof buf, "->%g", next_loss_scale);
      out += buf;
    }
  }
  std::snprintf(buf, sizeof buf, " | optimizer %.1f ms, comm %.1f ms, copies %.1f ms, nvme waits %.1f ms, compute stalled %.1f ms",
                optimizer_seconds * 1e3, comm_seconds * 1e3, copy_seconds * 1e3, io_seconds * 1e3, stall_seconds * 1e3);
  out += buf;
  if (!longest_stall.empty()) out += " (longest: " + longest_stall + ")";
  if (nvme_bytes_read + nvme_bytes_written > 0) {
    out += " | nvme read " + FormatBytes(nvme_bytes_read) + ", written " + FormatBytes(nvme_bytes_written);
  }
  if (copy_bytes > 0) out += " | host<->device " + FormatBytes(copy_bytes);
  if (fetches > 0) out += " | prefetched " + std::to_string(prefetch_hits) + "/" + std::to_string(fetches) + " gathers";
  for (const Collective& c : collectives) {
    out += " | " + c.kind + " " + std::to_string(c.calls) + "x " + FormatBytes(c.bytes);
  }
  out += " | device " + FormatBytes(device_bytes_in_use);
  if (host_pinned_bytes > 0) out += ", host pinned " + FormatBytes(host_pinned_bytes);
  return out;
}

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
  if (z.stage >= 2 && z.reduce_bucket_size < kNormBlock) {
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
  ZINF_ASSIGN_OR_RETURN(BatchSizes batch, ResolveBatchSizes(config, world));
  const OptimizerConfig& oc = config.optimizer;
  AdamOptions adam;
  adam.lr = oc.lr;
  adam.beta1 = oc.beta1;
  adam.beta2 = oc.beta2;
  adam.eps = oc.eps;
  adam.weight_decay = oc.weight_decay;
  adam.bias_correction = oc.bias_correction;
  adam.mode = oc.decoupled_weight_decay() ? AdamMode::kAdamW : AdamMode::kAdam;
  if (auto c = MakeAdamStepConstants(adam, 1, 1.0); !c.ok()) return c.status().WithContext("optimizer.params");
  ZINF_ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(config.scheduler, oc.lr));
  ZINF_ASSIGN_OR_RETURN(LossScaler scaler, LossScaler::Create(config.fp16));
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
  auto engine = std::make_unique<EngineImpl>(config, device, comm, batch.gradient_accumulation_steps,
                                             std::move(schedule), std::move(scaler), adam, compute, threads);
  ZINF_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace zinf
