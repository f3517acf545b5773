// What this build of zinf contains and what it finds on the machine at run
// time (BackendInfo, filled by each backend's probe and gathered by
// sched/backends.h's ProbeRuntime), its report, and the process's memory
// figures. Knows no backend. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf {

struct BackendInfo {
  std::string name;     // "cuda", "io_uring", ...
  bool built = false;   // compiled into this binary
  bool usable = false;  // works on this machine right now
  std::string detail;   // versions, device names, or why it is not usable
};

struct RuntimeInfo {
  std::string version;   // zinf's own
  std::string revision;  // the git revision built, "+dirty" when the tree differed from it
  std::vector<BackendInfo> backends;
};

// The backends a build may leave out (the configure options ZINF_WITH_CUDA
// and ZINF_WITH_NCCL). What a build lacks is said in one wording, here.
enum class OptionalBackend { kCuda, kNccl };
// kUnimplemented "this build of zinf has no CUDA (configure with
// -DZINF_WITH_CUDA=ON)".
Status NotBuilt(OptionalBackend backend);
// The runtime report's row for it: not built, and the option that builds it.
BackendInfo NotBuiltInfo(OptionalBackend backend);

// The git revision this build was made from (12 hex digits, or "unknown"
// outside a git checkout), with "+dirty" when tracked files differed from it.
std::string GitRevision();

// The report, one backend per line.
std::string FormatRuntimeInfo(const RuntimeInfo& info);

// This process's peak resident set (VmHWM of /proc/self/status; getrusage's
// ru_maxrss where that cannot be read) since it started or since the last
// ResetPeakRss(), bytes.
uint64_t PeakRssBytes();

// Starts a new peak at the current resident set (writes 5 to
// /proc/self/clear_refs), so that a benchmark measures one phase's peak and
// not an earlier phase's. False where the kernel refuses it; the peak then
// stays the whole process's.
bool ResetPeakRss();

// The machine's physical memory (sysconf), bytes.
uint64_t PhysicalMemoryBytes();

}  // namespace zinf
