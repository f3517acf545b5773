// The zinf engine: owns a model's parameters, gradients and optimizer state,
// partitions them across ranks (ZeRO stages 0 to 3) and runs mixed-
// precision Adam/AdamW at each gradient-accumulation boundary.
//
// A client registers its parameters grouped into units (a layer, like an
// FSDP unit) before its first micro-step. Then, per micro-step and unit:
//
//   Fetch(u, s)       device pointers to u's compute copy, valid for work the
//                     client enqueues on stream s afterwards (s waits on an
//                     event for u's last update; the host never blocks). The
//                     gradient buffers of u are free for writing by that work
//                     too: the engine has finished reading them.
//   GradBuffers(u)    where backward writes u's gradients (fp32, overwritten
//                     each micro-step: the engine accumulates). With ZeRO
//                     stage 3 a partitioned unit's buffer is device memory
//                     only from this call to its reduction after GradsReady:
//                     call it in each micro-step, once backward is near
//                     (after or just before u's backward Fetch); a
//                     GradsReady without it means zero gradients.
//   GradsReady(u, s)  after backward's writes to u's gradients on s.
//   Release(u, s)     after the last use of u's parameters on s.
//   Step()            once per micro-step, after the GradsReady of every unit
//                     fetched in it; at the accumulation boundary it enqueues
//                     the optimizer.
//
// A unit not fetched in any micro-step of an optimizer step has no gradient
// there: it is left out of the norm and not updated (master, m and v stay),
// and its own Adam step count (bias correction) does not advance — as an
// optimizer treats a parameter whose gradient is None.
//
// Nothing here blocks the host except Synchronize, Stats(boundary), ReadState,
// checkpoints and — for fp16 with dynamic loss scaling — loss_scale(), which
// waits for the previous step's overflow decision (as every fp16 trainer
// must). In steady state a training loop needs none of them: Step() returns
// once the step is enqueued, and Stats() reports the latest step that has
// finished without waiting.
//
// Numerics (the same bits whatever the stage, for the same ranks and data):
// gradients are reduced across ranks in fp32 at every micro-step, summed in
// rank order (the deterministic collectives), and accumulated in fp32 in
// micro-step order. The global norm is the sum of per-64Ki-element-block
// partials taken in global block order (unit by unit), so the same partials
// come out however the units are sharded. Clipping, 1/loss_scale and the mean
// over ranks × accumulation steps fold into one gradient scale applied by the
// one documented Adam sequence (math/adam_math.h). A step whose gradients hold
// an inf or NaN on any rank is skipped on every rank.
//
// Thread-safety: one client thread drives an engine; its streams may be any.
// Every rank must make the same calls in the same order (collectives).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zinf/config.h"
#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

class Communicator;  // src/common/communicator.h; null means one rank

// One parameter tensor. Initial values are host memory in `dtype`; every
// rank must pass the same values. The engine keeps an fp32 master copy and a
// compute copy in the config's precision (bf16, fp16 or fp32).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;  // of `init`
  const void* init = nullptr;     // product(shape) elements; null = zeros
  // The parameter group whose hyper-parameters the optimizer applies to
  // this tensor (Engine::AddParamGroup); 0 is the config's.
  int group = 0;
};

// A parameter group: the hyper-parameters of a set of tensors that differ
// from the config's optimizer.params, as torch's param_groups carry them
// (HF Trainer: no weight decay on biases and norm weights).
struct ParamGroupOptions {
  double weight_decay = 0;  // replaces optimizer.params.weight_decay for the group's tensors
  // The group's own lr, replacing the schedule's (the config's scheduler, or
  // optimizer.params.lr) from the next boundary on; < 0: follow the schedule.
  double lr = -1;
};

// How a unit is kept.
struct UnitOptions {
  // Frozen: parameters that do not train (requires_grad false, as PEFT
  // leaves a base model). The unit keeps only its compute copy, on the tier
  // and partition its parameters would have, with no gradient buffers,
  // master or optimizer state; it is fetched and released as any unit, and
  // has no GradBuffers or GradsReady. Its compute copy is its value
  // everywhere (ReadState's kMaster, checkpoints): it stays exactly what
  // registration rounded it to.
  bool frozen = false;
};

