// `zinf bench stage3`: ZeRO stage 3 with the parameter shards and the
// optimizer state offloaded (ZeRO-Infinity with both on NVMe), over
// synthetic units on a device of --device-memory. Each unit's forward and
// backward is a wait of --compute-ms-per-unit on the device stream (no CPU
// used), standing in for device compute.
//
// It reports the step time; the stall (the step time the client stream
// spent not computing — waiting on the engine — over forward+backward time
// measured alone in the same run); the bytes each tier moved and their rates; the plan's
// predicted device and pinned host peaks against the measured ones; and, in
// the same run, the I/O bound: the same io_uring engine and a swap store on
// --path reading, then writing, the same bytes (written beforehand) with
// nothing else running — each step reads every shard twice (forward and
// backward gathers) and the optimizer state once, and writes both once.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "bench/engine_bench.h"
#include "common/logging.h"
#include "common/units.h"
#include "cpu/host_device.h"
#include "cpu/io_memory.h"
#include "cpu/pinned_pool.h"
#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "sched/plan.h"
#include "zinf/engine.h"

namespace zinf::bench {
namespace {

struct Options : EngineBenchRun {
  std::string params = "1B";
  std::string device_memory = "1G";
  std::string offload_param = "nvme";
  std::string offload_optimizer = "nvme";
  std::string path;                    // the directory of the swap stores (nvme)
  std::string sub_group_size = "50M";  // optimizer nvme: elements per sub-group
  std::string host_memory;             // zinf.host_memory: the pinned budget (empty: the machine's RAM)
  int buffer_count = 4;                // offload_optimizer.buffer_count: swap buffers (sub-groups in flight)
};

template <class T>
T Check(Result<T> r, const char* what) {
  return EngineCheck(std::move(r), "stage3", what);
}
void Check(const Status& s, const char* what) { EngineCheck(s, "stage3", what); }

Result<OffloadDevice> Tier(const std::string& s, const char* flag) {
  if (s == "none") return OffloadDevice::kNone;
  if (s == "cpu") return OffloadDevice::kCpu;
  if (s == "nvme") return OffloadDevice::kNvme;
  return InvalidArgument(std::string(flag) + " must be none, cpu or nvme (got '" + s + "')");
}

// The I/O bound of one step: `shard_bytes` per unit read twice and written
// once, `group_bytes` per sub-group read once and written once, through
// four requests in flight, on extents written beforehand: every read, then
// every write. Seconds of each phase.
struct BoundTimes {
  double read = 0, write = 0;
};
BoundTimes IoBound(const std::string& path, const std::vector<uint64_t>& shard_bytes,
                   const std::vector<uint64_t>& group_bytes) {
  Config io_config;
  io_config.zero.offload_optimizer.nvme_path = {path};
  auto io = Check(nvme::IoEngine::Create(nvme::IoEngineOptionsFromConfig(io_config)), "io engine");
  std::vector<uint64_t> tensors = shard_bytes;
  tensors.insert(tensors.end(), group_bytes.begin(), group_bytes.end());
  nvme::SwapStoreOptions so;
  so.dirs = {path};
  uint64_t largest = 0;
  for (uint64_t b : tensors) {
    so.capacity_bytes += b + 2 * so.extent_bytes;
    largest = std::max(largest, b);
  }
  auto store = Check(nvme::SwapStore::Create(*io, so), "swap store");
  constexpr int kDepth = 4;
  const uint64_t padded = (largest + 4095) / 4096 * 4096;
  // The engine's kind of buffer (huge pages, cpu/io_memory.h), so that the
  // bound moves bytes as the engine can.
  std::vector<cpu::IoMemory> bufs;
  for (int b = 0; b < kDepth; ++b) {
    bufs.push_back(cpu::AllocateIoMemory(padded));
    if (!bufs.back()) Check(OutOfMemory("I/O bound buffers"), "buffers");
    std::memset(bufs.back().get(), 1, padded);
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    Check(store->Allocate(t, tensors[t]), "allocate");
    Check(store->Write(t, bufs[0].get()).Wait(), "pre-write");
  }
  // The step's requests in its order: shards (forward), shards (backward),
  // then each sub-group read and written, then the new shards written.
  struct Op {
    size_t tensor;
    bool write;
  };
  std::vector<Op> ops;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t u = 0; u < shard_bytes.size(); ++u) ops.push_back({u, false});
  }
  for (size_t g = 0; g < group_bytes.size(); ++g) ops.push_back({shard_bytes.size() + g, false});
  for (size_t g = 0; g < group_bytes.size(); ++g) ops.push_back({shard_bytes.size() + g, true});
  for (size_t u = 0; u < shard_bytes.size(); ++u) ops.push_back({u, true});
  BoundTimes times;
  for (bool write : {false, true}) {
    std::vector<nvme::IoRequest> reqs;
    const double t0 = NowSeconds();
    for (const Op& op : ops) {
      if (op.write != write) continue;
      if (reqs.size() >= kDepth) Check(reqs[reqs.size() - kDepth].Wait(), "bound I/O");
      char* buf = bufs[reqs.size() % kDepth].get();
      reqs.push_back(write ? store->Write(op.tensor, buf) : store->Read(op.tensor, buf));
    }
    for (auto& r : reqs) {
      if (r.valid()) Check(r.Wait(), "bound I/O");
    }
    (write ? times.write : times.read) = NowSeconds() - t0;
  }
  return times;
}

