// What the engine benchmarks (`zinf bench offload`, `zinf bench stage3`)
// share: failing out of a run with one line, synthetic device compute, and
// the process's peak RSS.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

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

uint64_t PeakRssBytes();

}  // namespace zinf::bench
