// CUDA and NCCL probes for `zinf --version` and for choosing the device.
// No CUDA header leaks from here. "No GPU" (cudaErrorNoDevice,
// cudaErrorInsufficientDriver) is a normal answer, not an error. Thread-safe.
#pragma once

#include "common/runtime_info.h"

namespace zinf::gpu {

// Runtime and driver versions, each device (name, compute capability,
// memory), and whether this binary's kernels load on device 0.
BackendInfo ProbeCuda();
// Number of usable CUDA devices; 0 when there is no GPU or no driver.
int CudaDeviceCount();
BackendInfo ProbeNccl();

}  // namespace zinf::gpu
