// The registry of built backends: CreateDevice and ProbeRuntime, the only
// place that asks which backends this build contains.
#include "sched/backends.h"

#include <string>

#include "common/build_config.h"
#include "common/logging.h"
#include "cpu/host_device.h"
#include "cpu/host_info.h"
#include "nvme/uring_probe.h"
#include "zinf/device.h"
#if ZINF_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/cuda_probe.h"
#endif

namespace zinf {

Result<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  const std::string& spec = options.spec;
  if (spec == "cpu") return CreateHostDevice(options);
  int ordinal = 0;
  bool cuda_named = spec == "cuda" || spec.rfind("cuda:", 0) == 0;
  if (spec.rfind("cuda:", 0) == 0) {
    std::string n = spec.substr(5);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos)
      return InvalidArgument("device '" + spec + "': expected auto, cpu, cuda or cuda:N");
    ordinal = std::stoi(n);
  } else if (!cuda_named && spec != "auto") {
    return InvalidArgument("device '" + spec + "': expected auto, cpu, cuda or cuda:N");
  }
#if ZINF_HAVE_CUDA
  if (cuda_named) return gpu::CreateCudaDevice(ordinal, options);
  if (gpu::CudaDeviceCount() > 0) {
    auto device = gpu::CreateCudaDevice(0, options);
    if (device.ok()) ZINF_LOG_INFO("device: {}", (*device)->name());
    return device;
  }
  ZINF_LOG_INFO("no CUDA device: using host");
#else
  (void)ordinal;  // parsed, so a malformed cuda:N is the same error in every build
  if (cuda_named) return Unavailable("device '" + spec + "': this build of zinf has no CUDA (ZINF_WITH_CUDA=OFF)");
  ZINF_LOG_INFO("built without CUDA: using host");
#endif
  return CreateHostDevice(options);
}

RuntimeInfo ProbeRuntime() {
  RuntimeInfo info;
  info.version = ZINF_VERSION_STRING;
  info.revision = GitRevision();
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

}  // namespace zinf
