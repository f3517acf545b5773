// DeepSpeed-compatible config loading. A small schema walker (ObjectReader,
// config_reader.h) reads each JSON object: every key zinf implements is read with its type and
// range, aliases are folded to one canonical name, "auto" is recorded where
// DeepSpeed's Hugging Face integration allows it, known-but-unimplemented
// DeepSpeed keys are warned about or rejected, and whatever is left over is an
// unknown key with a "did you mean" suggestion. All problems in a file are
// collected and reported together.
#include "zinf/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "common/config_reader.h"
#include "common/json_text.h"
#include "common/logging.h"
#include "common/units.h"

namespace zinf {
namespace {

using namespace config_internal;  // NOLINT: the schema walker, config_reader.h

bool IsFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsNull(const json& v) { return v.is_null(); }
bool IsNullOrEmpty(const json& v) { return v.is_null() || (v.is_object() && v.empty()); }
// {"enabled": false, ...} or {} or null.
bool IsDisabledBlock(const json& v) {
  if (v.is_null()) return true;
  if (!v.is_object()) return false;
  auto it = v.find("enabled");
  return it == v.end() || IsFalse(*it);
}
bool IsFp32OrNull(const json& v) {
  if (v.is_null()) return true;
  if (!v.is_string()) return false;
  std::string s = v.get<std::string>();
  return s == "fp32" || s == "float32" || s == "float";
}

void ReadOffloadDevice(ObjectReader& r, OffloadDevice* device) {
  r.Enum("device", device,
         {{"none", OffloadDevice::kNone}, {"cpu", OffloadDevice::kCpu}, {"nvme", OffloadDevice::kNvme}});
}

void ReadOffloadParam(ObjectReader& r, OffloadParamConfig& c) {
  ReadOffloadDevice(r, &c.device);
  r.PathList("nvme_path", &c.nvme_path);
  r.Int("buffer_count", &c.buffer_count, 0, kMaxInt);
  r.Int("buffer_size", &c.buffer_size, 0, kMaxInt);
  r.Int("max_in_cpu", &c.max_in_cpu, 0, kMaxInt);
  r.Bool("pin_memory", &c.pin_memory);
}

void ReadOffloadOptimizer(ObjectReader& r, OffloadOptimizerConfig& c) {
  ReadOffloadDevice(r, &c.device);
  r.PathList("nvme_path", &c.nvme_path);
  r.Int("buffer_count", &c.buffer_count, 0, kMaxInt);
  r.Bool("pin_memory", &c.pin_memory);
  r.Bool("pipeline_read", &c.pipeline_read);
  r.Bool("pipeline_write", &c.pipeline_write);
  r.Bool("fast_init", &c.fast_init);
  r.Double("ratio", &c.ratio, 0.0, 1.0);
  r.Ignored("super_offload", "a Grace-Hopper offload mode; zinf's CPU Adam runs either way");
  r.Ignored("convert_grad_on_cpu", "zinf converts gradients where its pipeline says");
  r.Ignored("cpuadam_cores_perc", "use zinf.optimizer_threads");
}

void ReadZero(ObjectReader& r, ZeroConfig& z, Diagnostics& d) {
  int64_t stage = z.stage;
  r.Int("stage", &stage, 0, 3);
  z.stage = static_cast<int>(stage);
  r.Bool("contiguous_gradients", &z.contiguous_gradients);
  r.Bool("reduce_scatter", &z.reduce_scatter);
  r.Int("reduce_bucket_size", &z.reduce_bucket_size, 0, kMaxInt, /*allow_auto=*/true);
  r.Bool("allgather_partitions", &z.allgather_partitions);
  r.Int("allgather_bucket_size", &z.allgather_bucket_size, 0, kMaxInt);
  bool overlap_set = false;
  r.OptBool("overlap_comm", &z.overlap_comm, &overlap_set);
  r.Int("sub_group_size", &z.sub_group_size, 1, kMaxInt);
  r.Int({"stage3_prefetch_bucket_size", {"prefetch_bucket_size"}}, &z.stage3_prefetch_bucket_size, 0, kMaxInt, true);
  r.Int({"stage3_param_persistence_threshold", {"param_persistence_threshold"}}, &z.stage3_param_persistence_threshold,
        0, kMaxInt, true);
  r.Int({"stage3_model_persistence_threshold", {"model_persistence_threshold"}}, &z.stage3_model_persistence_threshold,
        0, kMaxInt);
  r.Int({"stage3_max_live_parameters", {"max_live_parameters"}}, &z.stage3_max_live_parameters, 0, kMaxInt);
  r.Int({"stage3_max_reuse_distance", {"max_reuse_distance"}}, &z.stage3_max_reuse_distance, 0, kMaxInt);
  r.Bool({"stage3_gather_16bit_weights_on_model_save",
          {"gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"}},
         &z.stage3_gather_16bit_weights_on_model_save);
  r.Object("offload_param", [&](ObjectReader& o) { ReadOffloadParam(o, z.offload_param); });
  r.Object("offload_optimizer", [&](ObjectReader& o) { ReadOffloadOptimizer(o, z.offload_optimizer); });

  // Deprecated spellings of offload, still accepted by DeepSpeed.
  bool cpu_offload = false, cpu_offload_param = false, pin = false, set = false;
  r.OptBool("cpu_offload", &cpu_offload, &set);
  if (set) {
    d.warnings.push_back(r.PathOf("cpu_offload") + " is deprecated; use offload_optimizer.device");
    if (cpu_offload && z.offload_optimizer.device == OffloadDevice::kNone)
      z.offload_optimizer.device = OffloadDevice::kCpu;
  }
  r.OptBool("cpu_offload_param", &cpu_offload_param, &set);
  if (set) {
    d.warnings.push_back(r.PathOf("cpu_offload_param") + " is deprecated; use offload_param.device");
    if (cpu_offload_param && z.offload_param.device == OffloadDevice::kNone)
      z.offload_param.device = OffloadDevice::kCpu;
  }
  r.OptBool("cpu_offload_use_pin_memory", &pin, &set);
  if (set) {
    d.warnings.push_back(r.PathOf("cpu_offload_use_pin_memory") + " is deprecated; use offload_*.pin_memory");
    if (pin) z.offload_param.pin_memory = z.offload_optimizer.pin_memory = true;
  }
  if (!overlap_set) z.overlap_comm = z.stage == 3;

  // DeepSpeed settings that only tune DeepSpeed's own implementation.
  r.Ignored("use_multi_rank_bucket_allreduce", "a communication strategy");
  r.Ignored("load_from_fp32_weights", "zinf checkpoints always hold fp32 master weights");
  r.Ignored("elastic_checkpoint", "a legacy checkpoint format");
  r.Ignored("ignore_unused_parameters", "a unit that is not fetched simply gets no gradient");
  r.Ignored("legacy_stage1", "an old stage-1 implementation");
  r.Ignored("round_robin_gradients", "a gradient-copy schedule");
  r.Ignored("zero_hpz_partition_size", "hierarchical partitioning");
  r.Ignored("mics_hierarchical_params_gather", "a MiCS communication pattern");
  r.Ignored("memory_efficient_linear", "a PyTorch module patch");
  r.Ignored("pipeline_loading_checkpoint", "a checkpoint loading mode");
  r.Ignored("override_module_apply", "a PyTorch module patch");
  r.Ignored("log_trace_cache_warnings", "logging");
  r.Ignored("enable_sanity_checks", "debug checks; zinf's checking mode is zinf.device cpu in tests");
  r.Ignored("save_muon_momentum_buffer_in_memory", "a Muon optimizer option");
  r.Ignored("leaf_module", "a PyTorch module option");
  r.Ignored("stage3_module_granularity_threshold", "zinf fetches whole units");
  r.Ignored("module_granularity_threshold", "zinf fetches whole units");
  r.Ignored("stage3_use_all_reduce_for_fetch_params", "a fetch strategy");
  r.Ignored("use_all_reduce_for_fetch_params", "a fetch strategy");
  r.Ignored("stage3_allgather_sequential", "a fetch strategy");
  r.Ignored("allgather_sequential", "a fetch strategy");
  r.Ignored("stage3_partition_stream_chunk_size", "a partitioning strategy");
  r.Ignored("partition_stream_chunk_size", "a partitioning strategy");
  // Settings that change the numbers: accepted only when off.
  r.RejectUnless("zero_quantized_weights", IsFalse, "false", "quantized weight communication (ZeRO++)");
  r.RejectUnless("zero_quantized_nontrainable_weights", IsFalse, "false", "quantized weights (ZeRO++)");
  r.RejectUnless("zero_quantized_gradients", IsFalse, "false", "quantized gradient communication (ZeRO++)");
  r.RejectUnless("zeropp_loco_param", IsNull, "null", "LoCo-Zero++");
  r.RejectUnless(
      "mics_shard_size", [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == -1; }, "-1",
      "MiCS sharding");
  r.RejectUnless("zenflow", IsNull, "null", "ZenFlow's asynchronous updates");
}

void ReadAio(ObjectReader& r, AioConfig& a) {
  r.Int("block_size", &a.block_size, 4096, kMaxInt);
  if (a.block_size % 4096 != 0)
    r.Error("block_size", std::to_string(a.block_size) + " is not a multiple of 4096 (O_DIRECT alignment)");
  r.Int("queue_depth", &a.queue_depth, 1, 32768);
  r.Int({"intra_op_parallelism", {"thread_count"}}, &a.intra_op_parallelism, 1, 1024);
  r.Bool("single_submit", &a.single_submit);
  r.Bool("overlap_events", &a.overlap_events);
  r.Bool("use_gds", &a.use_gds);
  r.Enum("io_backend", &a.io_backend, {{"async_io", AioBackend::kAsyncIo}, {"posix", AioBackend::kPosix}});
}

void ReadFp16(ObjectReader& r, Fp16Config& f) {
  r.Bool("enabled", &f.enabled, /*allow_auto=*/true);
  r.Bool("auto_cast", &f.auto_cast);
  r.Double("loss_scale", &f.loss_scale, 0.0, 3.0e38);
  r.Int("initial_scale_power", &f.initial_scale_power, 0, 126);
  r.Int("loss_scale_window", &f.loss_scale_window, 1, kMaxInt);
  r.Int("hysteresis", &f.hysteresis, 1, kMaxInt);
  r.Bool("consecutive_hysteresis", &f.consecutive_hysteresis);
  r.Double("min_loss_scale", &f.min_loss_scale, 0.0, 3.0e38, false, /*min_exclusive=*/true);
  r.RejectUnless("fp16_master_weights_and_grads", IsFalse, "false", "fp16 master weights");
}

void ReadBf16(ObjectReader& r, Bf16Config& b) {
  r.Bool("enabled", &b.enabled, /*allow_auto=*/true);
  r.Ignored("immediate_grad_update", "zinf reduces gradients at every micro-step");
  r.RejectUnless("check_grad_overflow", IsFalse, "false", "skipping bf16 steps on overflow");
  r.RejectUnless("bf16_master_weights_and_grads", IsFalse, "false", "bf16 master weights");
  r.RejectUnless("bf16_optimizer_states", IsFalse, "false", "bf16 optimizer states");
}

void ReadOptimizer(ObjectReader& r, OptimizerConfig& o) {
  o.present = true;
  const json* type = r.Take("type");
  if (!type) {
    r.Error("type", "missing; zinf implements \"Adam\" and \"AdamW\"");
  } else if (!type->is_string()) {
    r.Error("type", "expected \"Adam\" or \"AdamW\", found " + Describe(*type));
  } else {
    std::string t = type->get<std::string>();
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
    if (t == "adam") {
      o.type = OptimizerType::kAdam;
    } else if (t == "adamw") {
      o.type = OptimizerType::kAdamW;
    } else {
      r.Error("type", "zinf implements \"Adam\" and \"AdamW\"; " + Describe(*type) +
                          " would train differently, so it is not replaced silently");
    }
  }
  r.Object("params", [&](ObjectReader& p) {
    p.Double("lr", &o.lr, 0.0, kInf, true);
    const json* betas = p.Take("betas");
    if (betas && !p.IsAuto(*betas)) {
      bool ok = betas->is_array() && betas->size() == 2 && (*betas)[0].is_number() && (*betas)[1].is_number();
      double b1 = ok ? (*betas)[0].get<double>() : 0, b2 = ok ? (*betas)[1].get<double>() : 0;
      if (!ok || b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1) {
        p.Error("betas", "expected [beta1, beta2] with each in [0, 1), found " + Describe(*betas));
      } else {
        o.beta1 = b1;
        o.beta2 = b2;
      }
    } else if (betas) {
      p.HandleAuto("betas", *betas, true, "");
    }
    p.Double("eps", &o.eps, 0.0, kInf, true, /*min_exclusive=*/true);
    p.Double("weight_decay", &o.weight_decay, 0.0, kInf, true);
    p.Bool("bias_correction", &o.bias_correction);
    p.Bool("adam_w_mode", &o.adam_w_mode);
    p.Ignored("torch_adam", "zinf always runs its own Adam");
    p.Ignored("fused", "zinf always runs its own Adam");
    p.Ignored("foreach", "zinf always runs its own Adam");
    p.RejectUnless("amsgrad", IsFalse, "false", "AMSGrad");
  });
  if (o.type == OptimizerType::kAdamW && !o.adam_w_mode)
    r.Error("params.adam_w_mode", "false contradicts type \"AdamW\"; use type \"Adam\" for L2 weight decay");
}

void ReadScheduler(ObjectReader& r, SchedulerConfig& s) {
  const json* type = r.Take("type");
  bool decay = false, cosine = false;
  if (!type) {
    r.Error("type", "missing; zinf implements \"WarmupLR\", \"WarmupDecayLR\" and \"WarmupCosineLR\"");
  } else if (type->is_string() && type->get<std::string>() == "WarmupLR") {
    s.type = SchedulerType::kWarmupLR;
  } else if (type->is_string() && type->get<std::string>() == "WarmupDecayLR") {
    s.type = SchedulerType::kWarmupDecayLR;
    decay = true;
  } else if (type->is_string() && type->get<std::string>() == "WarmupCosineLR") {
    s.type = SchedulerType::kWarmupCosineLR;
    cosine = true;
  } else {
    r.Error("type", "expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", found " + Describe(*type) +
                        " (a different schedule would change the result, so it is not replaced silently)");
  }
  r.Object("params", [&](ObjectReader& p) {
    if (!cosine) {
      p.Double("warmup_min_lr", &s.warmup_min_lr, 0.0, kInf, true);
      p.Double("warmup_max_lr", &s.warmup_max_lr, 0.0, kInf, true);
    } else {
      p.Double("warmup_min_ratio", &s.warmup_min_ratio, 0.0, 1.0);
      p.Double("cos_min_ratio", &s.cos_min_ratio, 0.0, 1.0);
    }
    p.Int("warmup_num_steps", &s.warmup_num_steps, 0, kMaxInt, true);
    p.Enum("warmup_type", &s.warmup_type, {{"log", WarmupType::kLog}, {"linear", WarmupType::kLinear}});
    if (decay || cosine) {
      std::optional<int64_t> total;
      p.OptInt("total_num_steps", &total, 1, kMaxInt, true);
      if (total) s.total_num_steps = *total;
    }
    p.RejectUnless(
        "last_batch_iteration", [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == -1; }, "-1",
        "starting a schedule mid-way (resume from a zinf checkpoint instead)");
  });
}

void ReadZinf(ObjectReader& r, ZinfConfig& z) {
  const json* device = r.Take("device");
  if (device) {
    bool ok = device->is_string();
    std::string s = ok ? device->get<std::string>() : "";
    if (ok && s != "auto" && s != "cpu" && s != "cuda") {
      ok = s.rfind("cuda:", 0) == 0 && s.size() > 5 &&
           std::all_of(s.begin() + 5, s.end(), [](unsigned char c) { return std::isdigit(c); });
    }
    if (ok) {
      z.device = s;
    } else {
      r.Error("device", "expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", found " + Describe(*device));
    }
  }
  r.Size("device_memory", &z.device_memory);
  r.Size("host_memory", &z.host_memory);
  r.Int("optimizer_threads", &z.optimizer_threads, 0, 4096);
  r.Double("comm_timeout_s", &z.comm_timeout_s, 0.0, 1e9, false, /*min_exclusive=*/true);
  r.Enum("gradients", &z.gradients,
         {{"auto", GradientHome::kAuto}, {"host", GradientHome::kHost}, {"nvme", GradientHome::kNvme}});
  r.Bool("checksums", &z.checksums);
  r.Bool("stop_on_nonfinite_loss", &z.stop_on_nonfinite_loss);
  r.Enum("gradient_accumulation", &z.accumulation_mean, {{"mean", true}, {"sum", false}});
  r.Bool("active_offload", &z.active_offload);
  r.Bool("offload_zero_copy", &z.offload_zero_copy);
  r.Enum("matmul", &z.matmul, {{"fp32", DType::kFloat32}, {"bf16", DType::kBFloat16}});
  r.Enum("attention", &z.attention,
         {{"auto", AttentionChoice::kAuto}, {"plain", AttentionChoice::kPlain}, {"flash", AttentionChoice::kFlash}});
  r.Object("aio", [&](ObjectReader& a) {
    a.Int("rings", &z.aio.rings, 0, 256);
    a.Bool("fixed_buffers", &z.aio.fixed_buffers);
    a.Bool("sqpoll", &z.aio.sqpoll);
    a.Bool("buffered", &z.aio.buffered);
    a.Bool("phased_swaps", &z.aio.phased_swaps);
  });
}

void ReadTop(ObjectReader& r, const json& root, Config& c, Diagnostics& d) {
  r.OptInt("train_batch_size", &c.train_batch_size, 1, kMaxInt, true);
  r.OptInt("train_micro_batch_size_per_gpu", &c.train_micro_batch_size_per_gpu, 1, kMaxInt, true);
  r.OptInt("gradient_accumulation_steps", &c.gradient_accumulation_steps, 1, kMaxInt, true);
  r.Double("gradient_clipping", &c.gradient_clipping, 0.0, kInf, true);

  // "zero_optimization": true|false is DeepSpeed's oldest form (stage 1 or off).
  auto zero_it = root.find("zero_optimization");
  if (zero_it != root.end() && zero_it->is_boolean()) {
    r.Take("zero_optimization");
    c.zero.stage = zero_it->get<bool>() ? 1 : 0;
    d.warnings.push_back("zero_optimization: a boolean is DeepSpeed's deprecated form; read as {\"stage\": " +
                         std::to_string(c.zero.stage) + "}");
    r.Int("allgather_size", &c.zero.allgather_bucket_size, 0, kMaxInt);
  } else {
    r.Object("zero_optimization", [&](ObjectReader& z) { ReadZero(z, c.zero, d); });
    if (zero_it == root.end()) c.zero.overlap_comm = false;
  }
  r.Object("aio", [&](ObjectReader& a) { ReadAio(a, c.aio); });
  r.Object("fp16", [&](ObjectReader& f) { ReadFp16(f, c.fp16); });
  r.Object({"bf16", {"bfloat16"}}, [&](ObjectReader& b) { ReadBf16(b, c.bf16); });
  r.Object("optimizer", [&](ObjectReader& o) { ReadOptimizer(o, c.optimizer); });
  r.Object("scheduler", [&](ObjectReader& s) { ReadScheduler(s, c.scheduler); });
  r.Object("zinf", [&](ObjectReader& z) { ReadZinf(z, c.zinf); });

  // DeepSpeed features outside zinf's scope that do not change the numbers.
  for (const char* key : {"steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown", "flops_profiler",
                          "tensorboard", "wandb", "csv_monitor", "comet", "monitor_config", "comms_logger", "timers"})
    r.Ignored(key, "logging and monitoring; zinf reports through its own metrics");
  for (const char* key : {"activation_checkpointing", "checkpoint", "autotuning", "zero_allow_untested_optimizer",
                          "zero_force_ds_cpu_optimizer", "disable_allgather", "nebula", "pipeline", "graph_harvesting",
                          "use_data_before_expert_parallelism", "compile", "seq_parallel_communication_data_type",
                          "dataloader_drop_last", "gradient_checkpointing"})
    r.Ignored(key, "a DeepSpeed runtime feature");
  // Features that would change the numbers: accepted only when off.
  r.RejectUnless("prescale_gradients", IsFalse, "false", "gradient pre-scaling");
  r.RejectUnless(
      "gradient_predivide_factor", [](const json& v) { return v.is_number() && v.get<double>() == 1.0; }, "1.0",
      "gradient pre-division");
  r.RejectUnless("sparse_gradients", IsFalse, "false", "sparse gradients");
  r.RejectUnless("amp", IsDisabledBlock, "{\"enabled\": false}", "Apex AMP");
  r.RejectUnless("communication_data_type", IsFp32OrNull, "null or \"fp32\"",
                 "reduced-precision gradient communication (zinf reduces in fp32)");
  r.RejectUnless(
      "data_types",
      [](const json& v) {
        if (v.is_null()) return true;
        if (!v.is_object()) return false;
        for (auto it = v.begin(); it != v.end(); ++it)
          if (it.key() != "grad_accum_dtype" || !IsFp32OrNull(it.value())) return false;
        return true;
      },
      "{\"grad_accum_dtype\": \"fp32\"}", "gradient accumulation in a 16-bit type (zinf accumulates in fp32)");
  r.RejectUnless("elasticity", IsDisabledBlock, "{\"enabled\": false}", "elastic training");
  r.RejectUnless("compression_training", IsNullOrEmpty, "{}", "compression training");
  r.RejectUnless("data_efficiency", IsDisabledBlock, "{\"enabled\": false}", "data efficiency");
  r.RejectUnless("curriculum_learning", IsDisabledBlock, "{\"enabled\": false}", "curriculum learning");
  r.RejectUnless("progressive_layer_drop", IsDisabledBlock, "{\"enabled\": false}", "progressive layer drop");
  r.RejectUnless("eigenvalue", IsDisabledBlock, "{\"enabled\": false}", "eigenvalue computation");
  r.RejectUnless("quantize_training", IsDisabledBlock, "{\"enabled\": false}", "quantized training");
  r.RejectUnless("hybrid_engine", IsDisabledBlock, "{\"enabled\": false}", "the hybrid engine");
  r.RejectUnless("torch_autocast", IsDisabledBlock, "{\"enabled\": false}", "torch autocast");
  r.RejectUnless("sparse_attention", IsNull, "null", "sparse attention");
  r.RejectUnless("weight_quantization", IsNull, "null", "weight quantization");
  r.RejectUnless(
      "tensor_parallel",
      [](const json& v) {
        if (v.is_null()) return true;
        if (!v.is_object()) return false;
        auto it = v.find("autotp_size");
        return it == v.end() || (it->is_number_integer() && it->get<int64_t>() <= 1);
      },
      "{\"autotp_size\": 1}", "tensor parallelism");
}

// Checks that need more than one key.
void CrossCheck(const Config& c, Diagnostics& d) {
  const auto& z = c.zero;
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3)
    d.AddError("zero_optimization.offload_param: parameter offload needs stage 3 (stage is " + std::to_string(z.stage) +
               "); set \"stage\": 3 or remove offload_param");
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.nvme_path.empty())
    d.AddError("zero_optimization.offload_param.nvme_path: required when offload_param.device is \"nvme\"");
  if (z.offload_optimizer.device == OffloadDevice::kNvme && z.offload_optimizer.nvme_path.empty())
    d.AddError("zero_optimization.offload_optimizer.nvme_path: required when offload_optimizer.device is \"nvme\"");
  if (z.offload_optimizer.ratio < 1.0) {
    if (z.stage != 3)
      d.AddError("zero_optimization.offload_optimizer.ratio: partial offload (ratio < 1) needs stage 3");
    else
      d.warnings.push_back(
          "zero_optimization.offload_optimizer.ratio: partial offload is not implemented; "
          "all optimizer state is offloaded (the result is the same)");
  }
  bool fp16_auto = std::find(c.auto_keys.begin(), c.auto_keys.end(), "fp16.enabled") != c.auto_keys.end();
  bool bf16_auto = std::find(c.auto_keys.begin(), c.auto_keys.end(), "bf16.enabled") != c.auto_keys.end();
  if (c.fp16.enabled && c.bf16.enabled && !fp16_auto && !bf16_auto)
    d.AddError("fp16.enabled and bf16.enabled are both true; choose one 16-bit type");
  const auto& s = c.scheduler;
  bool total_auto =
      std::find(c.auto_keys.begin(), c.auto_keys.end(), "scheduler.params.total_num_steps") != c.auto_keys.end();
  if ((s.type == SchedulerType::kWarmupDecayLR || s.type == SchedulerType::kWarmupCosineLR) && s.total_num_steps <= 0 &&
      !total_auto)
    d.AddError("scheduler.params.total_num_steps: required by " + std::string(SchedulerTypeName(s.type)));
  if (c.aio.use_gds)
    d.warnings.push_back(
        "aio.use_gds: GPUDirect Storage is not implemented; NVMe data is staged through pinned host memory");
  if (c.fp16.auto_cast)
    d.warnings.push_back("fp16.auto_cast: zinf does not cast model inputs; the model decides its compute type");
}

json ToJsonValue(const std::vector<std::string>& paths) {
  if (paths.empty()) return nullptr;
  if (paths.size() == 1) return paths[0];
  return paths;
}

}  // namespace

