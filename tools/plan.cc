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

struct Usage {
  std::string message;
};

uint64_t Size(const std::string& text, const char* flag) {
  auto v = ParseSize(text);
  if (!v.ok()) throw Usage{std::string(flag) + ": " + v.status().message()};
  if (*v == 0) throw Usage{std::string(flag) + ": must be > 0"};
  return *v;
}

void Check(const Status& s) {
  if (!s.ok()) throw Usage{s.message()};
}

std::string Seconds(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

int Run(const PlanOptions& opt) {
  PlanInput in;
  if (!opt.config.empty()) {
    auto c = LoadConfigFile(opt.config);
    if (!c.ok()) throw Usage{c.status().message()};
    in.config = std::move(*c);
  }
  if (opt.ranks < 1 || opt.ranks > (1 << 20)) throw Usage{"--ranks must be >= 1"};
  in.world_size = static_cast<int>(opt.ranks);
  // On a CUDA device several ranks reduce through NCCL, which stages on the
  // device ("auto" is CUDA when this machine has one, as in zinf train).
  const std::string device = opt.device.empty() ? in.config.zinf.device : opt.device;
  if (device != "auto" && device != "cpu" && device != "cuda" && device.rfind("cuda:", 0) != 0) {
    throw Usage{"--device " + device + ": expected auto, cpu, cuda or cuda:N"};
  }
  bool cuda = device.rfind("cuda", 0) == 0;
  if (device == "auto") {
    for (const BackendInfo& b : ProbeRuntime().backends) cuda |= b.name == "cuda" && b.usable;
  }
  in.reductions_on_device = cuda && in.world_size > 1;
  // ---- Which model: a preset, a shape, or a bare parameter count.
  const bool shape_flags = opt.layers > 0 || opt.d_model > 0 || opt.heads > 0 || opt.vocab > 0;
  if (!opt.model.empty() && !opt.params.empty()) throw Usage{"give --model or --params, not both"};
  if (!opt.params.empty() && shape_flags) throw Usage{"--params takes no --layers/--d-model/--heads/--vocab"};
  if (opt.params.empty() && opt.model.empty() && !shape_flags) {
    throw Usage{"give --model PRESET (" + [] {
      std::string s;
      for (const auto& n : model::GptPresetNames()) s += (s.empty() ? "" : ", ") + n;
      return s;
    }() + "), a shape (--layers, --d-model, --heads, --vocab, --seq-len) or --params N"};
  }
  if (opt.steps < 0) throw Usage{"--steps must be >= 1"};

  // ---- The model.
  model::GptConfig mc;
  if (!opt.model.empty()) {
    auto p = model::GptPreset(opt.model);
    if (!p.ok()) throw Usage{"--model: " + p.status().message()};
    mc = *p;
  } else {
    mc = DefaultTrainModel();  // zinf train's default shape
  }
  if (opt.layers > 0) mc.num_layers = opt.layers;
  if (opt.d_model > 0) mc.embed_dim = opt.d_model;
  if (opt.heads > 0) mc.num_heads = opt.heads;
  if (opt.vocab > 0) mc.vocab_size = opt.vocab;
  if (opt.seq_len > 0 && opt.model.empty()) mc.max_seq_len = opt.seq_len;

  std::vector<std::string> auto_lines;
  // ---- "auto" values, from the model's shape and --steps, as zinf train
  // resolves them (DeepSpeed's Hugging Face integration does the same).
  if (!in.config.auto_keys.empty()) {
    AutoContext ctx;
    ctx.world_size = in.world_size;
    ctx.min_reduce_bucket_elems = kNormBlock;
    if (opt.params.empty()) ctx.hidden_size = mc.embed_dim;
    if (opt.steps > 0) ctx.total_num_steps = opt.steps;
    auto r = ResolveAuto(in.config, ctx);
    if (!r.ok()) {
      const std::string& m = r.status().message();
      throw Usage{m + (m.find("hidden size") != std::string::npos ? " (--params gives none: use --model or --d-model)" : "") +
                  (m.find("total_num_steps") != std::string::npos ? " (give --steps)" : "")};
    }
    auto_lines = std::move(*r);
  }
  if (!opt.dtype.empty()) {
    if (opt.dtype != "bf16" && opt.dtype != "fp16" && opt.dtype != "fp32") {
      throw Usage{"--dtype: expected bf16, fp16 or fp32, got '" + opt.dtype + "'"};
    }
    in.config.bf16.enabled = opt.dtype == "bf16";
    in.config.fp16.enabled = opt.dtype == "fp16";
  }
  const DType compute = in.config.bf16.enabled   ? DType::kBFloat16
                        : in.config.fp16.enabled ? DType::kFloat16
                                                 : DType::kFloat32;
  if (opt.micro_batch < 0 || opt.grad_accum < 0 || opt.seq_len < 0) {
    throw Usage{"--micro-batch, --grad-accum and --seq-len must be >= 1"};
  }
  if (opt.micro_batch > 0) in.config.train_micro_batch_size_per_gpu = opt.micro_batch;
  if (opt.grad_accum > 0) in.config.gradient_accumulation_steps = opt.grad_accum;
  auto batch = ResolveBatchSizes(in.config, in.world_size);
  if (!batch.ok()) throw Usage{batch.status().message()};
  in.gradient_accumulation_steps = batch->gradient_accumulation_steps;
  const int64_t B = batch->micro_batch_size;

  if (!opt.params.empty()) {
    auto n = ParseParamCount(opt.params);
    if (!n.ok()) throw Usage{"--params: " + n.status().message()};
    if (opt.units < 1) throw Usage{"--units must be >= 1"};
    int64_t tokens = 0;
    if (opt.seq_len > 0 && __builtin_mul_overflow(B, opt.seq_len, &tokens)) {
      throw Usage{"--seq-len " + std::to_string(opt.seq_len) + " x micro batch " + std::to_string(B) + " overflows"};
    }
    auto m = PlanParamsModel(*n, opt.units, tokens);
    if (!m.ok()) throw Usage{m.status().message()};
    in.model = std::move(*m);
  } else {
    auto m = PlanGptModel(mc, B, opt.seq_len, opt.checkpointing, compute, in.config.zinf.matmul,
                          model::ToAttentionKernel(in.config.zinf.attention));
    if (!m.ok()) throw Usage{m.status().message()};
    in.model = std::move(*m);
  }

  // ---- Rates.
  Check(ApplyPlanRateFlags(opt.rates, in.rates));

  // ---- Capacities.
  std::string device_from, host_from, nvme_from;
  if (!opt.device_memory.empty()) {
    in.device_memory = Size(opt.device_memory, "--device-memory");
    device_from = "--device-memory";
  } else if (in.config.zinf.device_memory > 0) {
    in.device_memory = in.config.zinf.device_memory;
    device_from = "zinf.device_memory";
  } else {
    in.device_memory = PhysicalMemoryBytes() / 4;
    device_from = "default: HostDevice's 1/4 of RAM";
  }
  if (!opt.host_memory.empty()) {
    in.host_memory = Size(opt.host_memory, "--host-memory");
    host_from = "--host-memory";
  } else if (in.config.zinf.host_memory > 0) {
    in.host_memory = in.config.zinf.host_memory;
    host_from = "zinf.host_memory";
  } else {
    in.host_memory = PinnedBudgetBytes(in.config);
    host_from = "default: physical memory, the engine's pinned budget";
  }
  if (!opt.nvme_free.empty()) {
    in.nvme_free = Size(opt.nvme_free, "--nvme-free");
    nvme_from = "--nvme-free";
  } else if (const std::string path = PlanNvmePath(in.config); !path.empty()) {
    if (auto free = FreeBytesAt(path); free.ok()) {
      in.nvme_free = *free;
      nvme_from = "free space at " + path;
    } else {
      nvme_from = "not checked: " + path + " not found; give --nvme-free";
    }
  } else {
    nvme_from = "not checked: give --nvme-free";
  }

  const std::vector<PlanRow> rows = PlanAll(in);
  if (opt.json) {
    std::printf("%s\n", PlanToJson(in, rows).c_str());
    return 0;
  }
  std::printf("zinf plan: %s; %d rank(s), %s compute, accumulation %lld\n", in.model.description.c_str(),
              in.world_size, std::string(DTypeName(compute)).c_str(),
              static_cast<long long>(in.gradient_accumulation_steps));
  std::printf("  activations: %s\n", in.model.activation_note.c_str());
  for (const std::string& line : auto_lines) std::printf("  auto: %s\n", line.c_str());
  std::printf("  capacity per rank: device %s (%s), host %s (%s), nvme %s (%s)\n",
              FormatBytes(in.device_memory).c_str(), device_from.c_str(), FormatBytes(in.host_memory).c_str(),
              host_from.c_str(), in.nvme_free ? FormatBytes(in.nvme_free).c_str() : "?", nvme_from.c_str());
  if (in.reductions_on_device) {
    std::printf("  collectives: NCCL on the device; the largest gradient reduction's staging is counted in device "
                "memory\n");
  }
  const PlanRates& r = in.rates;
  std::printf("  rates: Adam %s params/s (%s)\n", FormatCount(r.adam_params_per_s.value).c_str(),
              r.adam_params_per_s.source.c_str());
  std::printf("         NVMe read %.3g GB/s (%s), write %.3g GB/s (%s)\n", r.nvme_read_gbps.value,
              r.nvme_read_gbps.source.c_str(), r.nvme_write_gbps.value, r.nvme_write_gbps.source.c_str());
  std::printf("         model %.3g GFLOP/s (%s)%s\n", r.model_gflops.value, r.model_gflops.source.c_str(),
              in.model.flops_per_micro_step > 0 ? "" : " - no compute term: no tokens (give --seq-len)");
  std::printf("         copies %.3g GB/s (%s), collectives %.3g GB/s (%s)\n", r.copy_gbps.value,
              r.copy_gbps.source.c_str(), r.comm_gbps.value, r.comm_gbps.source.c_str());
  std::printf("%-5s %-9s %-6s %11s %11s %11s %-12s %10s %10s %10s %10s\n", "stage", "optimizer", "param", "device",
              "host", "nvme", "fits", "step", "compute", "optimizer", "nvme io");
  for (const PlanRow& row : rows) {
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
                std::string(OffloadDeviceName(row.optimizer)).c_str(), std::string(OffloadDeviceName(row.param)).c_str(),
                FormatBytes(row.device_bytes).c_str(), FormatBytes(row.host_bytes).c_str(),
                FormatBytes(row.nvme_bytes).c_str(), fits.c_str(), Seconds(row.step_s).c_str(),
                Seconds(row.compute_s).c_str(), Seconds(row.optimizer_s).c_str(),
                row.nvme_s > 0 ? Seconds(row.nvme_s).c_str() : "-");
  }
  std::printf("bytes per rank as the engine allocates them (buffers, buckets, staging, activations included); host = "
              "pinned memory. step = max(compute, parameter shard reads) + copies + collectives + max(optimizer, nvme "
              "io) per optimizer step. --json has the breakdown.\n");
  for (const PlanRow& row : rows) {
    if (row.runnable) continue;
    std::printf("note: stage %d, optimizer %s, param %s: %s\n", row.stage,
                std::string(OffloadDeviceName(row.optimizer)).c_str(),
                std::string(OffloadDeviceName(row.param)).c_str(), row.note.c_str());
  }
  return 0;
}

}  // namespace

