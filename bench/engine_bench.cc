#include "bench/engine_bench.h"

#include "sched/device_kernels.h"

namespace zinf::bench {

void EngineCheck(const Status& s, const char* bench, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "zinf bench %s: %s: %s\n", bench, what, s.ToString().c_str());
  throw EngineBenchFail{1};
}

Status SyntheticCompute(Device& device, Stream& stream, double ms) {
  if (ms <= 0) return Status::Ok();
  return sched::KernelsFor(device.kind()).busy_wait(ms / 1e3, stream);
}

uint64_t RssOutsideDevice(const Device& device, uint64_t rss) {
  const uint64_t budget = device.memory_stats().budget_bytes;
  return device.kind() == DeviceKind::kHost && rss > budget ? rss - budget : rss;
}

void AddEngineBenchRunOptions(CLI::App* cmd, EngineBenchRun& run) {
  cmd->add_option("--units", run.units, "Units the parameters are split into")->capture_default_str();
  cmd->add_option("--compute-ms-per-unit", run.compute_ms, "Synthetic device compute per unit, forward and backward")
      ->capture_default_str();
  cmd->add_option("--steps", run.steps, "Timed steps after one warm-up")->capture_default_str();
  cmd->add_option("--threads", run.threads, "Optimizer threads (zinf.optimizer_threads)")->capture_default_str();
  cmd->add_option("--device", run.device, "cpu (HostDevice), cuda or cuda:N")->capture_default_str();
  cmd->add_flag("--json", run.json, "Print one JSON object");
}

}  // namespace zinf::bench
