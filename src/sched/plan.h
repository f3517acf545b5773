// `zinf plan`: what a training run needs per rank, on each tier, for every
// ZeRO stage × offload combination, and how long a step should take.
//
// The memory is counted the way the engine (src/sched/engine.cc) allocates
// it, not only by the ZeRO formulas of state_bytes.h (which are kept in each
// row for reference): per unit, with P = its elements padded to whole
// 64 Ki-element norm blocks × ranks and S = P / ranks (partition.h), and each
// allocation rounded to its allocator's size class (DeviceAllocator::RoundUp
// on the device, PinnedPool::SizeClassBytes on the host):
//   device  compute copy P (S for stage-3 units above the persistence
//           threshold, plus the gathered copies: those the client holds at
//           once and the prefetch/reuse window, at most
//           stage3_max_live_parameters plus one unit), fp32
//           gradients P, and without optimizer offload the fp32 accumulator
//           (P in stages 0/1, S in 2/3) and master/m/v 12 B × owned (P in
//           stage 0, S otherwise); the stage 2/3 reduce bucket when several
//           units share one; with NCCL (reductions_on_device) the
//           largest gradient reduction's staging, (ranks - 1) × its
//           per-rank share × 4 B; norm partials; the model's activations and
//           batch buffers.
//   host    (pinned) offload cpu: master/m/v + accumulator 16 B × owned, one
//           unit's gradient staging, buffer_count (>= 2) parameter slots;
//           nvme: the accumulator 4 B × owned, the staging and slots, and
//           buffer_count swap buffers (at most one per sub-group), each
//           12 B × the largest sub-group cycling through it.
//   nvme    12 B × owned per sub-group, in whole 1 MiB extents.
// offload_param cpu (stage 3) moves the partitioned units' shards to pinned
// host memory; without optimizer offload one shard-sized device scratch
// carries each new shard home. offload_param nvme keeps shards in pinned
// host memory while they add up to max_in_cpu elements (registration order)
// and puts the others in the parameter store, with two pinned staging
// buffers of the largest such shard (4 KiB-rounded: the gathers' and the
// updates'); a shard larger than buffer_size makes the row not runnable.
//
// The step time is a sum of stated terms from measured (or default) rates:
// compute = FLOPs / GFLOP/s, the engine's copies and passes over gradients
// at a copy bandwidth, collectives at a communication bandwidth, and the
// optimizer — Adam at its bandwidth, or with NVMe max(Adam, read + write of
// the 12 B/param state and write of the new shards on NVMe), since the
// pipeline overlaps them. With shards on NVMe, each gather reads its shard
// ahead of compute (prefetch): compute becomes max(compute, shard reads).
//
// Thread-safety: pure functions over plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/plan_model.h"
#include "sched/state_bytes.h"
#include "zinf/config.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::sched {

// N parameters with no model shape: `units` equal units (the last one takes
// the remainder), no activations; with tokens > 0 the compute is 6 N tokens.
Result<PlanModel> PlanParamsModel(int64_t num_params, int units = 24, int64_t tokens_per_micro_step = 0);

// A rate and where it came from ("default: ..." or the file it was read from).
struct PlanRate {
  double value = 0;
  std::string source;
};

struct PlanRates {
  // Adam's rate and the bytes per parameter it was measured at (28: fp32
  // params, m, v read and written, fp32 gradient read); the engine's Adam
  // also writes the compute copy, so its time scales by (28 + copy) / this.
  PlanRate adam_params_per_s{25e9 / 28, "default: the in-place update bound of ~25 GB/s on 2 threads at 28 B/param"};
  double adam_bytes_per_param = 28;
  PlanRate nvme_read_gbps{2.0, "default: 2 GB/s"};
  PlanRate nvme_write_gbps{3.0, "default: 3 GB/s"};
  PlanRate model_gflops{40.0, "default: 40 GFLOP/s"};
  PlanRate copy_gbps{10.0, "default: 10 GB/s (HostDevice copies are memcpys)"};
  PlanRate comm_gbps{5.0, "default: 5 GB/s bus bandwidth"};
};

// Reads a rate from the JSON a zinf command printed; errors name the file.
// `zinf bench adam --json`: the row with the most threads (params_per_s).
Status ApplyAdamJson(const std::string& json_text, const std::string& source, PlanRates& rates);
// `zinf aio sweep --json` (the recommended point's read and write GB/s) or
// `zinf aio read|write --json` (its median; one file sets one direction).
Status ApplyAioJson(const std::string& json_text, const std::string& source, PlanRates& rates);
// `zinf bench model --json`: the "step" phase's GFLOP/s.
Status ApplyModelJson(const std::string& json_text, const std::string& source, PlanRates& rates);

struct PlanInput {
  Config config;  // stage and offload are overridden per row; the rest applies
  int world_size = 1;
  // The communicator's reductions stage on the device (NCCL, on a CUDA
  // device with several ranks): the largest one's staging is counted.
  bool reductions_on_device = false;
  // The CPU device (the host addresses its memory): with optimizer offload
  // and zinf.offload_zero_copy, no staging, and no accumulators where the
  // gradients stay in place.
  bool host_device = false;
  PlanModel model;
  PlanRates rates;
  int64_t gradient_accumulation_steps = 1;
  // Capacities per rank; 0 = unknown (not checked).
  uint64_t device_memory = 0;
  uint64_t host_memory = 0;
  uint64_t nvme_free = 0;
};

struct PlanItem {
  std::string what;
  uint64_t bytes = 0;
};

struct PlanRow {
  int stage = 0;
  OffloadDevice optimizer = OffloadDevice::kNone;
  OffloadDevice param = OffloadDevice::kNone;
  bool runnable = true;
  std::string note;  // why not runnable, or what to know
  uint64_t device_bytes = 0, host_bytes = 0, nvme_bytes = 0;
  std::vector<PlanItem> device_items, host_items, nvme_items;
  StateBytes zero_formula;  // the plain model-state formula, for comparison
  bool fits_device = true, fits_host = true, fits_nvme = true;
  bool fits() const { return fits_device && fits_host && fits_nvme; }
  // Seconds per optimizer step (gradient_accumulation_steps micro-steps).
  // param_read_s: the shard reads of gathers (offload_param nvme), which
  // prefetch overlaps with compute; nvme_s: the boundary's NVMe traffic.
  double compute_s = 0, copy_s = 0, comm_s = 0, optimizer_s = 0, nvme_s = 0, param_read_s = 0, step_s = 0;
};

// The engine's pinned host budget: zinf.host_memory, else the machine's
// physical memory.
uint64_t PinnedBudgetBytes(const Config& config);
// The directory whose free space bounds the NVMe tier: the first nvme_path
// of offload_optimizer when it goes to NVMe, else of offload_param when it
// does, else whichever is set ("" when none is).
std::string PlanNvmePath(const Config& config);
// Free bytes for an unprivileged writer at `path` (statvfs).
Result<uint64_t> FreeBytesAt(const std::string& path);

// One combination, with input.config's other settings.
PlanRow PlanCombination(const PlanInput& input, int stage, OffloadDevice optimizer, OffloadDevice param);
// Every stage 0..3 × optimizer none/cpu/nvme (× param none/cpu/nvme at stage 3).
std::vector<PlanRow> PlanAll(const PlanInput& input);

// The JSON object `zinf plan --json` prints.
std::string PlanToJson(const PlanInput& input, const std::vector<PlanRow>& rows);

}  // namespace zinf::sched