int Run(const Options& opt) {
  auto count = ParseCount(opt.params);
  auto memory = ParseSize(opt.device_memory);
  auto sub_group = ParseCount(opt.sub_group_size);
  auto host_budget = opt.host_memory.empty() ? Result<uint64_t>(uint64_t{0}) : ParseSize(opt.host_memory);
  auto param_tier = Tier(opt.offload_param, "--offload-param");
  auto opt_tier = Tier(opt.offload_optimizer, "--offload-optimizer");
  std::string bad;
  if (!count.ok() || *count < static_cast<uint64_t>(std::max(1, opt.units)))
    bad = "--params must be a count >= --units";
  else if (opt.units < 1 || opt.steps < 1 || opt.threads < 1)
    bad = "--units, --steps and --threads must be >= 1";
  else if (!memory.ok() || *memory == 0)
    bad = "--device-memory must be a size, e.g. 1G";
  else if (!sub_group.ok() || *sub_group == 0)
    bad = "--sub-group-size must be a positive count, e.g. 50M";
  else if (!param_tier.ok())
    bad = param_tier.status().message();
  else if (!opt_tier.ok())
    bad = opt_tier.status().message();
  else if (opt.compute_ms < 0)
    bad = "--compute-ms-per-unit must be >= 0";
  else if (opt.buffer_count < 1 || opt.buffer_count > 64)
    bad = "--buffer-count must be 1 to 64";
  else if (!host_budget.ok() || (!opt.host_memory.empty() && *host_budget == 0))
    bad = "--host-memory must be a size, e.g. 4G";
  else if ((*param_tier == OffloadDevice::kNvme || *opt_tier == OffloadDevice::kNvme) && opt.path.empty())
    bad = "NVMe offload needs --path DIR (a directory on the NVMe to measure)";
  else if (opt.device != "cpu" && opt.device != "cuda" && opt.device.rfind("cuda:", 0) != 0)
    bad = "--device must be cpu, cuda or cuda:N";
  if (!bad.empty()) {
    std::fprintf(stderr, "zinf bench stage3: %s\n", bad.c_str());
    return 2;
  }
  const int64_t per_unit = static_cast<int64_t>(*count) / opt.units;
  const int64_t P = per_unit * opt.units;
  const uint64_t host_memory = *host_budget;

  // The engine's configuration: every unit partitioned; shards on NVMe keep
  // nothing in host memory (max_in_cpu 0); each unit's gradients reduced as
  // the next unit's arrive (one unit per reduce bucket), so two units'
  // gradients at most are on the device.
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 3;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_model_persistence_threshold = 0;
  c.zero.reduce_bucket_size = std::max<int64_t>(per_unit, 65536);
  // Prefetch one unit ahead; at most three units gathered (the one in use,
  // the next, one kept for reuse across the forward/backward turn).
  const int64_t padded_unit = (per_unit + 65535) / 65536 * 65536;  // units pad to whole norm blocks
  c.zero.stage3_prefetch_bucket_size = padded_unit;
  c.zero.stage3_max_live_parameters = 3 * padded_unit;
  c.zero.stage3_max_reuse_distance = padded_unit;
  c.zero.overlap_comm = true;
  c.zero.offload_param.device = *param_tier;
  c.zero.offload_param.pin_memory = true;
  c.zero.offload_param.max_in_cpu = 0;
  c.zero.offload_optimizer.device = *opt_tier;
  c.zero.offload_optimizer.pin_memory = true;
  if (!opt.path.empty()) {
    c.zero.offload_param.nvme_path = {opt.path};
    c.zero.offload_optimizer.nvme_path = {opt.path};
  }
  c.zero.sub_group_size = static_cast<int64_t>(*sub_group);
  c.zero.offload_optimizer.buffer_count = opt.buffer_count;
  c.zinf.optimizer_threads = opt.threads;
  c.zinf.host_memory = host_memory;

  sched::PlanInput in;
  in.config = c;
  in.model = Check(sched::PlanParamsModel(P, opt.units), "plan");
  in.device_memory = *memory;
  in.host_memory = sched::PinnedBudgetBytes(c);
  in.host_device = opt.device == "cpu";
  const sched::PlanRow plan = sched::PlanCombination(in, 3, *opt_tier, *param_tier);
  if (!plan.runnable || !plan.fits_device || !plan.fits_host) {
    std::fprintf(stderr, "zinf bench stage3: the plan does not fit: %s (device %s of %s, host pinned %s of %s)\n",
                 !plan.runnable      ? plan.note.c_str()
                 : !plan.fits_device ? "device memory"
                                     : "host memory",
                 FormatBytes(plan.device_bytes).c_str(), FormatBytes(*memory).c_str(),
                 FormatBytes(plan.host_bytes).c_str(), FormatBytes(in.host_memory).c_str());
    return 2;
  }
  if (!opt.json) {
    std::printf(
        "# zinf bench stage3: %s parameters in %d units, bf16, ZeRO stage 3, offload_param %s, "
        "offload_optimizer %s (%d swap buffers), device %s of %s, %d optimizer threads (%u cores), compute %.1f ms "
        "per unit and pass\n",
        FormatCount(static_cast<double>(P)).c_str(), opt.units, opt.offload_param.c_str(),
        opt.offload_optimizer.c_str(), opt.buffer_count, opt.device.c_str(), FormatBytes(*memory).c_str(), opt.threads,
        std::thread::hardware_concurrency(), opt.compute_ms);
    std::printf("# plan: device %s, host pinned %s, nvme %s\n", FormatBytes(plan.device_bytes).c_str(),
                FormatBytes(plan.host_bytes).c_str(), FormatBytes(plan.nvme_bytes).c_str());
    std::fflush(stdout);
  }

  // 1. The I/O bound of the same bytes, alone: measured before the engine
  // runs and again after it, the faster of the two kept (a shared disk's
  // rate drifts; the step is compared with the better one).
  uint64_t bound_read = 0, bound_written = 0;
  std::vector<uint64_t> shards, groups;
  {
    if (*param_tier == OffloadDevice::kNvme) shards.assign(opt.units, static_cast<uint64_t>(per_unit) * 2);
    if (*opt_tier == OffloadDevice::kNvme) {
      const int64_t limit = std::min<int64_t>(static_cast<int64_t>(*sub_group),
                                              static_cast<int64_t>(cpu::PinnedPool::kMaxBufferBytes / 12));
      const int64_t per_group = std::max<int64_t>(1, limit / per_unit);
      for (int64_t u = 0; u < opt.units; u += per_group) {
        groups.push_back(static_cast<uint64_t>(std::min<int64_t>(per_group, opt.units - u) * per_unit) * 12);
      }
    }
    for (uint64_t b : shards) {
      bound_read += 2 * b;
      bound_written += b;
    }
    for (uint64_t b : groups) {
      bound_read += b;
      bound_written += b;
    }
  }
  auto measure_bound = [&]() -> BoundTimes {
    if (bound_read == 0) return {};
    if (!opt.json)
      std::fprintf(stderr, "  measuring the I/O bound (%s read, %s written)...\n", FormatBytes(bound_read).c_str(),
                   FormatBytes(bound_written).c_str());
    return IoBound(opt.path, shards, groups);
  };
  const BoundTimes bound_before = measure_bound();
  // From here on the peak RSS is the engine's (the bound's buffers are gone).
  if (!ResetPeakRss()) ZINF_LOG_WARN("bench stage3: the kernel refused to reset the peak RSS: it is the process's");

  DeviceOptions dopt;
  dopt.spec = opt.device;
  dopt.memory_budget = *memory;
  auto device = Check(CreateDevice(dopt), "device");
  auto stream = Check(device->CreateStream(), "stream");

  // 2. Forward + backward alone: the waits, on the stream; the fastest of
  // three (a reference: a load spike in one try is not the compute's time).
  double compute_alone = 0;
  if (opt.compute_ms > 0) {
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = NowSeconds();
      for (int u = 0; u < 2 * opt.units; ++u) Check(SyntheticCompute(*device, *stream, opt.compute_ms), "compute");
      Check(stream->Synchronize(), "compute");
      const double t = NowSeconds() - t0;
      compute_alone = rep == 0 ? t : std::min(compute_alone, t);
    }
  }

  // 3. The engine. Gradients: GradsReady without GradBuffers, so the
  // engine's zeroed buffer stands in for what backward writes.
  if (!opt.json) std::fprintf(stderr, "  registering %d units (initial state written to its tiers)...\n", opt.units);
  auto engine = Check(Engine::Create(c, *device, nullptr), "engine");
  for (int u = 0; u < opt.units; ++u) {
    Check(engine->AddUnit("unit" + std::to_string(u), {{"w", {per_unit}, DType::kFloat32, nullptr}}), "register");
  }
  // When the client stream finishes each timed step's backward (a task on
  // it): the steady-state step time is the interval between these, as in a
  // long run where every step's update overlaps the next forward. The
  // warm-up step is drained before the timed ones start, so the first timed
  // step's forward overlaps no update and only the intervals after it
  // count. The run's last update, which nothing follows, is reported apart.
  std::mutex marks_mu;
  std::vector<double> marks;
  double timed_start = 0;
  auto mark = [&](int s) {
    Check(stream->Enqueue([&, s](const StreamContext&) {
      const double now = NowSeconds();
      std::lock_guard lock(marks_mu);
      marks.push_back(now);
      if (!opt.json) {
        const double each = (now - timed_start) / static_cast<double>(marks.size());
        std::fprintf(stderr, "\r  step %d/%d: %.2f s/step, ETA %.0f s   ", s, opt.steps, each,
                     each * static_cast<double>(opt.steps - static_cast<int>(marks.size())));
      }
      return Status::Ok();
    }),
          "mark");
  };
  auto one_step = [&](int s) {
    for (int u = 0; u < opt.units; ++u) {
      Check(engine->Fetch(u, *stream), "fetch");
      Check(SyntheticCompute(*device, *stream, opt.compute_ms), "compute");
      Check(engine->Release(u, *stream), "release");
    }
    for (int u = opt.units - 1; u >= 0; --u) {
      Check(engine->Fetch(u, *stream), "fetch");
      Check(SyntheticCompute(*device, *stream, opt.compute_ms), "compute");
      Check(engine->GradsReady(u, *stream), "grads ready");
      Check(engine->Release(u, *stream), "release");
    }
    if (s > 0) mark(s);
    Check(engine->Step(), "step");
  };
  one_step(0);  // warm-up: records the trace, first touches
  Check(stream->Synchronize(), "sync");
  Check(engine->Synchronize(), "sync");
  const StepStats warm = Check(engine->Stats(), "stats");
  // Steps back to back: each step's update overlaps the next forward.
  timed_start = NowSeconds();
  for (int s = 1; s <= opt.steps; ++s) one_step(s);
  Check(stream->Synchronize(), "sync");
  const double last_backward = NowSeconds();
  Check(engine->Synchronize(), "sync");
  const double drain = NowSeconds() - last_backward;  // the last update, overlapping nothing
  // One timed step has no steady-state interval: its forward, backward and
  // update, nothing overlapping them.
  const double step = opt.steps >= 2 ? (marks.back() - marks.front()) / (opt.steps - 1) : NowSeconds() - timed_start;
  if (!opt.json) std::fprintf(stderr, "\n");
  const StepStats last = Check(engine->Stats(), "stats");
  const DeviceMemoryStats dm = device->memory_stats();
  const bool host_device = device->kind() == DeviceKind::kHost;
  const uint64_t rss = PeakRssBytes();
  const uint64_t rss_outside_device = RssOutsideDevice(*device, rss);
  // Per timed step, from the totals (a step's first shard reads overlap the
  // previous step's updates, so one step's own figures are not exact).
  const uint64_t nvme_read = (last.nvme_bytes_read_total - warm.nvme_bytes_read_total) / opt.steps;
  const uint64_t nvme_written = (last.nvme_bytes_written_total - warm.nvme_bytes_written_total) / opt.steps;
  engine.reset();  // its pinned buffers and swap files go before the bound runs again
  const BoundTimes bound_after = measure_bound();
  // The bound of the bytes the engine moved in its last step (it reads a
  // shard again in backward only when the gathered copy was not kept), at
  // the rates the store reached alone: the faster run of each phase.
  double io_bound = 0;
  if (bound_read > 0) {
    const double read_s = std::min(bound_before.read, bound_after.read);
    const double write_s = std::min(bound_before.write, bound_after.write);
    io_bound = read_s * static_cast<double>(nvme_read) / static_cast<double>(bound_read) +
               write_s * static_cast<double>(nvme_written) / static_cast<double>(bound_written);
  }
  // The client stream computes compute_alone per step; the rest of the step
  // it waited on the engine (the host enqueues far ahead of it).
  const double stall = compute_alone > 0 ? std::max(0.0, step - compute_alone) : 0.0;
  const double stall_frac = compute_alone > 0 ? stall / compute_alone : 0.0;
  const double nvme_rate = static_cast<double>(nvme_read + nvme_written) / step / 1e9;
  if (opt.json) {
    nlohmann::json j = {
        {"bench", "stage3"},
        {"params", P},
        {"units", opt.units},
        {"offload_param", opt.offload_param},
        {"offload_optimizer", opt.offload_optimizer},
        {"device", device->name()},
        {"device_memory_bytes", *memory},
        {"threads", opt.threads},
        {"buffer_count", opt.buffer_count},
        {"compute_ms_per_unit", opt.compute_ms},
        {"step_seconds", step},
        {"last_update_seconds", drain},
        {"compute_alone_seconds", compute_alone},
        {"step_over_compute", compute_alone > 0 ? step / compute_alone : 0.0},
        {"stall_seconds", stall},
        {"stall_fraction", stall_frac},
        {"io_bound_seconds", io_bound},
        {"io_bound_read_gb_per_s", bound_read / std::min(bound_before.read, bound_after.read) / 1e9},
        {"io_bound_write_gb_per_s", bound_written / std::min(bound_before.write, bound_after.write) / 1e9},
        {"step_over_io_bound", io_bound > 0 ? step / io_bound : 0.0},
        {"io_bound_bytes_read", bound_read},
        {"io_bound_bytes_written", bound_written},
        {"nvme_bytes_read", nvme_read},
        {"nvme_bytes_written", nvme_written},
        {"nvme_gb_per_s", nvme_rate},
        {"copy_bytes", last.copy_bytes},
        {"io_wait_seconds", last.io_seconds},
        {"optimizer_seconds", last.optimizer_seconds},
        {"prefetch_hits", last.prefetch_hits},
        {"fetches", last.fetches},
        {"device_peak_bytes", dm.peak_in_use_bytes},
        {"plan_device_bytes", plan.device_bytes},
        {"host_peak_pinned_bytes", last.host_peak_pinned_bytes},
        {"plan_host_bytes", plan.host_bytes},
        {"host_memory_budget_bytes", in.host_memory},
        {"peak_rss_bytes", rss},
        {"peak_rss_outside_device_bytes", rss_outside_device}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%8s %10s %12s %8s %7s %10s %12s %10s %10s %9s\n", "step s", "compute s", "step/compute", "stall s",
              "stall", "io bound s", "step/io bound", "nvme read", "written", "nvme GB/s");
  std::printf("%8.3f %10.3f %12.2f %8.3f %6.1f%% %10.3f %12.2f %10s %10s %9.2f\n", step, compute_alone,
              compute_alone > 0 ? step / compute_alone : 0.0, stall, 100 * stall_frac, io_bound,
              io_bound > 0 ? step / io_bound : 0.0, FormatBytes(nvme_read).c_str(), FormatBytes(nvme_written).c_str(),
              nvme_rate);
  if (bound_read > 0) {
    std::printf(
        "# the I/O bound: the same store reading %s, then writing %s (every shard twice and the optimizer "
        "state once, then both once) alone, before the engine ran and after: read %.2f / %.2f GB/s, write "
        "%.2f / %.2f GB/s; the bound is the engine's step bytes at the faster rates\n",
        FormatBytes(bound_read).c_str(), FormatBytes(bound_written).c_str(), bound_read / bound_before.read / 1e9,
        bound_read / bound_after.read / 1e9, bound_written / bound_before.write / 1e9,
        bound_written / bound_after.write / 1e9);
  }
  if (opt.steps >= 2) {
    std::printf(
        "# step: the mean of the %d intervals between the ends of consecutive timed backwards (the steady "
        "state: each holds the previous update overlapped with a forward); the run's last update, which no "
        "forward follows, took %.3f s more\n",
        opt.steps - 1, drain);
  } else {
    std::printf(
        "# step: one step's forward, backward and update with nothing overlapping (--steps 2 or more for the "
        "steady state)\n");
  }
  std::printf(
      "# last step: host<->device copies %s (%.2f GB/s), nvme waits %.3f s, optimizer %.3f s, %lld/%lld gathers "
      "prefetched\n",
      FormatBytes(last.copy_bytes).c_str(), static_cast<double>(last.copy_bytes) / step / 1e9, last.io_seconds,
      last.optimizer_seconds, static_cast<long long>(last.prefetch_hits), static_cast<long long>(last.fetches));
  std::printf("# device peak %s (plan %s); host pinned peak %s (plan %s, budget %s); peak RSS %s",
              FormatBytes(dm.peak_in_use_bytes).c_str(), FormatBytes(plan.device_bytes).c_str(),
              FormatBytes(last.host_peak_pinned_bytes).c_str(), FormatBytes(plan.host_bytes).c_str(),
              FormatBytes(in.host_memory).c_str(), FormatBytes(rss).c_str());
  if (host_device) {
    std::printf(", %s of it outside HostDevice's %s of device memory", FormatBytes(rss_outside_device).c_str(),
                FormatBytes(dm.budget_bytes).c_str());
  }
  std::printf("\n");
  for (const sched::PlanItem& item : plan.nvme_items) {
    if (item.what.find("gradients") != std::string::npos) {
      std::printf("# gradients: swapped to NVMe (%s; the host budget decides), %s of host gradient buffers\n",
                  FormatBytes(item.bytes).c_str(),
                  [&] {
                    for (const sched::PlanItem& h : plan.host_items) {
                      if (h.what.find("gradient buffers") != std::string::npos) return FormatBytes(h.bytes);
                    }
                    return std::string("none");
                  }()
                      .c_str());
    }
  }
  return 0;
}

}  // namespace

