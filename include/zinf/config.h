// zinf's configuration, loaded from a DeepSpeed-style JSON file so that a
// user's existing `zero_optimization` block works unchanged.
//
// Policy (see README "Configuration"): keys zinf implements are checked
// strictly — a wrong type or range is an error naming the JSON path, what was
// found and what is accepted. Known DeepSpeed keys zinf does not implement are
// a warning (logged once), or an error when ignoring them would change the
// result. Unknown keys are an error with a "did you mean" suggestion.
// zinf-only keys live under a top-level "zinf" block. Defaults are DeepSpeed's
// runtime defaults (deepspeed/runtime/zero/config.py, offload_config.py).
//
// Thread-safety: Config is a plain value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

enum class OffloadDevice { kNone, kCpu, kNvme };
enum class OptimizerType { kAdam, kAdamW };
enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };
enum class AioBackend { kAsyncIo, kPosix };

std::string_view OffloadDeviceName(OffloadDevice d);  // "none", "cpu", "nvme"
std::string_view OptimizerTypeName(OptimizerType t);  // "Adam", "AdamW"
std::string_view SchedulerTypeName(SchedulerType t);  // "none", "WarmupLR", ...

// zero_optimization.offload_param
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::vector<std::string> nvme_path;  // one or more directories; extents are striped across them
  int64_t buffer_count = 5;
  int64_t buffer_size = 100'000'000;   // elements
  int64_t max_in_cpu = 1'000'000'000;  // elements
  bool pin_memory = false;
};

// zero_optimization.offload_optimizer
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::vector<std::string> nvme_path;
  int64_t buffer_count = 4;
  bool pin_memory = false;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;
};

// zero_optimization. Bucket and threshold sizes are in elements, as in DeepSpeed.
struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500'000'000;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;  // DeepSpeed's dynamic default: true for stage 3, false otherwise
  int64_t sub_group_size = 1'000'000'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_model_persistence_threshold = INT64_MAX;  // sys.maxsize
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
};

// aio: the NVMe I/O engine. DeepSpeed's names; thread_count is accepted as
// an alias of intra_op_parallelism.
struct AioConfig {
  int64_t block_size = 1'048'576;  // bytes
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
  AioBackend io_backend = AioBackend::kAsyncIo;
};

struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;  // 0 = dynamic loss scaling
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
};

// optimizer. Defaults are DeepSpeed's FusedAdam defaults. As in DeepSpeed,
// type "Adam" uses decoupled weight decay (AdamW) unless adam_w_mode is false.
struct OptimizerConfig {
  bool present = false;  // false: no "optimizer" block, the trainer supplies one
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true;
  // Resolved: decoupled (AdamW) or L2 (classic Adam) weight decay.
  bool decoupled_weight_decay() const { return type == OptimizerType::kAdamW || adam_w_mode; }
};

// scheduler. Defaults are DeepSpeed's lr_schedules.py defaults.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  double warmup_min_lr = 0.0;       // WarmupLR, WarmupDecayLR
  double warmup_max_lr = 0.001;     // WarmupLR, WarmupDecayLR
  int64_t warmup_num_steps = 1000;  // all three
  WarmupType warmup_type = WarmupType::kLog;
  int64_t total_num_steps = 0;    // WarmupDecayLR, WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 0.0001;  // WarmupCosineLR
};

// Options of zinf's own, under the top-level "zinf" block.
struct ZinfAioConfig {
  int64_t rings = 0;          // io_uring rings, one worker thread each; 0 = intra_op_parallelism
  bool fixed_buffers = true;  // register pinned buffers with the ring
  bool sqpoll = false;        // kernel submission-queue polling thread (costs a core)
  bool buffered = false;      // page-cache I/O instead of O_DIRECT
  // offload_optimizer nvme: sub-group swaps in phases — a batch of
  // buffer_count reads, then their writes — instead of reads and writes in
  // flight together (a disk serves a pure stream faster than a mix).
  bool phased_swaps = true;
};

// offload_optimizer nvme: where each unit's accumulated fp32 gradient
// lives between backward and its update. kAuto: pinned host memory while
// zinf.host_memory allows (the first units first), the swap store for the
// rest; kNvme: every unit's in the swap store; kHost: every unit's in host memory.
enum class GradientHome { kAuto, kHost, kNvme };

// The model's attention: kPlain keeps the T × T probabilities for backward,
// kFlash (blocked, online softmax) keeps one value per row; kAuto is flash
// when the products take bf16 operands and the head size is 64 or 128.
enum class AttentionChoice { kAuto, kPlain, kFlash };

