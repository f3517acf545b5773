// `zinf bench offload`: engine steps over synthetic units with synthetic
// gradients, with the optimizer offloaded to the CPU (or not), against the
// bound measured in the same run: the SIMD Adam plus the 16-bit parameter
// copy over the same number of parameters with nothing else running.
//
// With --compute-ms-per-unit X, every unit's forward and backward is a wait
// of X ms (backward: X times --backward-factor) on the device stream (no CPU
// used), standing in for device compute;
// the report then gives forward+backward alone (measured on its own in the
// same run) and how much of the optimizer the step hid behind it.
//
// With --offload nvme the step is also set against the I/O bound: the time
// the disk takes for the bytes the engine moved per step at the rates the
// same I/O engine and store reach reading, then writing, alone. Its passes
// alternate with the timed steps (each step synchronized), and medians are
// compared.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "bench/engine_bench.h"
#include "common/units.h"
#include "cpu/adam.h"
#include "cpu/norm.h"
#include "cpu/host_device.h"
#include "cpu/io_memory.h"
#include "cpu/pinned_pool.h"
#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "sched/device_kernels.h"
#include "sched/timeline.h"
#include "zinf/engine.h"

namespace zinf::bench {
namespace {

struct Options : EngineBenchRun {
  std::string params = "500M";
  std::string offload = "cpu";
  std::string path;                    // nvme: the directory of the swap store
  std::string sub_group_size = "50M";  // nvme: elements per sub-group
  std::string host_memory;             // zinf.host_memory (empty: the machine's RAM)
  bool phased_swaps = true;            // zinf.aio.phased_swaps
  bool active_offload = false;         // zinf.active_offload (offload cpu)
  std::string timeline;                // SVG of the last two measured steps' timeline
  double backward_factor = 1;          // backward compute = this x forward's (a GPU's backward is about 2x)
};

template <class T>
T Check(Result<T> r, const char* what) {
  return EngineCheck(std::move(r), "offload", what);
}
void Check(const Status& s, const char* what) { EngineCheck(s, "offload", what); }

// The bound: Adam (fp32 grads) with the fused bf16 parameter copy over n
// parameters, median of 3 passes after a warm-up, seconds per pass.
double AdamBound(int64_t n, int threads) {
  std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f), g(n, 1e-3f);
  std::vector<uint16_t> copy(n);
  tbb::task_arena arena(threads);
  cpu::AdamOptions o;
  std::vector<double> t;
  for (int pass = 0; pass < 4; ++pass) {
    const double t0 = NowSeconds();
    Check(cpu::AdamStep(arena, o, pass + 1, 1.0,
                        cpu::AdamBuffers{p.data(), m.data(), v.data(), g.data(), DType::kFloat32, copy.data(),
                                         DType::kBFloat16, static_cast<size_t>(n)}),
          "adam");
    if (pass > 0) t.push_back(NowSeconds() - t0);
  }
  return Median(t);
}

// Above this many parameters the bounds are timed on this many and scaled.
constexpr int64_t kBoundParams = 500'000'000;

void Wait(Device& device, Stream& stream, double ms) { Check(SyntheticCompute(device, stream, ms), "compute"); }

// NVMe: the I/O bound — the engine's I/O engine and swap store (default aio
// settings, as the engine uses them) reading, then writing, written bytes
// with nothing else running. Passes are timed between the engine's steps, so
// that the disk's rates and the step are measured minutes apart at most
// (this VM's disk drifts by 20% and more from one minute to the next); the
// rates then give the time of the bytes the engine moved per step. The bytes
// are min(state, kBoundParams' state): the rate of a sequential stream does
// not depend on its length past a few GB, and a 3B model's state could not
// be written twice on most disks. Requests are of one sub-group, up to
// 64 MiB: the store cuts them into aio blocks at the engine's queue depth,
// so the disk sees the same stream, and the buffers stay small beside the
// engine's memory.
class IoBound {
 public:
  IoBound(const std::string& dir, int64_t state_bytes, int64_t sub_group_bytes) {
    Config io_config;
    io_config.zero.offload_optimizer.nvme_path = {dir};
    io_ = Check(nvme::IoEngine::Create(nvme::IoEngineOptionsFromConfig(io_config)), "io engine");
    bytes_ = std::min<int64_t>(sub_group_bytes, int64_t{64} << 20) / 4096 * 4096;
    groups_ = std::max<int64_t>(kBuffers, (state_bytes + bytes_ - 1) / bytes_);
    nvme::SwapStoreOptions so;
    so.dirs = {dir};
    so.capacity_bytes = groups_ * (bytes_ + 4 * so.extent_bytes);
    store_ = Check(nvme::SwapStore::Create(*io_, so), "swap store");
    cpu::IoMemory fill = cpu::AllocateIoMemory(bytes_);
    if (!fill) Check(OutOfMemory("I/O bound buffer"), "buffers");
    std::memset(fill.get(), 1, bytes_);
    for (int64_t g = 0; g < groups_; ++g) {
      Check(store_->Allocate(g, bytes_), "allocate");
      Check(store_->Write(g, fill.get()).Wait(), "pre-write");  // no pass reads an unwritten extent
    }
  }
  double bytes() const { return static_cast<double>(groups_) * static_cast<double>(bytes_); }