std::string_view OffloadDeviceName(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

std::string_view OptimizerTypeName(OptimizerType t) { return t == OptimizerType::kAdam ? "Adam" : "AdamW"; }

std::string_view SchedulerTypeName(SchedulerType t) {
  switch (t) {
    case SchedulerType::kNone:
      return "none";
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "?";
}

Result<Config> ParseConfig(std::string_view text, std::string_view source) {
  Diagnostics d;
  auto parsed = ParseJsonText(text, std::string(source));
  if (!parsed.ok()) return parsed.status();
  json root = std::move(parsed->value);
  // A key given twice is a mistake that json.load in Python would hide by
  // keeping the last one.
  for (const DuplicateKey& dup : parsed->duplicate_keys)
    d.AddError(dup.path + ": key appears more than once in the same object");
  if (!root.is_object())
    return InvalidArgument(std::string(source) + ": the top level must be a JSON object, found " + Describe(root));

  Config c;
  c.source = std::string(source);
  ObjectReader top(root, "", d);
  ReadTop(top, root, c, d);
  top.Finish();
  c.auto_keys = d.auto_keys;
  CrossCheck(c, d);

  if (!d.errors.empty()) {
    std::string msg = std::string(source) + ": ";
    const size_t problems = d.errors.size() + d.errors_not_kept;
    if (problems == 1) {
      msg += d.errors[0];
    } else {
      // One line, as every tool error is: "N problems: a: ...; b: ...".
      msg += std::to_string(problems) + " problems: ";
      for (size_t i = 0; i < d.errors.size(); ++i) msg += (i ? "; " : "") + d.errors[i];
      if (d.errors_not_kept > 0) msg += "; and " + std::to_string(d.errors_not_kept) + " more";
    }
    return InvalidArgument(msg);
  }
  for (const auto& w : d.warnings) WarnOnce(std::string(source) + ": " + w);
  c.warnings = std::move(d.warnings);
  return c;
}

Result<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open config file " + path + ": " + std::strerror(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return IoError("reading config file " + path + ": " + std::strerror(errno));
  return ParseConfig(buf.str(), path);
}

std::string Config::ToJson(int indent) const {
  json j;
  if (train_batch_size) j["train_batch_size"] = *train_batch_size;
  if (train_micro_batch_size_per_gpu) j["train_micro_batch_size_per_gpu"] = *train_micro_batch_size_per_gpu;
  if (gradient_accumulation_steps) j["gradient_accumulation_steps"] = *gradient_accumulation_steps;
  j["gradient_clipping"] = gradient_clipping;
  const auto& z = zero;
  j["zero_optimization"] = {
      {"stage", z.stage},
      {"contiguous_gradients", z.contiguous_gradients},
      {"reduce_scatter", z.reduce_scatter},
      {"reduce_bucket_size", z.reduce_bucket_size},
      {"allgather_partitions", z.allgather_partitions},
      {"allgather_bucket_size", z.allgather_bucket_size},
      {"overlap_comm", z.overlap_comm},
      {"sub_group_size", z.sub_group_size},
      {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
      {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
      {"stage3_model_persistence_threshold", z.stage3_model_persistence_threshold},
      {"stage3_max_live_parameters", z.stage3_max_live_parameters},
      {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
      {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save},
      {"offload_param",
       {{"device", OffloadDeviceName(z.offload_param.device)},
        {"nvme_path", ToJsonValue(z.offload_param.nvme_path)},
        {"buffer_count", z.offload_param.buffer_count},
        {"buffer_size", z.offload_param.buffer_size},
        {"max_in_cpu", z.offload_param.max_in_cpu},
        {"pin_memory", z.offload_param.pin_memory}}},
      {"offload_optimizer",
       {{"device", OffloadDeviceName(z.offload_optimizer.device)},
        {"nvme_path", ToJsonValue(z.offload_optimizer.nvme_path)},
        {"buffer_count", z.offload_optimizer.buffer_count},
        {"pin_memory", z.offload_optimizer.pin_memory},
        {"pipeline_read", z.offload_optimizer.pipeline_read},
        {"pipeline_write", z.offload_optimizer.pipeline_write},
        {"fast_init", z.offload_optimizer.fast_init},
        {"ratio", z.offload_optimizer.ratio}}},
  };
  j["aio"] = {{"block_size", aio.block_size},
              {"queue_depth", aio.queue_depth},
              {"intra_op_parallelism", aio.intra_op_parallelism},
              {"single_submit", aio.single_submit},
              {"overlap_events", aio.overlap_events},
              {"use_gds", aio.use_gds},
              {"io_backend", aio.io_backend == AioBackend::kPosix ? "posix" : "async_io"}};
  j["fp16"] = {{"enabled", fp16.enabled},
               {"auto_cast", fp16.auto_cast},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"consecutive_hysteresis", fp16.consecutive_hysteresis},
               {"min_loss_scale", fp16.min_loss_scale}};
  j["bf16"] = {{"enabled", bf16.enabled}};
  if (optimizer.present) {
    j["optimizer"] = {{"type", OptimizerTypeName(optimizer.type)},
                      {"params",
                       {{"lr", optimizer.lr},
                        {"betas", {optimizer.beta1, optimizer.beta2}},
                        {"eps", optimizer.eps},
                        {"weight_decay", optimizer.weight_decay},
                        {"bias_correction", optimizer.bias_correction},
                        {"adam_w_mode", optimizer.adam_w_mode}}}};
  }
  if (scheduler.type != SchedulerType::kNone) {
    const auto& s = scheduler;
    json p = {{"warmup_num_steps", s.warmup_num_steps},
              {"warmup_type", s.warmup_type == WarmupType::kLog ? "log" : "linear"}};
    if (s.type == SchedulerType::kWarmupCosineLR) {
      p["warmup_min_ratio"] = s.warmup_min_ratio;
      p["cos_min_ratio"] = s.cos_min_ratio;
    } else {
      p["warmup_min_lr"] = s.warmup_min_lr;
      p["warmup_max_lr"] = s.warmup_max_lr;
    }
    if (s.type != SchedulerType::kWarmupLR) p["total_num_steps"] = s.total_num_steps;
    j["scheduler"] = {{"type", SchedulerTypeName(s.type)}, {"params", p}};
  }
  j["zinf"] = {{"device", zinf.device},
               {"device_memory", zinf.device_memory},
               {"host_memory", zinf.host_memory},
               {"optimizer_threads", zinf.optimizer_threads},
               {"comm_timeout_s", zinf.comm_timeout_s},
               {"gradients", zinf.gradients == GradientHome::kAuto   ? "auto"
                             : zinf.gradients == GradientHome::kHost ? "host"
                                                                     : "nvme"},
               {"checksums", zinf.checksums},
               {"stop_on_nonfinite_loss", zinf.stop_on_nonfinite_loss},
               {"gradient_accumulation", zinf.accumulation_mean ? "mean" : "sum"},
               {"active_offload", zinf.active_offload},
               {"offload_zero_copy", zinf.offload_zero_copy},
               {"matmul", zinf.matmul == DType::kBFloat16 ? "bf16" : "fp32"},
               {"attention", zinf.attention == AttentionChoice::kFlash   ? "flash"
                             : zinf.attention == AttentionChoice::kPlain ? "plain"
                                                                         : "auto"},
               {"aio",
                {{"rings", zinf.aio.rings},
                 {"fixed_buffers", zinf.aio.fixed_buffers},
                 {"sqpoll", zinf.aio.sqpoll},
                 {"buffered", zinf.aio.buffered},
                 {"phased_swaps", zinf.aio.phased_swaps}}}};
  // Unresolved "auto" values are written back as "auto".
  for (const auto& path : auto_keys) {
    std::string pointer = "/" + path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    j[json::json_pointer(pointer)] = "auto";
  }
  return j.dump(indent);
}

Result<std::vector<std::string>> ResolveAuto(Config& c, const AutoContext& ctx) {
  std::vector<std::string> lines;
  std::vector<std::string> errors;
  auto note = [&](const std::string& path, const std::string& value, const char* from) {
    lines.push_back(path + " = " + value + " (\"auto\": " + from + ")");
  };
  for (const auto& path : c.auto_keys) {
    auto h = ctx.hidden_size;
    if (path == "zero_optimization.reduce_bucket_size" || path == "zero_optimization.stage3_prefetch_bucket_size" ||
        path == "zero_optimization.stage3_param_persistence_threshold") {
      if (!h || *h <= 0) {
        errors.push_back(path +
                         " is \"auto\", which is derived from the model's hidden size; set a number or "
                         "give the hidden size (zinf train knows it from the model)");
        continue;
      }
      // h^2 * 9 must stay within int64; no model is near this wide.
      constexpr int64_t kMaxAutoHidden = int64_t{1} << 24;
      if (*h > kMaxAutoHidden) {
        errors.push_back(path + " is \"auto\", derived from the hidden size, and a hidden size of " +
                         std::to_string(*h) + " is above the " + std::to_string(kMaxAutoHidden) +
                         " zinf derives bucket sizes from; set a number");
        continue;
      }
      int64_t v;
      if (path == "zero_optimization.reduce_bucket_size") {
        v = c.zero.reduce_bucket_size = std::max(*h * *h, ctx.min_reduce_bucket_elems);
        note(path, std::to_string(v),
             v > *h * *h ? "hidden_size^2, raised to the engine's smallest bucket" : "hidden_size^2");
      } else if (path == "zero_optimization.stage3_prefetch_bucket_size") {
        // Integer arithmetic for 0.9*h*h, so the value is exact for any h.
        v = c.zero.stage3_prefetch_bucket_size = (*h * *h * 9) / 10;
        note(path, std::to_string(v), "0.9 * hidden_size^2");
      } else {
        v = c.zero.stage3_param_persistence_threshold = 10 * *h;
        note(path, std::to_string(v), "10 * hidden_size");
      }
    } else if (path == "train_micro_batch_size_per_gpu") {
      c.train_micro_batch_size_per_gpu = ctx.micro_batch_size;
      note(path, ctx.micro_batch_size ? std::to_string(*ctx.micro_batch_size) : "derived", "trainer");
    } else if (path == "gradient_accumulation_steps") {
      c.gradient_accumulation_steps = ctx.gradient_accumulation_steps;
      note(path, ctx.gradient_accumulation_steps ? std::to_string(*ctx.gradient_accumulation_steps) : "derived",
           "trainer");
    } else if (path == "train_batch_size") {
      c.train_batch_size = std::nullopt;
      note(path, "derived", "micro batch x accumulation x world size");
    } else if (path == "gradient_clipping") {
      c.gradient_clipping = ctx.gradient_clipping.value_or(0.0);
      note(path, FormatDouble(c.gradient_clipping), ctx.gradient_clipping ? "trainer" : "DeepSpeed default");
    } else if (path == "optimizer.params.lr") {
      c.optimizer.lr = ctx.lr.value_or(OptimizerConfig{}.lr);
      note(path, FormatDouble(c.optimizer.lr), ctx.lr ? "trainer" : "default");
    } else if (path == "optimizer.params.weight_decay") {
      c.optimizer.weight_decay = ctx.weight_decay.value_or(0.0);
      note(path, FormatDouble(c.optimizer.weight_decay), ctx.weight_decay ? "trainer" : "default");
    } else if (path == "optimizer.params.betas") {
      note(path, "[" + FormatDouble(c.optimizer.beta1) + ", " + FormatDouble(c.optimizer.beta2) + "]", "default");
    } else if (path == "optimizer.params.eps") {
      note(path, FormatDouble(c.optimizer.eps), "default");
    } else if (path == "scheduler.params.warmup_max_lr") {
      c.scheduler.warmup_max_lr = ctx.lr.value_or(SchedulerConfig{}.warmup_max_lr);
      note(path, FormatDouble(c.scheduler.warmup_max_lr), ctx.lr ? "trainer's learning rate" : "default");
    } else if (path == "scheduler.params.warmup_min_lr") {
      note(path, FormatDouble(c.scheduler.warmup_min_lr), "default");
    } else if (path == "scheduler.params.warmup_num_steps") {
      c.scheduler.warmup_num_steps = ctx.warmup_num_steps.value_or(SchedulerConfig{}.warmup_num_steps);
      note(path, std::to_string(c.scheduler.warmup_num_steps), ctx.warmup_num_steps ? "trainer" : "default");
    } else if (path == "scheduler.params.total_num_steps") {
      if (!ctx.total_num_steps) {
        errors.push_back(path + " is \"auto\" but the number of training steps is not known; set a number");
        continue;
      }
      c.scheduler.total_num_steps = *ctx.total_num_steps;
      note(path, std::to_string(*ctx.total_num_steps), "trainer");
    } else if (path == "fp16.enabled" || path == "bf16.enabled") {
      note(path, "false", "default");
      (path == "fp16.enabled" ? c.fp16.enabled : c.bf16.enabled) = false;
    } else {
      errors.push_back(path + " is \"auto\" but zinf has no rule to resolve it");
    }
  }
  if (!errors.empty()) {
    std::string msg = c.source + ": ";
    for (size_t i = 0; i < errors.size(); ++i) msg += (i ? "; " : "") + errors[i];
    return InvalidArgument(msg);
  }
  c.auto_keys.clear();
  return lines;
}

Result<BatchSizes> ResolveBatchSizes(const Config& c, int64_t world_size) {
  if (world_size < 1) return InvalidArgument("world size must be >= 1, got " + std::to_string(world_size));
  auto tb = c.train_batch_size;
  auto mb = c.train_micro_batch_size_per_gpu;
  auto gas = c.gradient_accumulation_steps;
  const std::string ws = std::to_string(world_size);
  auto indivisible = [&](int64_t total, int64_t by, const char* derived) {
    return InvalidArgument(c.source + ": train_batch_size " + std::to_string(total) + " is not divisible by " +
                           std::to_string(by) + " (world size " + ws + " x the other batch factor), so " + derived +
                           " cannot be derived");
  };
  for (const auto& [name, v] : {std::pair{"train_batch_size", tb}, std::pair{"train_micro_batch_size_per_gpu", mb},
                                std::pair{"gradient_accumulation_steps", gas}}) {
    if (v && *v < 1) return InvalidArgument(c.source + ": " + name + " is " + std::to_string(*v) + "; must be >= 1");
  }
  // Every product below, checked: the factors come from a user's file.
  auto product = [&](std::initializer_list<int64_t> factors, int64_t* out) {
    int64_t p = 1;
    for (int64_t f : factors)
      if (__builtin_mul_overflow(p, f, &p)) return false;
    *out = p;
    return true;
  };
  auto too_large = [&] {
    return InvalidArgument(c.source + ": the batch sizes (train_batch_size " + (tb ? std::to_string(*tb) : "unset") +
                           ", train_micro_batch_size_per_gpu " + (mb ? std::to_string(*mb) : "unset") +
                           ", gradient_accumulation_steps " + (gas ? std::to_string(*gas) : "unset") + ", world size " +
                           ws + ") multiply beyond 2^63");
  };
  BatchSizes out{};
  int64_t m_w = 0, g_w = 0, m_g_w = 0;
  if (!product({mb.value_or(1), world_size}, &m_w) || !product({gas.value_or(1), world_size}, &g_w) ||
      !product({mb.value_or(1), gas.value_or(1), world_size}, &m_g_w)) {
    return too_large();
  }
  if (tb && mb && gas) {
    if (*tb != m_g_w)
      return InvalidArgument(c.source + ": train_batch_size " + std::to_string(*tb) +
                             " != train_micro_batch_size_per_gpu " + std::to_string(*mb) +
                             " x gradient_accumulation_steps " + std::to_string(*gas) + " x world size " + ws + " = " +
                             std::to_string(m_g_w));
    out = {*tb, *mb, *gas};
  } else if (tb && mb) {
    if (*tb % m_w) return indivisible(*tb, m_w, "gradient_accumulation_steps");
    out = {*tb, *mb, *tb / m_w};
  } else if (tb && gas) {
    if (*tb % g_w) return indivisible(*tb, g_w, "train_micro_batch_size_per_gpu");
    out = {*tb, *tb / g_w, *gas};
  } else if (tb) {
    if (*tb % world_size) return indivisible(*tb, world_size, "train_micro_batch_size_per_gpu");
    out = {*tb, *tb / world_size, 1};
  } else {
    out = {m_g_w, mb.value_or(1), gas.value_or(1)};
  }
  if (out.micro_batch_size < 1 || out.gradient_accumulation_steps < 1)
    return InvalidArgument(c.source + ": batch sizes resolve to micro batch " + std::to_string(out.micro_batch_size) +
                           " and accumulation " + std::to_string(out.gradient_accumulation_steps) +
                           "; both must be >= 1");
  return out;
}

}  // namespace zinf
