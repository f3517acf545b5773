// `zinf bench copy`: host<->device copy bandwidth through the device
// contract (CopyToDevice / CopyToHost, then Synchronize), against a plain
// memcpy of the same bytes between the same host buffers in the same run. On
// HostDevice the copy is a memcpy on the copy-engine thread, so the ratio
// shows the contract's overhead; on a GPU it is the PCIe/NVLink bandwidth.
#include <CLI/CLI.hpp>
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "common/units.h"
#include "zinf/device.h"

namespace zinf::bench {
namespace {

struct Options {
  std::string size = "256M";
  std::string device = "auto";
  int loops = 5;
  bool json = false;
};

int Run(const Options& opt) {
  auto bytes = ParseSize(opt.size);
  if (!bytes.ok() || *bytes == 0 || opt.loops < 1) {
    std::fprintf(stderr, "zinf bench copy: --size must be a positive size and --loops >= 1\n");
    return 2;
  }
  DeviceOptions dopt;
  dopt.spec = opt.device;
  dopt.memory_budget = *bytes + (1 << 20);
  auto device = CreateDevice(dopt);
  if (!device.ok()) {
    std::fprintf(stderr, "zinf bench copy: %s\n", device.status().message().c_str());
    return device.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  auto stream = (*device)->CreateStream();
  auto dbuf = (*device)->Allocate(*bytes, **stream);
  if (!stream.ok() || !dbuf.ok()) {
    std::fprintf(stderr, "zinf bench copy: %s\n", (!stream.ok() ? stream.status() : dbuf.status()).message().c_str());
    return 1;
  }
  std::unique_ptr<char, decltype(&std::free)> a(static_cast<char*>(std::aligned_alloc(4096, *bytes)), &std::free),
      b(static_cast<char*>(std::aligned_alloc(4096, *bytes)), &std::free);
  std::memset(a.get(), 1, *bytes);
  std::memset(b.get(), 2, *bytes);
  std::vector<double> h2d, d2h, ref;
  for (int l = 0; l < opt.loops + 1; ++l) {  // the first loop warms up
    double t0 = NowSeconds();
    std::memcpy(b.get(), a.get(), *bytes);
    benchmark::ClobberMemory();
    double t1 = NowSeconds();
    Status st = (*device)->CopyToDevice(*dbuf, a.get(), *bytes, **stream);
    if (st.ok()) st = (*stream)->Synchronize();
    double t2 = NowSeconds();
    if (st.ok()) st = (*device)->CopyToHost(b.get(), *dbuf, *bytes, **stream);
    if (st.ok()) st = (*stream)->Synchronize();
    double t3 = NowSeconds();
    if (!st.ok()) {
      std::fprintf(stderr, "zinf bench copy: %s\n", st.message().c_str());
      return 1;
    }
    if (l == 0) continue;
    ref.push_back(t1 - t0);
    h2d.push_back(t2 - t1);
    d2h.push_back(t3 - t2);
  }
  const double gb = static_cast<double>(*bytes) / 1e9;
  double ref_gbps = gb / Median(ref), h2d_gbps = gb / Median(h2d), d2h_gbps = gb / Median(d2h);
  if (opt.json) {
    nlohmann::json j = {
        {"bench", "copy"},          {"device", (*device)->name()},      {"bytes", *bytes},
        {"loops", opt.loops},       {"memcpy_gb_per_s", ref_gbps},      {"h2d_gb_per_s", h2d_gbps},
        {"d2h_gb_per_s", d2h_gbps}, {"h2d_ratio", h2d_gbps / ref_gbps}, {"d2h_ratio", d2h_gbps / ref_gbps}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "# zinf bench copy: %s per copy, device %s, median of %d loops; reference: memcpy between the same "
        "host buffers (1 thread)\n",
        FormatBytes(*bytes).c_str(), (*device)->name().c_str(), opt.loops);
    std::printf("%-14s %8s %10s\n", "copy", "GB/s", "vs memcpy");
    std::printf("%-14s %8.2f %10.2f\n", "memcpy", ref_gbps, 1.0);
    std::printf("%-14s %8.2f %10.2f\n", "host->device", h2d_gbps, h2d_gbps / ref_gbps);
    std::printf("%-14s %8.2f %10.2f\n", "device->host", d2h_gbps, d2h_gbps / ref_gbps);
  }
  (*device)->Free(*dbuf, **stream).IgnoreError();
  return 0;
}

}  // namespace

void RegisterCopy(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("copy", "Host<->device copy bandwidth through the device contract vs memcpy");
  cmd->add_option("--size", opt->size, "Bytes per copy")->capture_default_str();
  cmd->add_option("--device", opt->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--loops", opt->loops, "Timed loops (medians reported)")->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  cmd->callback([opt, exit_code] { *exit_code = Run(*opt); });
}

}  // namespace zinf::bench
