// The `zinf` command-line tool. Subcommands:
//   zinf --version                   what was built and what this machine has
//   zinf config check FILE [...]     validate a DeepSpeed-style config, print the effective one
//   zinf plan [...]                  bytes per tier and step time for every stage x offload
//   zinf export CKPT OUT.safetensors  a checkpoint's weights, tensor by tensor
//   zinf aio read|write|sweep ...    NVMe throughput through zinf's I/O engine, and tuning
//   zinf bench <name> [...]          benchmarks (bench/)
// Exit codes: 0 success, 1 the operation failed (message on stderr),
// 2 bad command-line usage or a bad input file (one message naming the file
// and the key).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "bench/aio.h"
#include "bench/bench.h"
#include "tools/export.h"
#include "tools/plan.h"
#include "tools/train.h"
#include "common/logging.h"
#include "common/runtime_info.h"
#include "sched/backends.h"
#include "common/units.h"
#include "sched/state_bytes.h"
#include "zinf/config.h"

namespace {

struct ConfigCheckOptions {
  std::string file;
  int64_t hidden_size = 0;
  int64_t world_size = 1;
  std::string params;
  bool print = false;
};

std::string OffloadSummary(const char* what, zinf::OffloadDevice device, const std::vector<std::string>& paths) {
  std::string s = std::string(what) + " " + std::string(zinf::OffloadDeviceName(device));
  if (device == zinf::OffloadDevice::kNvme) {
    s += " (";
    for (size_t i = 0; i < paths.size(); ++i) s += (i ? ", " : "") + paths[i];
    s += ")";
  }
  return s;
}

// A file that cannot be read for a reason of the machine (EIO) is a failure;
// a missing or malformed one is bad input.
int BadInputExitCode(const zinf::Status& s) { return s.code() == zinf::StatusCode::kIoError ? 1 : 2; }

int RunConfigCheck(const ConfigCheckOptions& opt) {
  auto loaded = zinf::LoadConfigFile(opt.file);
  if (!loaded.ok()) {
    std::fprintf(stderr, "zinf config check: %s\n", loaded.status().message().c_str());
    return BadInputExitCode(loaded.status());
  }
  zinf::Config config = std::move(loaded).value();
  if (!config.auto_keys.empty()) {
    zinf::AutoContext ctx;
    if (opt.hidden_size > 0) ctx.hidden_size = opt.hidden_size;
    ctx.world_size = opt.world_size;
    auto resolved = zinf::ResolveAuto(config, ctx);
    if (!resolved.ok()) {
      std::fprintf(stderr, "zinf config check: %s\n", resolved.status().message().c_str());
      return 2;
    }
    for (const auto& line : *resolved) std::printf("auto: %s\n", line.c_str());
  }
  auto batch = zinf::ResolveBatchSizes(config, opt.world_size);
  if (!batch.ok()) {
    std::fprintf(stderr, "zinf config check: %s\n", batch.status().message().c_str());
    return 2;
  }
  const auto& z = config.zero;
  std::string precision = config.bf16.enabled ? "bf16" : config.fp16.enabled ? "fp16 (dynamic loss scale)" : "fp32";
  if (config.fp16.enabled && config.fp16.loss_scale > 0) precision = "fp16 (static loss scale)";
  std::printf("%s: ok (%zu warning%s)\n", opt.file.c_str(), config.warnings.size(),
              config.warnings.size() == 1 ? "" : "s");
  std::printf("  ZeRO stage %d, %s, %s, %s\n", z.stage,
              OffloadSummary("optimizer", z.offload_optimizer.device, z.offload_optimizer.nvme_path).c_str(),
              OffloadSummary("param", z.offload_param.device, z.offload_param.nvme_path).c_str(), precision.c_str());
  std::printf("  batch: %lld = micro %lld x accumulation %lld x world %lld\n",
              static_cast<long long>(batch->train_batch_size), static_cast<long long>(batch->micro_batch_size),
              static_cast<long long>(batch->gradient_accumulation_steps), static_cast<long long>(opt.world_size));
  if (!opt.params.empty()) {
    auto p = zinf::ParseParamCount(opt.params);
    if (!p.ok()) {
      std::fprintf(stderr, "zinf config check: --params: %s\n", p.status().message().c_str());
      return 2;
    }
    auto s =
        zinf::sched::ModelStateBytes(*p, opt.world_size, z.stage, z.offload_optimizer.device, z.offload_param.device);
    std::printf("  model state per rank for %s parameters: device %s, host %s, nvme %s\n",
                zinf::FormatCount(static_cast<double>(*p)).c_str(), zinf::FormatBytes(uint64_t(s.device)).c_str(),
                zinf::FormatBytes(uint64_t(s.host)).c_str(), zinf::FormatBytes(uint64_t(s.nvme)).c_str());
  }
  if (opt.print) std::printf("%s\n", config.ToJson().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zinf: train and fine-tune models far larger than GPU memory (ZeRO 1-3, Offload, Infinity)", "zinf"};
  app.set_version_flag(
      "--version", [] { return zinf::FormatRuntimeInfo(zinf::sched::ProbeRuntime()); },
      "Print the version, what was built and what this machine has");
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (default: $ZINF_LOG_LEVEL or info)");
  app.require_subcommand(1);
  int exit_code = 0;

  CLI::App* config = app.add_subcommand("config", "Work with DeepSpeed-style config files");
  config->require_subcommand(1);
  ConfigCheckOptions check;
  CLI::App* config_check = config->add_subcommand("check", "Validate a config and print what it resolves to");
  config_check->add_option("file", check.file, "DeepSpeed-style JSON config")->required();
  config_check->add_option("--hidden-size", check.hidden_size, "Model hidden size, to resolve \"auto\" bucket sizes");
  config_check->add_option("--world-size", check.world_size, "Number of ranks (for the batch sizes)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  config_check->add_option("--params", check.params,
                           "Parameter count (e.g. 1.5G), to print model-state bytes per rank");
  config_check->add_flag("--print", check.print, "Print the effective config as JSON (all defaults filled in)");
  config_check->callback([&] { exit_code = RunConfigCheck(check); });

  zinf::tools::RegisterTrain(app, &exit_code);
  zinf::tools::RegisterPlan(app, &exit_code);
  zinf::tools::RegisterExport(app, &exit_code);
  zinf::bench::RegisterAio(app, &exit_code);

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks; each measures its own reference and prints the ratio");
  zinf::bench::RegisterAll(*bench, &exit_code);

  app.parse_complete_callback([&] {
    if (!log_level.empty() && !zinf::SetLogLevel(log_level))
      throw CLI::ValidationError("--log-level", "unknown level '" + log_level + "'");
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
