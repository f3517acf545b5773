// What the kernel files of src/gpu share: a launch check that names the
// kernel, file and line, the row-shape check, and the indices of a
// grid-stride loop. Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/float16.h"
#include "gpu/cuda_check.h"
#include "gpu/simt.cuh"

namespace zinf::gpu {

// The error of the last launch, if any, naming `kernel` and the call site.
inline Status CheckLaunch(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return CudaError(err, (std::string("launch of ") + kernel).c_str(), file, line);
}
#define ZINF_CHECK_LAUNCH(kernel) ::zinf::gpu::CheckLaunch(kernel, __FILE__, __LINE__)

// kInvalidArgument naming `fn` unless rows >= 0 and cols >= 1.
inline Status CheckRows(const char* fn, int64_t rows, int64_t cols, const char* cols_name) {
  if (rows < 0 || cols < 1)
    return InvalidArgument(std::string(fn) + ": rows " + std::to_string(rows) + ", " + cols_name + " " +
                           std::to_string(cols) + " (need rows >= 0, " + cols_name + " >= 1)");
  return Status::Ok();
}

using simt::StoreAs;

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) overlap.
inline bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

using simt::GlobalThread;
using simt::GridStride;

}  // namespace zinf::gpu