  struct Rates {
    double read_gbps = 0, write_gbps = 0;
  };
  // One pass: every group read, then every group written, kBuffers requests
  // in flight. The buffers (the engine's kind: huge pages) live for the pass
  // only, so the engine's peak RSS does not count them.
  Rates Pass() {
    std::vector<cpu::IoMemory> bufs;
    for (int b = 0; b < kBuffers; ++b) {
      bufs.push_back(cpu::AllocateIoMemory(bytes_));
      if (!bufs.back()) Check(OutOfMemory("I/O bound buffers"), "buffers");
      std::memset(bufs.back().get(), 1, bytes_);  // first touches before the clock
    }
    std::vector<nvme::IoRequest> reqs(groups_);
    auto stream = [&](bool write) {
      const double t0 = NowSeconds();
      for (int64_t g = 0; g < groups_; ++g) {
        if (g >= kBuffers) Check(reqs[g - kBuffers].Wait(), write ? "write" : "read");
        reqs[g] = write ? store_->Write(g, bufs[g % kBuffers].get()) : store_->Read(g, bufs[g % kBuffers].get());
      }
      for (auto& r : reqs) Check(r.Wait(), write ? "write" : "read");
      return bytes() / (NowSeconds() - t0) / 1e9;
    };
    Rates r;
    r.read_gbps = stream(false);
    r.write_gbps = stream(true);
    return r;
  }