// A unit's buffers on the device: the unit's tensors packed back to back in
// registration order (no padding between them), then zero padding up to the
// partition size.
struct UnitPointers {
  void* data = nullptr;  // the first tensor
  DType dtype = DType::kFloat32;
  int64_t num_elems = 0;  // sum of the tensors' elements
  // One pointer per tensor, into `data`. The array is the engine's and stays
  // as returned until the engine is destroyed: a later call that returns
  // another address (a stage-3 unit gathered elsewhere) returns another array.
  std::span<void* const> tensors;
};

// What the optimizer state readers return (each widened to fp32).
enum class StateKind { kMaster, kExpAvg, kExpAvgSq, kComputeParams };

// One piece of work on the engine's timeline, in seconds since the
// timeline's origin (the engine's first Fetch, on the host's steady clock;
// device work is placed by timing events measured from an event recorded
// at that origin). Lanes:
//   "compute"    the caller's work, as it traced it (Engine::Trace)
//   "stall"      a caller's stream waiting at a Fetch; `what` starts with
//                the cause ("optimizer", "disk", "comm", "copy") and names
//                the unit
//   "optimizer"  a unit's update (host Adam, or its device kernels)
//   "nvme wait"  an engine task waiting for sub-group or shard I/O
//   "disk"       the NVMe I/O engines busy (at least one request in flight)
//   "copy"       host<->device copies and bucket packing
//   "comm"       collectives
// A caller may trace lanes of its own. On CUDA a device span's place comes
// from cudaEventElapsedTime since the origin, a float of milliseconds: its
// resolution coarsens as the run goes on (about 0.2 ms after an hour), while
// each span's length stays exact to the event's resolution.
struct TimelineSpan {
  std::string lane, what;
  double start = 0, end = 0;
};

// The per-step metrics. Times are seconds within the step's window (from the
// previous boundary to this one's last update; when the host runs a step
// ahead, a timing taken early in the next step may fall in this one). The
// decision's figures (lr, norm, clipping, skip, loss scale) are exactly
// this boundary's.
struct StepStats {
  int64_t step = 0;            // optimizer steps applied so far (skips excluded)
  int64_t boundary = 0;        // accumulation boundaries so far (skips included)
  bool skipped = false;        // overflow: the step was not applied
  double loss_scale = 1;       // the scale the step's gradients carried
  double next_loss_scale = 1;  // the scale for the next micro-steps
  double lr = 0;
  double grad_norm = 0;  // global L2 norm of the mean unscaled gradient (inf/NaN on overflow)
  double clip_coef = 1;  // applied multiplier (1 when not clipping)
  double optimizer_seconds = 0;
  double comm_seconds = 0;  // collectives on the engine stream
  double copy_seconds = 0;  // bucket packing and other device copies
  double io_seconds = 0;    // NVMe offload: waiting for sub-group and parameter-shard reads and writes
  // Bytes the step moved: read from and written to NVMe by the engine's
  // I/O (optimizer state and parameter shards; checkpoints not counted),
  // and copied between host and device memory (offloaded gradients down,
  // shards and new parameters up).
  // With stage 3 gathers overlapping the previous step's updates, a step's
  // first shard reads may fall in the previous step's figures; the totals
  // since the engine started are exact.
  uint64_t nvme_bytes_read = 0, nvme_bytes_written = 0, copy_bytes = 0;
  uint64_t nvme_bytes_read_total = 0, nvme_bytes_written_total = 0;
  double stall_seconds = 0;   // the client's streams waiting on the engine
  std::string longest_stall;  // what the longest wait was for ("" when none)
  // The client streams' waits that were not hidden, by unit and cause:
  // "optimizer" (the unit's update), "disk" (its update, with the optimizer
  // state on NVMe, or its shard read from NVMe), "comm" (its gradient
  // reduction or all-gather), "copy" (its shard coming up from pinned host
  // memory).
  struct Stall {
    std::string unit, cause;
    int64_t count = 0;
    double seconds = 0;
  };
  std::vector<Stall> stalls;
  // Stage 3: gathers for the client's Fetch calls, and how many of them were
  // already issued ahead (prefetched along the recorded order, or kept since
  // an earlier use within stage3_max_reuse_distance).
  int64_t fetches = 0;
  int64_t prefetch_hits = 0;
  struct Collective {
    std::string kind;  // "all_reduce", "reduce_scatter", "all_gather"
    int64_t calls = 0;
    uint64_t bytes = 0;  // payload per rank (the full buffer the call covers)
  };
  std::vector<Collective> collectives;
  uint64_t device_bytes_in_use = 0;
  uint64_t host_pinned_bytes = 0;       // offload: pinned host memory held now
  uint64_t host_peak_pinned_bytes = 0;  // and at most so far
  // The step's timeline: the spans of work enqueued in its window (the
  // caller's compute and stalls, collectives, copies) or run by the engine
  // while it was open (updates, NVMe). A step's updates overlap the next
  // step's compute: to look at a stretch of time, take the spans of the
  // steps around it too. At most 16384 spans a step; timeline_dropped
  // counts the rest.
  std::vector<TimelineSpan> timeline;
  int64_t timeline_dropped = 0;
  // From Stats(): boundaries enqueued after this one that had not finished
  // when it was read (0: this is the latest boundary).
  int64_t behind = 0;
  std::string ToString() const;  // the one-line summary the logger prints
};

