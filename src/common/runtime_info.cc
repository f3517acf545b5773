// The registry: the one place that asks which backends this build contains.
#include "common/runtime_info.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/build_config.h"
#include "cpu/host_info.h"
#include "nvme/uring_probe.h"
#if ZINF_HAVE_CUDA
#include "gpu/cuda_probe.h"
#endif

namespace zinf {

RuntimeInfo ProbeRuntime() {
  RuntimeInfo info;
  info.version = ZINF_VERSION_STRING;
#if ZINF_HAVE_CUDA
  info.backends.push_back(gpu::ProbeCuda());
#else
  info.backends.push_back({"cuda", false, false, "not built (configure with -DZINF_WITH_CUDA=ON)"});
#endif
#if ZINF_HAVE_NCCL
  info.backends.push_back(gpu::ProbeNccl());
#else
  info.backends.push_back({"nccl", false, false, "not built (configure with -DZINF_WITH_NCCL=ON)"});
#endif
  info.backends.push_back(ProbeIoUring());
  info.backends.push_back(ProbeTbb());
  info.backends.push_back(ProbeHwloc());
  info.backends.push_back(ProbeSimd());
  info.backends.push_back(ProbeMpi());
  info.backends.push_back(ProbeOpenBlas());
  return info;
}

std::string FormatRuntimeInfo(const RuntimeInfo& info) {
  std::string out = "zinf " + info.version + "\n";
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
