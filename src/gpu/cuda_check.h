// Checked CUDA and NCCL calls. Every call is wrapped; a failure becomes a
// Status naming the statement, the error, the device and file:line (the
// error is returned, never exit()ed). Include only from CUDA-aware sources.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "zinf/status.h"

namespace zinf::gpu {

inline Status CudaError(cudaError_t err, const char* stmt, const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);  // best effort: the device the failing call ran on
  return Status(err == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kInternal,
                std::string(stmt) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") on device " +
                    std::to_string(device) + " at " + file + ":" + std::to_string(line));
}

}  // namespace zinf::gpu

#define ZINF_CUDA_RETURN_IF_ERROR(stmt)                                                                          \
  do {                                                                                                           \
    cudaError_t zinf_cuda_err_ = (stmt);                                                                         \
    if (zinf_cuda_err_ != cudaSuccess) return ::zinf::gpu::CudaError(zinf_cuda_err_, #stmt, __FILE__, __LINE__); \
  } while (0)