class Engine {
 public:
  // Validates the config for this device and rank count (a stage or option
  // the engine cannot honour is an error naming the key and what to set).
  // `comm` (may be null: one rank) and `device` must outlive the engine.
  static Result<std::unique_ptr<Engine>> Create(const Config& config, Device& device, Communicator* comm = nullptr);
  virtual ~Engine() = default;

  // Registers a unit; returns its index. Only before the first Fetch.
  virtual Result<int> AddUnit(const std::string& name, const std::vector<ParamSpec>& params) = 0;
  // The same with options (a frozen unit).
  virtual Result<int> AddUnit(const std::string& name, const std::vector<ParamSpec>& params,
                              const UnitOptions& options) = 0;
  // A parameter group for ParamSpec::group; returns its index (1, 2, ...).
  // Only before the first Fetch. kInvalidArgument for a weight decay that is
  // negative or not finite.
  virtual Result<int> AddParamGroup(const ParamGroupOptions& options) = 0;
  // Sets group `group`'s lr for the boundaries enqueued from now on (< 0:
  // follow the schedule again); group 0 is the config's. Every rank must
  // set the same. kInvalidArgument for an unknown group or an lr that is
  // not finite.
  virtual Status SetGroupLr(int group, double lr) = 0;
  virtual int num_units() const = 0;
  // The unit's elements (its tensors' sum).
  virtual Result<int64_t> unit_elems(int unit) const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int zero_stage() const = 0;
  virtual DType compute_dtype() const = 0;
  virtual int64_t gradient_accumulation_steps() const = 0;
  // Threads of the CPU optimizer's arena: zinf.optimizer_threads, or by
  // default the machine's hardware threads divided by the ranks on it.
  virtual int optimizer_threads() const = 0;

  virtual Result<UnitPointers> Fetch(int unit, Stream& stream) = 0;
  virtual Result<UnitPointers> GradBuffers(int unit) = 0;
  virtual Status GradsReady(int unit, Stream& stream) = 0;
  virtual Status Release(int unit, Stream& stream) = 0;
  // Ends a micro-step; true when it was a boundary and the optimizer step
  // was enqueued (it runs asynchronously).
  virtual Result<bool> Step() = 0;
  // Times the work `enqueue` puts on `stream` (by a timing event before
  // and one after: no host code on the stream) and adds it to the current
  // step's timeline in `lane` as `what` — the caller's compute ("compute"),
  // so that StepStats::timeline shows it beside the engine's work. The
  // span lands once both events completed; before the first Fetch (no
  // origin yet) the work is enqueued untimed.
  virtual Status Trace(Stream& stream, const std::string& lane, const std::string& what,
                       const std::function<Status()>& enqueue) = 0;
  // Trace in two calls, for work that is not one call (a framework's
  // hooks): TraceBegin records the start on `stream` and returns a token
  // (0 before the first Fetch: then TraceEnd times nothing); TraceEnd
  // records the end and adds the span. kInvalidArgument for a token that is
  // not open; at most 4096 open at once.
  virtual Result<int64_t> TraceBegin(Stream& stream) = 0;
  virtual Status TraceEnd(int64_t token, Stream& stream, const std::string& lane, const std::string& what) = 0;
  // This micro-step's loss (before the loss scale), for the engine's checks;
  // call it before Step. With zinf.stop_on_nonfinite_loss a NaN or infinite
  // loss fails with kFailedPrecondition and the engine takes no further
  // steps (Step, Save and Load refuse, as after a swap failure: a new
  // engine loads the last complete checkpoint); with several ranks every
  // rank stops, naming this one.
  // Without the key it only checks the engine's health.
  virtual Status ReportLoss(double loss) = 0;

