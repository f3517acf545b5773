// CudaDevice: the device contract on CUDA streams and events, with the shared
// DeviceAllocator over one cudaMalloc'd reservation (no cudaMalloc on the
// hot path) and cudaMemcpyAsync for copies. No CUDA header leaks from here.
// Thread-safe; every CUDA call is checked and its error returned.
#pragma once

#include <memory>

#include "zinf/device.h"

namespace zinf::gpu {

// Device `ordinal`; budget 0 = 90% of the free memory at creation.
Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, const DeviceOptions& options);

// The CUDA ordinal of a device made by CreateCudaDevice; -1 for any other.
int CudaOrdinal(const Device& device);

}  // namespace zinf::gpu
