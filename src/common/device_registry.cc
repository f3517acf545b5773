// CreateDevice: the registry of device backends. This file holds the only
// #if ZINF_HAVE_CUDA of the device layer.
#include <string>

#include "common/build_config.h"
#include "common/logging.h"
#include "cpu/host_device.h"
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

}  // namespace zinf