void RegisterStage3(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "stage3", "ZeRO stage 3 with parameters and optimizer offloaded, against the I/O bound of the same bytes");
  cmd->add_option("--params", opt->params, "Parameters, e.g. 1B")->capture_default_str();
  cmd->add_option("--device-memory", opt->device_memory, "Device memory budget, e.g. 1G")->capture_default_str();
  cmd->add_option("--offload-param", opt->offload_param, "none, cpu or nvme")->capture_default_str();
  cmd->add_option("--offload-optimizer", opt->offload_optimizer, "none, cpu or nvme")->capture_default_str();
  cmd->add_option("--path", opt->path, "nvme: directory for the swap stores (on the NVMe to measure)");
  cmd->add_option("--sub-group-size", opt->sub_group_size, "optimizer nvme: elements per sub-group")
      ->capture_default_str();
  cmd->add_option("--host-memory", opt->host_memory,
                  "Pinned host budget (zinf.host_memory), e.g. 4G; gradients go to NVMe when it is short");
  cmd->add_option("--buffer-count", opt->buffer_count,
                  "optimizer nvme: swap buffers (offload_optimizer.buffer_count); all but one fill with the next "
                  "step's optimizer state during backward")
      ->capture_default_str();
  AddEngineBenchRunOptions(cmd, *opt);
  SetEngineBenchAction(
      cmd, [opt] { return Run(*opt); }, exit_code);
}

}  // namespace zinf::bench
