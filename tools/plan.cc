// `zinf plan`: what a run needs per rank, per tier, for every ZeRO stage ×
// offload combination, which combinations fit, and the predicted step time
// (the arithmetic is src/sched/plan.cc; this file reads flags and files and
// prints).
#include "tools/plan.h"
#include "tools/train.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/runtime_info.h"
#include "sched/backends.h"
#include "common/units.h"
#include "model/gpt_config.h"
#include "sched/partition.h"
#include "model/gpt_plan.h"
#include "sched/plan.h"
#include "tools/tool_status.h"
#include "zinf/config.h"

namespace zinf::tools {
namespace {

struct PlanOptions {
  std::string config;
  std::string model;
  std::string params;
  int64_t layers = 0, d_model = 0, heads = 0, vocab = 0, seq_len = 0;
  int64_t micro_batch = 0, grad_accum = 0;
  int64_t steps = 0;  // for "auto" total_num_steps
  int units = 24;
  bool checkpointing = false;
  std::string dtype;
  int64_t ranks = 1;
  std::string device;  // empty: the config's zinf.device
  std::string device_memory, host_memory, nvme_free;
  PlanRateFlags rates;
  bool json = false;
};

// What the phases resolve, in order.
struct PlanRun {
  sched::PlanInput in;
  model::GptConfig mc;                  // the shape (unused with --params)
  std::vector<std::string> auto_lines;  // the "auto" values resolved
  DType compute = DType::kFloat32;
  std::string device_from, host_from, nvme_from;  // where each capacity came from
};

// A size flag: > 0, or bad input naming the flag.
Result<uint64_t> Size(const std::string& text, const char* flag) {
  auto v = ParseSize(text);
  if (!v.ok()) return BadInput(std::string(flag) + ": " + v.status().message());
  if (*v == 0) return BadInput(std::string(flag) + ": must be > 0");
  return *v;
}

std::string Seconds(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

// The config file, the ranks, and whether their reductions stage on the
// device: on a CUDA device several ranks reduce through NCCL ("auto" is
// CUDA when this machine has one, as in zinf train).
Status ResolveRanks(const PlanOptions& opt, PlanRun& run) {
  sched::PlanInput& in = run.in;
  if (!opt.config.empty()) {
    auto c = LoadConfigFile(opt.config);
    if (!c.ok()) return BadInput(c.status().message());
    in.config = std::move(*c);
  }
  if (opt.ranks < 1 || opt.ranks > (1 << 20)) return BadInput("--ranks must be >= 1");
  in.world_size = static_cast<int>(opt.ranks);
  const std::string device = opt.device.empty() ? in.config.zinf.device : opt.device;
  if (device != "auto" && device != "cpu" && device != "cuda" && device.rfind("cuda:", 0) != 0) {
    return BadInput("--device " + device + ": expected auto, cpu, cuda or cuda:N");
  }
  bool cuda = device.rfind("cuda", 0) == 0;
  if (device == "auto") {
    for (const BackendInfo& b : sched::ProbeRuntime().backends) cuda |= b.name == "cuda" && b.usable;
  }
  in.reductions_on_device = cuda && in.world_size > 1;
  in.host_device = !cuda;
  return Status::Ok();
}

// Which model: a preset, a shape, or a bare parameter count.
Status ResolveShape(const PlanOptions& opt, PlanRun& run) {
  const bool shape_flags = opt.layers > 0 || opt.d_model > 0 || opt.heads > 0 || opt.vocab > 0;
  if (!opt.model.empty() && !opt.params.empty()) return BadInput("give --model or --params, not both");
  if (!opt.params.empty() && shape_flags) return BadInput("--params takes no --layers/--d-model/--heads/--vocab");
  if (opt.params.empty() && opt.model.empty() && !shape_flags) {
    std::string presets;
    for (const auto& n : model::GptPresetNames()) presets += (presets.empty() ? "" : ", ") + n;
    return BadInput("give --model PRESET (" + presets +
                    "), a shape (--layers, --d-model, --heads, --vocab, --seq-len) or --params N");
  }
  if (opt.steps < 0) return BadInput("--steps must be >= 1");
  model::GptConfig& mc = run.mc;
  if (!opt.model.empty()) {
    auto p = model::GptPreset(opt.model);
    if (!p.ok()) return BadInput("--model: " + p.status().message());
    mc = *p;
  } else {
    mc = DefaultTrainModel();  // zinf train's default shape
  }
  if (opt.layers > 0) mc.num_layers = opt.layers;
  if (opt.d_model > 0) mc.embed_dim = opt.d_model;
  if (opt.heads > 0) mc.num_heads = opt.heads;
  if (opt.vocab > 0) mc.vocab_size = opt.vocab;
  if (opt.seq_len > 0 && opt.model.empty()) mc.max_seq_len = opt.seq_len;
  return Status::Ok();
}

// "auto" values, from the model's shape and --steps, as zinf train resolves
// them (DeepSpeed's Hugging Face integration does the same); then the
// compute precision.
Status ResolveAutoValues(const PlanOptions& opt, PlanRun& run) {
  Config& config = run.in.config;
  if (!config.auto_keys.empty()) {
    AutoContext ctx;
    ctx.world_size = run.in.world_size;
    ctx.min_reduce_bucket_elems = sched::kNormBlock;
    if (opt.params.empty()) ctx.hidden_size = run.mc.embed_dim;
    if (opt.steps > 0) ctx.total_num_steps = opt.steps;
    auto r = ResolveAuto(config, ctx);
    if (!r.ok()) {
      const std::string& m = r.status().message();
      return BadInput(
          m + (m.find("hidden size") != std::string::npos ? " (--params gives none: use --model or --d-model)" : "") +
          (m.find("total_num_steps") != std::string::npos ? " (give --steps)" : ""));
    }
    run.auto_lines = std::move(*r);
  }
  if (!opt.dtype.empty()) {
    if (opt.dtype != "bf16" && opt.dtype != "fp16" && opt.dtype != "fp32") {
      return BadInput("--dtype: expected bf16, fp16 or fp32, got '" + opt.dtype + "'");
    }
    config.bf16.enabled = opt.dtype == "bf16";
    config.fp16.enabled = opt.dtype == "fp16";
  }
  run.compute = config.bf16.enabled ? DType::kBFloat16 : config.fp16.enabled ? DType::kFloat16 : DType::kFloat32;
  return Status::Ok();
}

// The batch sizes, and the model as the plan sees it: GPT layers, or
// --units equal units of a bare parameter count.
Status PlanTheModel(const PlanOptions& opt, PlanRun& run) {
  sched::PlanInput& in = run.in;
  if (opt.micro_batch < 0 || opt.grad_accum < 0 || opt.seq_len < 0) {
    return BadInput("--micro-batch, --grad-accum and --seq-len must be >= 1");
  }
  if (opt.micro_batch > 0) in.config.train_micro_batch_size_per_gpu = opt.micro_batch;
  if (opt.grad_accum > 0) in.config.gradient_accumulation_steps = opt.grad_accum;
  auto batch = ResolveBatchSizes(in.config, in.world_size);
  if (!batch.ok()) return BadInput(batch.status().message());
  in.gradient_accumulation_steps = batch->gradient_accumulation_steps;
  const int64_t B = batch->micro_batch_size;
  if (opt.params.empty()) {
    auto m = model::PlanGptModel(run.mc, B, opt.seq_len, opt.checkpointing, run.compute, in.config.zinf.matmul,
                                 model::ToAttentionKernel(in.config.zinf.attention));
    if (!m.ok()) return BadInput(m.status().message());
    in.model = std::move(*m);
    return Status::Ok();
  }
  auto n = ParseParamCount(opt.params);
  if (!n.ok()) return BadInput("--params: " + n.status().message());
  if (opt.units < 1) return BadInput("--units must be >= 1");
  int64_t tokens = 0;
  if (opt.seq_len > 0 && __builtin_mul_overflow(B, opt.seq_len, &tokens)) {
    return BadInput("--seq-len " + std::to_string(opt.seq_len) + " x micro batch " + std::to_string(B) + " overflows");
  }
  auto m = sched::PlanParamsModel(*n, opt.units, tokens);
  if (!m.ok()) return BadInput(m.status().message());
  in.model = std::move(*m);
  return Status::Ok();
}

// Each tier's capacity per rank: the flag, the config, else a default,
// with where it came from.
Status ResolveCapacities(const PlanOptions& opt, PlanRun& run) {
  sched::PlanInput& in = run.in;
  if (!opt.device_memory.empty()) {
    ZINF_ASSIGN_OR_RETURN(in.device_memory, Size(opt.device_memory, "--device-memory"));
    run.device_from = "--device-memory";
  } else if (in.config.zinf.device_memory > 0) {
    in.device_memory = in.config.zinf.device_memory;
    run.device_from = "zinf.device_memory";
  } else {
    in.device_memory = PhysicalMemoryBytes() / 4;
    run.device_from = "default: HostDevice's 1/4 of RAM";
  }
  if (!opt.host_memory.empty()) {
    ZINF_ASSIGN_OR_RETURN(in.host_memory, Size(opt.host_memory, "--host-memory"));
    run.host_from = "--host-memory";
  } else if (in.config.zinf.host_memory > 0) {
    in.host_memory = in.config.zinf.host_memory;
    run.host_from = "zinf.host_memory";
  } else {
    in.host_memory = sched::PinnedBudgetBytes(in.config);
    run.host_from = "default: physical memory, the engine's pinned budget";
  }
  if (!opt.nvme_free.empty()) {
    ZINF_ASSIGN_OR_RETURN(in.nvme_free, Size(opt.nvme_free, "--nvme-free"));
    run.nvme_from = "--nvme-free";
  } else if (const std::string path = sched::PlanNvmePath(in.config); !path.empty()) {
    if (auto free = sched::FreeBytesAt(path); free.ok()) {
      in.nvme_free = *free;
      run.nvme_from = "free space at " + path;
    } else {
      run.nvme_from = "not checked: " + path + " not found; give --nvme-free";
    }
  } else {
    run.nvme_from = "not checked: give --nvme-free";
  }
  return Status::Ok();
}

// What the plan assumed: the model, the capacities and the rates.
void PrintAssumptions(const PlanRun& run) {
  const sched::PlanInput& in = run.in;
  std::printf("zinf plan: %s; %d rank(s), %s compute, accumulation %lld\n", in.model.description.c_str(), in.world_size,
              std::string(DTypeName(run.compute)).c_str(), static_cast<long long>(in.gradient_accumulation_steps));
  std::printf("  activations: %s\n", in.model.activation_note.c_str());
  for (const std::string& line : run.auto_lines) std::printf("  auto: %s\n", line.c_str());
  std::printf("  capacity per rank: device %s (%s), host %s (%s), nvme %s (%s)\n",
              FormatBytes(in.device_memory).c_str(), run.device_from.c_str(), FormatBytes(in.host_memory).c_str(),
              run.host_from.c_str(), in.nvme_free ? FormatBytes(in.nvme_free).c_str() : "?", run.nvme_from.c_str());
  if (in.reductions_on_device) {
    std::printf(
        "  collectives: NCCL on the device; the largest gradient reduction's staging is counted in device "
        "memory\n");
  }
  const sched::PlanRates& r = in.rates;
  std::printf("  rates: Adam %s params/s (%s)\n", FormatCount(r.adam_params_per_s.value).c_str(),
              r.adam_params_per_s.source.c_str());
  std::printf("         NVMe read %.3g GB/s (%s), write %.3g GB/s (%s)\n", r.nvme_read_gbps.value,
              r.nvme_read_gbps.source.c_str(), r.nvme_write_gbps.value, r.nvme_write_gbps.source.c_str());
  std::printf("         model %.3g GFLOP/s (%s)%s\n", r.model_gflops.value, r.model_gflops.source.c_str(),
              in.model.flops_per_micro_step > 0 ? "" : " - no compute term: no tokens (give --seq-len)");
  std::printf("         copies %.3g GB/s (%s), collectives %.3g GB/s (%s)\n", r.copy_gbps.value,
              r.copy_gbps.source.c_str(), r.comm_gbps.value, r.comm_gbps.source.c_str());
}

// One row per combination, then the notes of those that cannot run.
void PrintRows(const std::vector<sched::PlanRow>& rows) {
  std::printf("%-5s %-9s %-6s %11s %11s %11s %-12s %10s %10s %10s %10s\n", "stage", "optimizer", "param", "device",
              "host", "nvme", "fits", "step", "compute", "optimizer", "nvme io");
  for (const sched::PlanRow& row : rows) {
    std::string fits;
    if (!row.runnable) {
      fits = "not runnable";
    } else if (row.fits()) {
      fits = "yes";
    } else {
      fits = "no:";
      if (!row.fits_device) fits += " device";
      if (!row.fits_host) fits += " host";
      if (!row.fits_nvme) fits += " nvme";
    }
    std::printf("%-5d %-9s %-6s %11s %11s %11s %-12s %10s %10s %10s %10s\n", row.stage,
                std::string(OffloadDeviceName(row.optimizer)).c_str(),
                std::string(OffloadDeviceName(row.param)).c_str(), FormatBytes(row.device_bytes).c_str(),
                FormatBytes(row.host_bytes).c_str(), FormatBytes(row.nvme_bytes).c_str(), fits.c_str(),
                Seconds(row.step_s).c_str(), Seconds(row.compute_s).c_str(), Seconds(row.optimizer_s).c_str(),
                row.nvme_s > 0 ? Seconds(row.nvme_s).c_str() : "-");
  }
  std::printf(
      "bytes per rank as the engine allocates them (buffers, buckets, staging, activations included); host = "
      "pinned memory. step = max(compute, parameter shard reads) + copies + collectives + max(optimizer, nvme "
      "io) per optimizer step. --json has the breakdown.\n");
  for (const sched::PlanRow& row : rows) {
    if (row.runnable) continue;
    std::printf("note: stage %d, optimizer %s, param %s: %s\n", row.stage,
                std::string(OffloadDeviceName(row.optimizer)).c_str(),
                std::string(OffloadDeviceName(row.param)).c_str(), row.note.c_str());
  }
}

Status Run(const PlanOptions& opt) {
  PlanRun run;
  ZINF_RETURN_IF_ERROR(ResolveRanks(opt, run));
  ZINF_RETURN_IF_ERROR(ResolveShape(opt, run));
  ZINF_RETURN_IF_ERROR(ResolveAutoValues(opt, run));
  ZINF_RETURN_IF_ERROR(PlanTheModel(opt, run));
  if (Status s = ApplyPlanRateFlags(opt.rates, run.in.rates); !s.ok()) return BadInput(s.message());
  ZINF_RETURN_IF_ERROR(ResolveCapacities(opt, run));
  const std::vector<sched::PlanRow> rows = sched::PlanAll(run.in);
  if (opt.json) {
    std::printf("%s\n", sched::PlanToJson(run.in, rows).c_str());
    return Status::Ok();
  }
  PrintAssumptions(run);
  PrintRows(rows);
  return Status::Ok();
}

}  // namespace

void AddPlanRateOptions(CLI::App* cmd, PlanRateFlags& flags) {
  cmd->add_option("--adam-json", flags.adam_json, "Adam rate from `zinf bench adam --json` output");
  cmd->add_option("--aio-json", flags.aio_json,
                  "NVMe rates from `zinf aio sweep --json` (or aio read/write --json) "
                  "output; may repeat");
  cmd->add_option("--model-json", flags.model_json, "GFLOP/s from `zinf bench model --json` output");
  cmd->add_option("--copy-gbps", flags.copy_gbps, "Device copy bandwidth, GB/s (default 10)");
  cmd->add_option("--comm-gbps", flags.comm_gbps, "Collective bus bandwidth, GB/s (default 5)");
}

Status ApplyPlanRateFlags(const PlanRateFlags& flags, sched::PlanRates& rates) {
  using Apply = Status (*)(const std::string&, const std::string&, sched::PlanRates&);
  auto apply = [&](const std::string& path, const char* flag, Apply fn) -> Status {
    std::ifstream in(path);
    if (!in) return InvalidArgument(std::string(flag) + ": cannot read " + path);
    std::stringstream text;
    text << in.rdbuf();
    return fn(text.str(), path, rates).WithContext(flag);
  };
  if (!flags.adam_json.empty()) ZINF_RETURN_IF_ERROR(apply(flags.adam_json, "--adam-json", sched::ApplyAdamJson));
  for (const std::string& f : flags.aio_json) ZINF_RETURN_IF_ERROR(apply(f, "--aio-json", sched::ApplyAioJson));
  if (!flags.model_json.empty()) ZINF_RETURN_IF_ERROR(apply(flags.model_json, "--model-json", sched::ApplyModelJson));
  if (flags.copy_gbps < 0 || flags.comm_gbps < 0) return InvalidArgument("--copy-gbps and --comm-gbps must be > 0");
  if (flags.copy_gbps > 0) rates.copy_gbps = {flags.copy_gbps, "--copy-gbps"};
  if (flags.comm_gbps > 0) rates.comm_gbps = {flags.comm_gbps, "--comm-gbps"};
  return Status::Ok();
}

void RegisterPlan(CLI::App& app, int* exit_code) {
  auto opt = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Bytes per tier per rank, what fits and the predicted step time, for every ZeRO stage x offload");
  cmd->add_option("--config", opt->config, "DeepSpeed-style JSON config (buffer counts, buckets, precision, ...)");
  cmd->add_option("--model", opt->model, "A GPT preset: tiny, gpt2, gpt2-medium, ..., gpt-13b");
  cmd->add_option("--params", opt->params,
                  "A parameter count (e.g. 1.5B) instead of a model: --units equal units, "
                  "no activations");
  cmd->add_option("--units", opt->units, "Units for --params")->capture_default_str();
  cmd->add_option("--layers", opt->layers, "GPT shape: transformer blocks");
  cmd->add_option("--d-model", opt->d_model, "GPT shape: embedding width");
  cmd->add_option("--heads", opt->heads, "GPT shape: attention heads");
  cmd->add_option("--vocab", opt->vocab, "GPT shape: vocabulary size");
  cmd->add_option("--seq-len", opt->seq_len,
                  "Tokens per sequence (default: the model's context; with RoPE at most 4096)");
  cmd->add_option("--micro-batch", opt->micro_batch, "Sequences per micro-step per rank (default: the config's, or 1)");
  cmd->add_option("--grad-accum", opt->grad_accum, "Micro-steps per optimizer step (default: the config's, or 1)");
  cmd->add_option("--steps", opt->steps, "Optimizer steps of the run: resolves a scheduler's \"auto\" total_num_steps");
  cmd->add_flag("--checkpointing", opt->checkpointing, "Activation checkpointing");
  cmd->add_option("--dtype", opt->dtype, "Compute precision bf16, fp16 or fp32 (default: the config's)");
  cmd->add_option("--ranks", opt->ranks, "Number of ranks")->capture_default_str();
  cmd->add_option("--device", opt->device,
                  "The engine's device, auto, cpu, cuda or cuda:N (default: the config's "
                  "zinf.device); with several ranks on CUDA, NCCL's reduction staging is "
                  "counted");
  cmd->add_option("--device-memory", opt->device_memory,
                  "Device memory per rank (default: zinf.device_memory, "
                  "else HostDevice's 1/4 of RAM)");
  cmd->add_option("--host-memory", opt->host_memory,
                  "Pinned host memory per rank (default: zinf.host_memory, "
                  "else physical memory)");
  cmd->add_option("--nvme-free", opt->nvme_free, "Free NVMe space per rank (default: free space at nvme_path)");
  AddPlanRateOptions(cmd, opt->rates);
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  // Every error of zinf plan is bad input (exit code 2).
  cmd->callback([opt, exit_code] {
    const Status s = Run(*opt);
    if (!s.ok()) std::fprintf(stderr, "zinf plan: %s\n", s.message().c_str());
    *exit_code = s.ok() ? 0 : 2;
  });
}

}  // namespace zinf::tools
