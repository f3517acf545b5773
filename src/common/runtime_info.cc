// The runtime report's format and the process's memory figures (the probes
// themselves are in sched/backends.cc, where the backends are known).
#include "common/runtime_info.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace zinf {
namespace {

struct OptionalBackendNames {
  const char* row;     // the report's name
  const char* name;    // in a sentence
  const char* option;  // the configure option that builds it
};

OptionalBackendNames NamesOf(OptionalBackend backend) {
  switch (backend) {
    case OptionalBackend::kCuda:
      return {"cuda", "CUDA", "ZINF_WITH_CUDA"};
    case OptionalBackend::kNccl:
      return {"nccl", "NCCL", "ZINF_WITH_NCCL"};
  }
  return {"?", "?", "?"};
}

}  // namespace

Status NotBuilt(OptionalBackend backend) {
  const OptionalBackendNames n = NamesOf(backend);
  return Unimplemented(std::string("this build of zinf has no ") + n.name + " (configure with -D" + n.option + "=ON)");
}

BackendInfo NotBuiltInfo(OptionalBackend backend) {
  const OptionalBackendNames n = NamesOf(backend);
  return {n.row, false, false, std::string("not built (configure with -D") + n.option + "=ON)"};
}

std::string FormatRuntimeInfo(const RuntimeInfo& info) {
  std::string out = "zinf " + info.version + (info.revision.empty() ? "" : " (git " + info.revision + ")") + "\n";
  size_t width = 0;
  for (const auto& b : info.backends) width = std::max(width, b.name.size());
  for (const auto& b : info.backends) {
    const char* mark = !b.built ? "✗" : b.usable ? "✓" : "-";
    out += "  " + std::string(mark) + " " + b.name + std::string(width - b.name.size() + 2, ' ') + b.detail + "\n";
  }
  return out;
}

uint64_t PeakRssBytes() {
  // VmHWM, not ru_maxrss: only the former starts again at ResetPeakRss.
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "VmHWM: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found) return static_cast<uint64_t>(kib) * 1024;
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

bool ResetPeakRss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

uint64_t PhysicalMemoryBytes() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace zinf
