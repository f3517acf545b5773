// What the kernel files of src/gpu share: a launch check that names the
// kernel, file and line, and the indices of a grid-stride loop. Include from
// .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "gpu/cuda_check.h"

namespace zinf::gpu {

// The error of the last launch, if any, naming `kernel` and the call site.
inline Status CheckLaunch(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return CudaError(err, (std::string("launch of ") + kernel).c_str(), file, line);
}
#define ZINF_CHECK_LAUNCH(kernel) ::zinf::gpu::CheckLaunch(kernel, __FILE__, __LINE__)

__device__ inline size_t GlobalThread() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline size_t GridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

}  // namespace zinf::gpu
