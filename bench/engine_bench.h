// What the engine benchmarks (`zinf bench offload`, `zinf bench stage3`)
// share: failing out of a run with one line, synthetic device compute, and
// the process's peak RSS and the host's share of it.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "common/runtime_info.h"  // PeakRssBytes
#include "zinf/device.h"
#include "zinf/status.h"

namespace zinf::bench {

// Thrown by EngineCheck after the line is printed; the command's exit code.
struct EngineBenchFail {
  int code;
};

// Prints "zinf bench <bench>: <what>: <status>" and throws EngineBenchFail{1}.
void EngineCheck(const Status& s, const char* bench, const char* what);
template <class T>
T EngineCheck(Result<T> r, const char* bench, const char* what) {
  EngineCheck(r.status(), bench, what);
  return std::move(*r);
}

// Synthetic device compute of `ms` on `stream`: on a CUDA device a kernel
// that holds the stream (no host CPU, no host-function thread); on the host
// device a sleeping task. Nothing for ms <= 0.
Status SyntheticCompute(Device& device, Stream& stream, double ms);

// The host's own share of a peak RSS: HostDevice's device memory is this
// process's memory, reserved up front, so on it the budget is taken out
// whole; on another device the RSS is the host's.
uint64_t RssOutsideDevice(const Device& device, uint64_t rss);

// The options every engine benchmark takes, registered on `cmd`.
struct EngineBenchRun {
  int units = 24;
  double compute_ms = 0;
  int steps = 3;
  int threads = 2;
  std::string device = "cpu";  // cpu, cuda or cuda:N
  bool json = false;
};
void AddEngineBenchRunOptions(CLI::App* cmd, EngineBenchRun& run);

// Runs `run()` as the command's action: its return value, or the code of an
// EngineBenchFail, becomes *exit_code.
template <class F>
void SetEngineBenchAction(CLI::App* cmd, F run, int* exit_code) {
  cmd->callback([run, exit_code] {
    try {
      *exit_code = run();
    } catch (const EngineBenchFail& f) {
      *exit_code = f.code;
    }
  });
}

}  // namespace zinf::bench