 private:
  static constexpr int kBuffers = 4;
  std::unique_ptr<nvme::IoEngine> io_;
  std::unique_ptr<nvme::SwapStore> store_;
  int64_t bytes_ = 0, groups_ = 0;
};

// On a GPU the step's copies run on the copy engines, from and to pinned
// host memory: the same 4 B/param to the host and 2 B/param back through the
// device's own copies (cudaMemcpyAsync), with the host's norm pass between,
// over a chunk of kCopyChunk parameters and scaled to `params` (a copy's
// rate is constant past a few MiB).
double DeviceCopiesAndNorm(Device& device, Stream& stream, int64_t params, int threads) {
  constexpr int64_t kCopyChunk = int64_t{64} << 20;
  const int64_t n = std::min(params, kCopyChunk);
  auto registrar = Check(sched::CreateHostRegistrarFor(device), "registrar");
  cpu::PinnedPoolOptions po;
  po.budget_bytes = static_cast<uint64_t>(n) * 6 + (uint64_t{64} << 20);
  po.gpu_pci_bus_id = Check(sched::DevicePciBusId(device), "PCI bus id");
  if (registrar) po.registrars.push_back(registrar.get());
  auto pool = Check(cpu::PinnedPool::Create(std::move(po)), "pinned pool");
  double result = 0;
  {
    cpu::PinnedBuffer host = Check(pool->Acquire(n * 4), "pinned gradient");
    cpu::PinnedBuffer host16 = Check(pool->Acquire(n * 2), "pinned parameters");
    std::memset(host.data(), 0, n * 4);
    std::memset(host16.data(), 0x3c, n * 2);
    void* dev = Check(device.Allocate(n * 4, stream), "device gradient");
    void* dev16 = Check(device.Allocate(n * 2, stream), "device parameters");
    std::vector<float> fill(n, 1e-3f);
    Check(device.CopyToDevice(dev, fill.data(), n * 4, stream), "fill");
    Check(stream.Synchronize(), "fill");
    std::vector<double> partials(cpu::NumNormBlocks(n));
    tbb::task_arena arena(threads);
    std::vector<double> t;
    for (int pass = 0; pass < 4; ++pass) {
      const double t0 = NowSeconds();
      Check(device.CopyToHost(host.data(), dev, n * 4, stream), "copy to the host");
      Check(stream.Synchronize(), "copy to the host");
      Check(cpu::SumSquaresBlocks(arena, static_cast<const float*>(host.data()), DType::kFloat32, n, partials), "norm");
      Check(device.CopyToDevice(dev16, host16.data(), n * 2, stream), "copy to the device");
      Check(stream.Synchronize(), "copy to the device");
      if (pass > 0) t.push_back(NowSeconds() - t0);  // the first: the copies' set-up
    }
    Check(device.Free(dev, stream), "free");
    Check(device.Free(dev16, stream), "free");
    Check(stream.Synchronize(), "free");
    result = Median(t) * static_cast<double>(params) / static_cast<double>(n);
  }
  return result;
}

int Run(const Options& opt) {
  auto count = ParseCount(opt.params);
  if (!count.ok() || *count < static_cast<uint64_t>(opt.units) || opt.units < 1 || opt.steps < 1 || opt.threads < 1 ||
      opt.compute_ms < 0 || !(opt.backward_factor > 0) ||
      (opt.offload != "cpu" && opt.offload != "none" && opt.offload != "nvme") ||
      (opt.offload == "nvme" && opt.path.empty())) {
    std::fprintf(stderr,
                 "zinf bench offload: --params must be a count >= --units, --units/--steps/--threads >= 1, "
                 "--compute-ms-per-unit >= 0, --backward-factor > 0, --offload cpu, nvme (with --path DIR) or none\n");
    return 2;
  }
  if (opt.device != "cpu" && opt.device != "cuda" && opt.device.rfind("cuda:", 0) != 0) {
    std::fprintf(stderr, "zinf bench offload: --device must be cpu, cuda or cuda:N (got '%s')\n", opt.device.c_str());
    return 2;
  }
  auto sub_group = ParseCount(opt.sub_group_size);
  if (!sub_group.ok() || *sub_group == 0) {
    std::fprintf(stderr, "zinf bench offload: --sub-group-size must be a positive count, e.g. 50M\n");
    return 2;
  }
  auto host_memory = opt.host_memory.empty() ? Result<uint64_t>(uint64_t{0}) : ParseSize(opt.host_memory);
  if (!host_memory.ok() || (!opt.host_memory.empty() && *host_memory == 0)) {
    std::fprintf(stderr, "zinf bench offload: --host-memory must be a size, e.g. 4G\n");
    return 2;
  }
  const bool nvme = opt.offload == "nvme";
  const int64_t per_unit = static_cast<int64_t>(*count) / opt.units;
  const int64_t P = per_unit * opt.units;
  const bool offload = opt.offload != "none";
  if (!opt.json) {
    std::printf(
        "# zinf bench offload: %s parameters in %d units, bf16 compute, ZeRO stage 0, offload %s%s, "
        "%d optimizer threads (%u cores), compute %.1f ms per unit forward and %.1f backward, device %s\n",
        FormatCount(static_cast<double>(P)).c_str(), opt.units, opt.offload.c_str(),
        opt.active_offload ? " (active: updates start during backward)" : "", opt.threads,
        std::thread::hardware_concurrency(), opt.compute_ms, opt.compute_ms * opt.backward_factor, opt.device.c_str());
    std::fflush(stdout);
  }
  // 1. The bound, alone; and what a step must also do on this device: move
  // 4 B/param of gradient to the host and 2 B/param of parameters back, and
  // read the gradient once for the norm (HostDevice copies are CPU memcpys
  // on the same cores; a GPU's copy engines move them without the CPU).
  // Both stream through memory at a constant rate, so above kBoundParams
  // they are timed over kBoundParams and scaled (their 30 B/param of arrays
  // would not fit beside a large model).
  const int64_t bound_n = std::min<int64_t>(P, kBoundParams);
  const double bound_scale = static_cast<double>(P) / static_cast<double>(bound_n);
  const double bound = AdamBound(bound_n, opt.threads) * bound_scale;
  double copies_and_norm = 0;
  {
    std::vector<float> dev(bound_n, 1e-3f), host(bound_n);
    std::vector<uint16_t> dev16(bound_n), host16(bound_n, 1);
    std::vector<double> partials(cpu::NumNormBlocks(bound_n));
    tbb::task_arena arena(opt.threads);
    std::vector<double> t;
    for (int pass = 0; pass < 3; ++pass) {
      const double t0 = NowSeconds();
      std::memcpy(host.data(), dev.data(), bound_n * 4);
      Check(cpu::SumSquaresBlocks(arena, host.data(), DType::kFloat32, bound_n, partials), "norm");
      std::memcpy(dev16.data(), host16.data(), bound_n * 2);
      t.push_back(NowSeconds() - t0);
    }
    copies_and_norm = Median(t) * bound_scale;
  }

  // NVMe: the I/O bound's store, written before the engine starts; its
  // passes run between the engine's steps.
  std::unique_ptr<IoBound> io_bound_store;
  double io_bound = 0, io_read_gbps = 0, io_write_gbps = 0;
  if (nvme) {
    const int64_t per_group = std::max<int64_t>(per_unit, static_cast<int64_t>(*sub_group) / per_unit * per_unit);
    io_bound_store = std::make_unique<IoBound>(opt.path, bound_n * 12, per_group * 12);
  }

  // From here on the peak RSS is the engine's (the bounds' arrays are gone).
  bool peak_reset = ResetPeakRss();
  DeviceOptions dopt;
  dopt.spec = opt.device;
  dopt.memory_budget = static_cast<uint64_t>(P) * (offload ? 6 : 22) + (uint64_t{512} << 20);
  auto device = Check(CreateDevice(dopt), "device");
  const bool host_device = device->kind() == DeviceKind::kHost;
  auto stream = Check(device->CreateStream(), "stream");
  if (!host_device) copies_and_norm = DeviceCopiesAndNorm(*device, *stream, P, opt.threads);

  // 2. Forward + backward alone: the waits, on the stream.
  double compute_alone = 0;
  if (opt.compute_ms > 0) {
    const double t0 = NowSeconds();
    for (int u = 0; u < opt.units; ++u) {
      Wait(*device, *stream, opt.compute_ms);
      Wait(*device, *stream, opt.compute_ms * opt.backward_factor);
    }
    Check(stream->Synchronize(), "compute");
    compute_alone = NowSeconds() - t0;
  }

  // 3. The engine.
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 0;
  c.zero.offload_optimizer.device = nvme ? OffloadDevice::kNvme : offload ? OffloadDevice::kCpu : OffloadDevice::kNone;
  if (nvme) {
    c.zero.offload_optimizer.nvme_path = {opt.path};
    c.zero.sub_group_size = static_cast<int64_t>(*sub_group);
  }
  c.zero.offload_optimizer.pin_memory = true;
  c.zinf.optimizer_threads = opt.threads;
  c.zinf.host_memory = *host_memory;
  c.zinf.aio.phased_swaps = opt.phased_swaps;
  c.zinf.active_offload = opt.active_offload;
  auto engine = Check(Engine::Create(c, *device, nullptr), "engine");
  {
    // Synthetic gradients, written once (backward leaves them in place),
    // from a small host buffer so that the host holds no unit-sized array.
    const std::vector<float> fill(int64_t{4} << 20, 1e-3f);
    for (int u = 0; u < opt.units; ++u) {
      Check(engine->AddUnit("unit" + std::to_string(u), {{"w", {per_unit}, DType::kFloat32, nullptr}}), "register");
      UnitPointers g = Check(engine->GradBuffers(u), "grads");
      for (int64_t at = 0; at < g.num_elems; at += static_cast<int64_t>(fill.size())) {
        const int64_t n = std::min<int64_t>(static_cast<int64_t>(fill.size()), g.num_elems - at);
        Check(device->CopyToDevice(static_cast<char*>(g.data) + at * 4, fill.data(), n * 4, *stream), "fill");
        Check(stream->Synchronize(), "fill");
      }
    }
  }
  // The compute on the engine's timeline (Engine::Trace).
  auto compute = [&](const char* pass, int u) {
    const double ms = pass[0] == 'b' ? opt.compute_ms * opt.backward_factor : opt.compute_ms;
    Check(engine->Trace(*stream, "compute", std::string(pass) + " unit" + std::to_string(u),
                        [&] { return SyntheticCompute(*device, *stream, ms); }),
          "compute");
  };
  auto one_step = [&] {
    for (int u = 0; u < opt.units; ++u) {
      Check(engine->Fetch(u, *stream), "fetch");
      compute("forward", u);
      Check(engine->Release(u, *stream), "release");
    }
    for (int u = opt.units - 1; u >= 0; --u) {
      Check(engine->Fetch(u, *stream), "fetch");
      compute("backward", u);
      Check(engine->GradsReady(u, *stream), "grads ready");
      Check(engine->Release(u, *stream), "release");
    }
    Check(engine->Step(), "step");
  };
  one_step();  // warm-up: first touches, pinned buffers
  Check(stream->Synchronize(), "sync");
  Check(engine->Synchronize(), "sync");
  const StepStats warm = Check(engine->Stats(), "stats");
  // Steps back to back, as a trainer runs them: each step's update overlaps
  // the next step's forward; the step time is the steady-state average.
  // NVMe: each step alone, after an I/O bound pass (below).
  if (!opt.json) std::fprintf(stderr, "  running %d steps...\n", opt.steps);
  double step = 0;
  uint64_t rss = PeakRssBytes();  // the warm-up's, first touches included
  // NVMe: each step alone (synchronized), after an I/O bound pass; the
  // step's peak RSS is taken without the pass's buffers.
  std::vector<double> step_times, read_rates, write_rates;
  if (nvme) {
    for (int s = 0; s < opt.steps; ++s) {
      const IoBound::Rates r = io_bound_store->Pass();
      read_rates.push_back(r.read_gbps);
      write_rates.push_back(r.write_gbps);
      peak_reset = ResetPeakRss() && peak_reset;
      const double t0 = NowSeconds();
      one_step();
      Check(stream->Synchronize(), "sync");
      Check(engine->Synchronize(), "sync");
      step_times.push_back(NowSeconds() - t0);
      rss = std::max(rss, PeakRssBytes());
      if (!opt.json) {
        std::fprintf(stderr, "  step %d/%d: %.3f s; the I/O bound's pass before it: %.2f GB/s read, %.2f GB/s write\n",
                     s + 1, opt.steps, step_times.back(), r.read_gbps, r.write_gbps);
      }
    }
    step = Median(step_times);
    io_read_gbps = Median(read_rates);
    io_write_gbps = Median(write_rates);
  } else {
    const double t0 = NowSeconds();
    for (int s = 0; s < opt.steps; ++s) one_step();
    Check(stream->Synchronize(), "sync");
    Check(engine->Synchronize(), "sync");
    step = (NowSeconds() - t0) / opt.steps;
    rss = PeakRssBytes();
  }
  const StepStats last = Check(engine->Stats(), "stats");
  const double optimizer = last.optimizer_seconds;
  // The measured steps' timelines (every boundary has finished).
  // The warm-up's spans too: its updates run in the first measured step.
  std::vector<StepStats> measured;
  // (The engine keeps the last 64 steps' metrics.)
  for (int64_t b = std::max(warm.boundary, last.boundary - 63); b <= last.boundary; ++b) {
    measured.push_back(Check(engine->Stats(b), "stats"));
  }
  std::vector<sched::StepTimeline> timeline = sched::SummarizeTimeline(measured);
  std::erase_if(timeline, [&](const sched::StepTimeline& t) { return t.boundary == warm.boundary; });
  auto median_share = [&](const std::string& lane) {
    std::vector<double> v;
    for (const sched::StepTimeline& t : timeline) v.push_back(t.share(lane));
    return v.empty() ? 0.0 : Median(v);
  };
  if (!opt.timeline.empty()) {
    std::vector<StepStats> shown(measured.end() - std::min<size_t>(measured.size(), 3), measured.end());
    const double from = timeline.size() >= 2 ? timeline[timeline.size() - 2].start : 0;
    const double to = timeline.empty() ? 0 : timeline.back().end;
    char title[256];
    std::snprintf(title, sizeof title,
                  "zinf bench offload: %s parameters, %d units, offload %s%s, compute %.1f ms/unit, %s",
                  FormatCount(static_cast<double>(P)).c_str(), opt.units, opt.offload.c_str(),
                  opt.active_offload ? " (active)" : "", opt.compute_ms, device->name().c_str());
    Check(sched::WriteTimelineSvg(opt.timeline, shown, title, from, to), "--timeline");
  }
  const double nvme_read = static_cast<double>(last.nvme_bytes_read_total - warm.nvme_bytes_read_total) / opt.steps;
  const double nvme_written =
      static_cast<double>(last.nvme_bytes_written_total - warm.nvme_bytes_written_total) / opt.steps;
  // Each step against the pass before it, and the medians against each other.
  std::vector<double> pair_ratios;
  if (nvme) {
    io_bound = nvme_read / (io_read_gbps * 1e9) + nvme_written / (io_write_gbps * 1e9);
    for (size_t s = 0; s < step_times.size(); ++s) {
      pair_ratios.push_back(step_times[s] /
                            (nvme_read / (read_rates[s] * 1e9) + nvme_written / (write_rates[s] * 1e9)));
    }
  }
  const double busy = step - compute_alone;
  const double hidden = opt.compute_ms > 0 ? std::clamp(1.0 - std::max(0.0, busy) / bound, 0.0, 1.0) : 0.0;
  const double peak_per_param = static_cast<double>(last.host_peak_pinned_bytes) / static_cast<double>(P);
  const uint64_t rss_outside_device = RssOutsideDevice(*device, rss);
  if (opt.json) {
    nlohmann::json j = {{"params", P},
                        {"units", opt.units},
                        {"phased_swaps", opt.phased_swaps},
                        {"offload", opt.offload},
                        {"active_offload", opt.active_offload},
                        {"threads", opt.threads},
                        {"device", device->name()},
                        {"compute_ms_per_unit", opt.compute_ms},
                        {"backward_factor", opt.backward_factor},
                        {"step_seconds", step},
                        {"bound_seconds", bound},
                        {"step_over_bound", step / bound},
                        {"copies_and_norm_seconds", copies_and_norm},
                        {"io_bound_seconds", io_bound},
                        {"step_over_io_bound", io_bound > 0 ? step / io_bound : 0.0},
                        {"nvme_bytes_read_per_step", nvme_read},
                        {"nvme_bytes_written_per_step", nvme_written},
                        {"io_bound_read_gb_per_s", io_read_gbps},
                        {"io_bound_write_gb_per_s", io_write_gbps},
                        {"io_bound_measured_bytes", nvme ? io_bound_store->bytes() : 0.0},
                        {"step_seconds_each", step_times},
                        {"step_over_io_bound_each", pair_ratios},
                        {"peak_rss_bytes", rss},
                        {"peak_rss_outside_device_bytes", rss_outside_device},
                        {"peak_rss_engine_only", peak_reset},
                        {"bound_measured_params", bound_n},
                        {"step_over_bound_with_copies", step / (bound + copies_and_norm)},
                        {"optimizer_seconds", optimizer},
                        {"compute_alone_seconds", compute_alone},
                        {"step_over_compute", compute_alone > 0 ? step / compute_alone : 0.0},
                        {"optimizer_hidden_fraction", hidden},
                        {"host_peak_pinned_bytes", last.host_peak_pinned_bytes},
                        {"host_peak_pinned_bytes_per_param", peak_per_param}};
    nlohmann::json steps = nlohmann::json::array();
    for (const sched::StepTimeline& t : timeline) {
      steps.push_back({{"boundary", t.boundary},
                       {"seconds", t.seconds()},
                       {"busy_seconds", t.busy},
                       {"stall_seconds_by_cause", t.stalls}});
    }
    j["timeline"] = {{"steps", steps},
                     {"median_share",
                      {{"compute", median_share("compute")},
                       {"optimizer", median_share("optimizer")},
                       {"disk", median_share("disk")},
                       {"copy", median_share("copy")},
                       {"stall", median_share("stall")}}}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("# bound: Adam + fused bf16 copy over the same %s parameters, nothing else running\n",
              FormatCount(static_cast<double>(P)).c_str());
  std::printf("# +copies: the same run's %s of 4 B/param to the host and 2 B/param back plus the norm pass, alone\n",
              host_device ? "memcpy" : "device copies (pinned host memory)");
  std::printf("%8s %8s %10s %9s %13s %11s %9s %12s %7s %10s\n", "step s", "bound s", "step/bound", "+copies s",
              "step/(b+copy)", "optimizer s", "compute s", "step/compute", "hidden", "pinned B/p");
  std::printf("%8.3f %8.3f %10.2f %9.3f %13.2f %11.3f %9.3f %12.2f %6.0f%% %10.2f\n", step, bound, step / bound,
              copies_and_norm, step / (bound + copies_and_norm), optimizer, compute_alone,
              compute_alone > 0 ? step / compute_alone : 0.0, 100 * hidden, peak_per_param);
  // The per-step timeline.
  std::printf(
      "# timeline, each step's stretch on the compute stream (forward+backward, waits included) and the "
      "share of it each lane was busy; stalls by cause\n");
  for (const sched::StepTimeline& t : timeline) {
    std::printf("  step %lld: %.3f s | %s\n", static_cast<long long>(t.boundary), t.seconds(),
                sched::FormatStepTimeline(t).c_str());
  }
  std::printf(
      "# median over %zu steps: compute %.0f%%, optimizer %.0f%%, disk %.0f%%, copy %.0f%%; stalled %.1f%% of "
      "forward+backward%s\n",
      timeline.size(), 100 * median_share("compute"), 100 * median_share("optimizer"), 100 * median_share("disk"),
      100 * median_share("copy"), 100 * median_share("stall"),
      opt.timeline.empty() ? "" : ("; picture of the last two: " + opt.timeline).c_str());
  if (nvme) {
    std::printf(
        "# nvme: per step the engine read %s and wrote %s (optimizer state %s each way, and swapped "
        "gradients); at the median rates of the same I/O engine and store reading, then writing, %s alone "
        "between the steps (%.2f GB/s read, %.2f GB/s write) that is %.3f s: median step/io bound %.2f; "
        "nvme waits in the last step %.3f s\n",
        FormatBytes(static_cast<uint64_t>(nvme_read)).c_str(), FormatBytes(static_cast<uint64_t>(nvme_written)).c_str(),
        FormatBytes(static_cast<uint64_t>(P) * 12).c_str(),
        FormatBytes(static_cast<uint64_t>(io_bound_store->bytes())).c_str(), io_read_gbps, io_write_gbps, io_bound,
        step / io_bound, last.io_seconds);
    std::printf("# nvme: each step (synchronized, after its bound pass) over the bound of the pass before it:");
    for (double r : pair_ratios) std::printf(" %.2f", r);
    std::printf("\n");
  }
  if (bound_n < P) {
    std::printf("# bound and +copies timed over %s parameters and scaled by %.2f (memory-bound streams)\n",
                FormatCount(static_cast<double>(bound_n)).c_str(), bound_scale);
  }
  std::printf("# peak RSS %s while the engine ran%s", FormatBytes(rss).c_str(),
              peak_reset ? "" : " (the whole process's: the kernel refused to reset the peak)");
  if (host_device) {
    std::printf(", %s of it outside HostDevice's %s of device memory (bf16 parameters and fp32 gradients)",
                FormatBytes(rss_outside_device).c_str(), FormatBytes(device->memory_stats().budget_bytes).c_str());
  }
  std::printf("\n");
  if (nvme) {
    std::printf(
        "# host pinned peak %s = the fp32 gradient accumulator (4 B/param, or as much as --host-memory "
        "allows, the rest swapped to NVMe) + %lld swap buffers of one sub-group (12 B/element, and 4 B/element "
        "of swapped gradients) + staging (one unit's fp32 gradient, bf16 parameter slots)\n",
        FormatBytes(last.host_peak_pinned_bytes).c_str(),
        static_cast<long long>(c.zero.offload_optimizer.buffer_count));
  } else {
    std::printf(
        "# host pinned peak %s = 16 B/param of state and gradient shard + staging (one unit's fp32 gradient, "
        "%lld bf16 parameter slots of one unit)\n",
        FormatBytes(last.host_peak_pinned_bytes).c_str(),
        static_cast<long long>(c.zero.offload_optimizer.buffer_count));
  }
  return 0;
}

}  // namespace

void RegisterOffload(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd =
      bench.add_subcommand("offload", "Engine steps with the optimizer offloaded to the CPU vs the Adam bound");
  cmd->add_option("--params", opt->params, "Parameters, e.g. 500M")->capture_default_str();
  cmd->add_option("--offload", opt->offload, "cpu, nvme or none")->capture_default_str();
  cmd->add_option("--path", opt->path, "nvme: directory for the optimizer state (on the NVMe to measure)");
  cmd->add_option("--sub-group-size", opt->sub_group_size, "nvme: elements per sub-group (whole units)")
      ->capture_default_str();
  cmd->add_option("--host-memory", opt->host_memory,
                  "Pinned host budget (zinf.host_memory), e.g. 4G; nvme: gradients go to NVMe when it is short");
  cmd->add_flag("--active-offload", opt->active_offload,
                "zinf.active_offload: each unit's update starts during backward (offload cpu)");
  cmd->add_option("--backward-factor", opt->backward_factor,
                  "Backward's synthetic compute per unit as a multiple of forward's (a GPU's is about 2)")
      ->capture_default_str();
  cmd->add_option("--timeline", opt->timeline, "Write the last two measured steps' timeline as an SVG picture");
  cmd->add_option("--phased-swaps", opt->phased_swaps,
                  "nvme: sub-group reads and writes in phases (zinf.aio.phased_swaps), or together")
      ->capture_default_str();
  AddEngineBenchRunOptions(cmd, *opt);
  SetEngineBenchAction(
      cmd, [opt] { return Run(*opt); }, exit_code);
}

}  // namespace zinf::bench
