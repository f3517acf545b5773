// The engine's arithmetic on the memory of a device the host cannot address
// (CudaDevice): gradient accumulation, the norm's block partials, the Adam
// step and casts, each enqueued on a stream as the CUDA kernel of
// gpu/kernels.h, which evaluates the same per-element math as the CPU code the
// engine runs on HostDevice, so both give the same bits. Also what the engine
// needs to know about a CUDA device: a page-locking registrar for its pinned
// host buffers and whether a communicator works on device memory. In a build
// without CUDA every call returns kUnimplemented (no such device can exist).
// Thread-safety: as the kernels (concurrent calls on disjoint outputs).
#pragma once

#include <cstddef>
#include <memory>

#include "math/adam_math.h"
#include "common/memory_registrar.h"
#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

class Communicator;

namespace sched {

// a[i] = a[i] + b[i] over n fp32 values.
Status DeviceAddInPlace(float* a, const float* b, size_t n, Stream& stream);
// out[b] = the sum of squares of 65536-element block b of n fp32 values (cpu/norm.h).
Status DeviceSumSquaresBlocks(const float* data, size_t n, double* out, Stream& stream);
// One Adam step over n elements with fp32 gradients; copy (bf16 or fp16,
// copy_dtype) receives the new parameters when not null.
Status DeviceAdamStep(const AdamStepConstants& constants, float* params, float* exp_avg, float* exp_avg_sq,
                      const float* grads, void* copy, DType copy_dtype, size_t n, Stream& stream);
// dst = src converted, n elements.
Status DeviceCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, Stream& stream);

// cudaHostRegister for `device`'s copies from and to pinned host buffers.
Result<std::unique_ptr<MemoryRegistrar>> CreateHostRegistrarFor(Device& device);
// The PCI bus id of a CUDA device ("0000:17:00.0"), which binds the pinned
// pool to the NUMA node next to it; empty for the host device.
Result<std::string> DevicePciBusId(Device& device);

// Whether `comm`'s collectives take device memory of a CUDA device (NCCL).
bool CommunicatesDeviceMemory(const Communicator* comm);

}  // namespace sched
}  // namespace zinf
