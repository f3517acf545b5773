// The CUDA side of pinned host memory: a MemoryRegistrar that page-locks a
// PinnedPool buffer for a CUDA device with cudaHostRegister (so copies to and
// from it are DMA, asynchronous and at full PCIe speed), and the device's PCI
// bus id, which PinnedPoolOptions::gpu_pci_bus_id uses to bind the pool next
// to the GPU. No CUDA header here: callers outside src/gpu stay CUDA-free.
// Thread-safety: CudaHostRegistrar may be called from any thread; it
// restores the calling thread's current device after each call.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/memory_registrar.h"
#include "zinf/status.h"

namespace zinf::gpu {

// "0000:17:00.0" for device `device` (cudaDeviceGetPCIBusId). kUnavailable
// when there is no such device or no driver.
Result<std::string> CudaDevicePciBusId(int device);

class CudaHostRegistrar final : public MemoryRegistrar {
 public:
  // kUnavailable when `device` does not exist (no GPU, no driver).
  static Result<std::unique_ptr<CudaHostRegistrar>> Create(int device);

  std::string_view name() const override { return "cudaHostRegister"; }
  // cudaHostRegister(ptr, bytes, cudaHostRegisterPortable): usable from every
  // CUDA context, not only the device's.
  Status Register(void* ptr, size_t bytes) override;
  // cudaHostUnregister; a failure is logged.
  void Unregister(void* ptr, size_t bytes) override;

  int device() const { return device_; }
  const std::string& pci_bus_id() const { return pci_bus_id_; }

 private:
  CudaHostRegistrar(int device, std::string pci_bus_id) : device_(device), pci_bus_id_(std::move(pci_bus_id)) {}
  int device_;
  std::string pci_bus_id_;
};

}  // namespace zinf::gpu