  // The factor backward multiplies the loss by (fp16: the dynamic loss
  // scale; otherwise 1).
  virtual Result<float> loss_scale() = 0;
  // Waits for everything the engine enqueued; returns the first error.
  virtual Status Synchronize() = 0;
  // The metrics of the latest boundary whose step has finished, without
  // waiting for the device: StepStats::behind says how many boundaries
  // enqueued since have not finished yet. It waits only while no boundary
  // has finished and one is enqueued (the first step); before any boundary
  // it is kFailedPrecondition.
  virtual Result<StepStats> Stats() = 0;
  // The metrics of boundary `boundary` (StepStats::boundary: counted from
  // the start of training, across checkpoints), waiting until that step has finished and for
  // nothing after it. The last 64 boundaries are kept; an older or not yet
  // enqueued one is kOutOfRange.
  virtual Result<StepStats> Stats(int64_t boundary) = 0;
  // The whole unit's state as fp32 (num_elems values) into host memory.
  // Collective in stages 1 and 2 (the shards are gathered): every rank calls.
  virtual Status ReadState(int unit, StateKind kind, float* host_dst) = 0;
  // Sets the whole unit's parameters from fp32 host memory (num_elems
  // values, every rank the same): the master of the owned range and the
  // compute copy (its rounding; a frozen unit's is all it keeps). Adam's m
  // and v and the step counts stay. Between optimizer steps only. kind must
  // be kMaster.
  virtual Status WriteState(int unit, StateKind kind, const float* host_src) = 0;
  // Copies `bytes` of host memory from rank `root`'s `host` into every
  // other rank's (root's is read only), through the engine's communicator,
  // after everything the engine enqueued has run. Collective: every rank
  // calls with the same `bytes` and `root`; between optimizer steps only.
  // It returns on every rank only once every rank has joined, so with
  // `bytes` 0 it is a barrier. One rank: nothing to copy.
  virtual Status Broadcast(void* host, size_t bytes, int root) = 0;

  // Checkpoints, between optimizer steps only (at an accumulation boundary);
  // collective: every rank calls. Save writes `dir`/step-N/ atomically: each
  // rank writes its shard of every unit's fp32 master, m and v (the 16-bit
  // compute copy is their rounding and is rebuilt on load) into
  // step-N.tmp/rank-R.bin with a rank-R.json table (unit, kind, element
  // range, byte offset, XXH3); after a barrier rank 0 writes manifest.json
  // (format, config, world size, stage, step counters, loss-scale state,
  // `client_state`), fsyncs files and directory, renames step-N.tmp to
  // step-N and atomically replaces `dir`/latest. A crash at any moment
  // leaves the previous checkpoint intact. Returns the checkpoint's path.
  virtual Result<std::string> Save(const std::string& dir, const std::string& client_state = "{}") = 0;
  // Restores a checkpoint saved by Save (`path` is a step-N directory, or
  // `dir`/latest is followed when `path` is the parent holding it) into an
  // engine whose units are registered identically (names and sizes); any
  // stage, offload tier or world size. Every checksum is verified: a
  // mismatch or a truncated file is kDataLoss naming the tensor and file.
  // Returns the saved client_state.
  virtual Result<std::string> Load(const std::string& path) = 0;
};

}  // namespace zinf