void AddPlanRateOptions(CLI::App* cmd, PlanRateFlags& flags) {
  cmd->add_option("--adam-json", flags.adam_json, "Adam rate from `zinf bench adam --json` output");
  cmd->add_option("--aio-json", flags.aio_json, "NVMe rates from `zinf aio sweep --json` (or aio read/write --json) "
                                                "output; may repeat");
  cmd->add_option("--model-json", flags.model_json, "GFLOP/s from `zinf bench model --json` output");
  cmd->add_option("--copy-gbps", flags.copy_gbps, "Device copy bandwidth, GB/s (default 10)");
  cmd->add_option("--comm-gbps", flags.comm_gbps, "Collective bus bandwidth, GB/s (default 5)");
}

Status ApplyPlanRateFlags(const PlanRateFlags& flags, PlanRates& rates) {
  using Apply = Status (*)(const std::string&, const std::string&, PlanRates&);
  auto apply = [&](const std::string& path, const char* flag, Apply fn) -> Status {
    std::ifstream in(path);
    if (!in) return InvalidArgument(std::string(flag) + ": cannot read " + path);
    std::stringstream text;
    text << in.rdbuf();
    return fn(text.str(), path, rates).WithContext(flag);
  };
  if (!flags.adam_json.empty()) ZINF_RETURN_IF_ERROR(apply(flags.adam_json, "--adam-json", ApplyAdamJson));
  for (const std::string& f : flags.aio_json) ZINF_RETURN_IF_ERROR(apply(f, "--aio-json", ApplyAioJson));
  if (!flags.model_json.empty()) ZINF_RETURN_IF_ERROR(apply(flags.model_json, "--model-json", ApplyModelJson));
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
  cmd->add_option("--params", opt->params, "A parameter count (e.g. 1.5B) instead of a model: --units equal units, "
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
  cmd->add_option("--device", opt->device, "The engine's device, auto, cpu, cuda or cuda:N (default: the config's "
                                           "zinf.device); with several ranks on CUDA, NCCL's reduction staging is "
                                           "counted");
  cmd->add_option("--device-memory", opt->device_memory, "Device memory per rank (default: zinf.device_memory, "
                                                         "else HostDevice's 1/4 of RAM)");
  cmd->add_option("--host-memory", opt->host_memory, "Pinned host memory per rank (default: zinf.host_memory, "
                                                     "else physical memory)");
  cmd->add_option("--nvme-free", opt->nvme_free, "Free NVMe space per rank (default: free space at nvme_path)");
  AddPlanRateOptions(cmd, opt->rates);
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  cmd->callback([opt, exit_code] {
    try {
      *exit_code = Run(*opt);
    } catch (const Usage& u) {
      std::fprintf(stderr, "zinf plan: %s\n", u.message.c_str());
      *exit_code = 2;
    }
  });
}

}  // namespace zinf::tools