struct ZinfConfig {
  std::string device = "auto";    // auto | cpu | cuda | cuda:N
  uint64_t device_memory = 0;     // bytes; 0 = all of the device (HostDevice: 1/4 of RAM)
  uint64_t host_memory = 0;       // pinned host budget in bytes; 0 = no limit beyond the plan
  int64_t optimizer_threads = 0;  // CPU Adam threads; 0 = hardware threads / ranks on this machine
  // Multi-rank runs: a collective with no progress for this long fails on
  // every waiting rank, naming the silent ranks (a dead or stopped peer).
  double comm_timeout_s = 300;
  // A NaN or infinite loss handed to Engine::ReportLoss stops the training:
  // the engine refuses further steps (with several ranks, every rank stops,
  // naming this one) and the last checkpoint is where it resumes.
  bool stop_on_nonfinite_loss = false;
  // How a step's gradient comes from its micro-steps' gradients: the mean
  // (true, DeepSpeed's backward scaling the loss by 1 / accumulation steps)
  // or their sum (false: the trainer scaled each micro-step's loss itself,
  // as HF's Trainer does, passing scale_wrt_gas=False to DeepSpeed).
  bool accumulation_mean = true;
  // offload_optimizer cpu, no gradient clipping, no fp16 loss scale, one
  // rank or stage 0: each unit's Adam starts on the host as soon as its
  // gradient of the window's last micro-step is accumulated and the unit is
  // released, during backward, instead of at the boundary. The same bits as
  // without; a non-finite gradient norm, which would skip the step, stops
  // the engine instead (units were already updated).
  bool active_offload = false;
  // offload_optimizer cpu or nvme on a device whose memory the host
  // addresses (HostDevice: training on the CPU): the host's Adam reads a
  // unit's reduced gradient where it lies and writes the new compute copy
  // into its place, with no copies through pinned staging buffers (a
  // gradient accumulates in host memory only over several micro-steps).
  // false takes the staging path an accelerator's memory needs.
  bool offload_zero_copy = true;
  GradientHome gradients = GradientHome::kAuto;  // "gradients": "auto" | "host" | "nvme"
  bool checksums = false;                        // XXH3 per swapped extent, verified on read
  // The model's matrix products: kFloat32, or kBFloat16 operands with fp32
  // accumulation (tensor cores on CUDA). "matmul": "fp32" | "bf16".
  DType matmul = DType::kFloat32;
  AttentionChoice attention = AttentionChoice::kAuto;  // "attention": "auto" | "plain" | "flash"
  ZinfAioConfig aio;
};

struct Config {
  ZeroConfig zero;
  AioConfig aio;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  double gradient_clipping = 0.0;  // 0 = no clipping
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> train_batch_size;
  ZinfConfig zinf;

  // JSON paths whose value was "auto", in file order; ResolveAuto fills them.
  std::vector<std::string> auto_keys;
  // Warnings produced while loading (ignored DeepSpeed keys, deprecated forms).
  std::vector<std::string> warnings;
  // Where the config came from, for messages ("ds_config.json", "<string>").
  std::string source;

  // The effective configuration as DeepSpeed-style JSON (every key, defaults
  // filled in). Parsing it again gives an equal Config.
  std::string ToJson(int indent = 2) const;
};

// Parses a config from JSON text. `source` names it in messages.
Result<Config> ParseConfig(std::string_view json_text, std::string_view source = "<string>");
// Reads and parses a file; errors name the path.
Result<Config> LoadConfigFile(const std::string& path);

// What the trainer knows when "auto" values are resolved. Unset fields fall
// back to DeepSpeed's defaults; the three model-dependent keys need
// hidden_size, as in the Hugging Face integration.
struct AutoContext {
  std::optional<int64_t> hidden_size;
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<int64_t> micro_batch_size;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> gradient_clipping;
  std::optional<int64_t> total_num_steps;
  std::optional<int64_t> warmup_num_steps;
  std::optional<int64_t> world_size;
  // The smallest reduce bucket the engine takes (one norm block, 65536
  // elements): an "auto" reduce_bucket_size below it is raised to it, since
  // hidden_size^2 is smaller for small models.
  int64_t min_reduce_bucket_elems = 0;
};

// Replaces every "auto" with its value; returns "path = value" lines for
// printing. Model-dependent keys: reduce_bucket_size = h*h,
// stage3_prefetch_bucket_size = 0.9*h*h, stage3_param_persistence_threshold =
// 10*h (reduce_bucket_size no smaller than min_reduce_bucket_elems). Without
// hidden_size those are an error naming the key.
Result<std::vector<std::string>> ResolveAuto(Config& config, const AutoContext& context);

// The DeepSpeed batch triangle: train_batch_size = micro * accumulation *
// world_size. Two given → the third is derived; all three → checked; one
// given → accumulation 1. Neither batch size → micro 1, accumulation 1.
struct BatchSizes {
  int64_t train_batch_size;
  int64_t micro_batch_size;
  int64_t gradient_accumulation_steps;
};
Result<BatchSizes> ResolveBatchSizes(const Config& config, int64_t world_size);

}  // namespace zinf
