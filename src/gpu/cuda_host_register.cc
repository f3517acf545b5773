// cudaHostRegister/cudaHostUnregister for PinnedPool buffers, and the PCI bus
// id lookup for NUMA placement. Every CUDA call is checked.
#include "gpu/cuda_host_register.h"

#include <cuda_runtime.h>

#include <utility>

#include "common/logging.h"
#include "gpu/cuda_check.h"

namespace zinf::gpu {
namespace {

// Makes `device` current for the scope and restores the previous one.
class ScopedDevice {
 public:
  Status Enter(int device) {
    ZINF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    if (previous_ != device) {
      ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
      restore_ = true;
    }
    return Status::Ok();
  }
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

Status CheckDevice(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // no device / no driver is an answer, not a sticky error
    return Unavailable("CUDA device " + std::to_string(device) + ": " + cudaGetErrorName(err) + " (" +
                       cudaGetErrorString(err) + ")");
  }
  if (device < 0 || device >= count) {
    return Unavailable("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                       " device(s))");
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> CudaDevicePciBusId(int device) {
  ZINF_RETURN_IF_ERROR(CheckDevice(device));
  char bus_id[32] = {};  // "dddd:bb:dd.f" plus NUL fits in 13
  ZINF_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device));
  return std::string(bus_id);
}

Result<std::unique_ptr<CudaHostRegistrar>> CudaHostRegistrar::Create(int device) {
  ZINF_ASSIGN_OR_RETURN(std::string bus_id, CudaDevicePciBusId(device));
  return std::unique_ptr<CudaHostRegistrar>(new CudaHostRegistrar(device, std::move(bus_id)));
}

Status CudaHostRegistrar::Register(void* ptr, size_t bytes) {
  ScopedDevice scoped;
  ZINF_RETURN_IF_ERROR(scoped.Enter(device_));
  ZINF_CUDA_RETURN_IF_ERROR(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
  return Status::Ok();
}

void CudaHostRegistrar::Unregister(void* ptr, size_t bytes) {
  auto unregister = [&]() -> Status {
    ScopedDevice scoped;
    ZINF_RETURN_IF_ERROR(scoped.Enter(device_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaHostUnregister(ptr));
    return Status::Ok();
  };
  if (Status s = unregister(); !s.ok()) {
    ZINF_LOG_ERROR("cudaHostUnregister of {} bytes at {}: {}", bytes, ptr, s.ToString());
  }
}

}  // namespace zinf::gpu
