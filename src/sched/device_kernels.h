// The engine's arithmetic on a device's memory, as one small table per
// device kind (DeviceKernels): gradient accumulation, the norm's block
// partials, the Adam step and casts, each enqueued on a stream, and what the
// engine needs to know about the device (a page-locking registrar for its
// pinned host buffers, its PCI bus id). The registry (sched/backends.cc)
// hands out the table of a kind: on CUDA the kernels of gpu/kernels.h, which
// evaluate the same per-element math as the CPU code, so both give the same
// bits; on the host device the CPU kernels as stream tasks (the twin the CUDA
// table is tested against; the engine itself runs its host path with its own
// thread arena). A kind this build lacks gets a table whose every entry
// returns NotBuilt (no such device can exist).
// Thread-safety: the tables are immutable; the kernels take concurrent calls
// on disjoint outputs.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/memory_registrar.h"
#include "math/adam_math.h"
#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

class Communicator;

namespace sched {

struct DeviceKernels {
  // a[i] = a[i] + b[i] over n fp32 values.
  Status (*add_in_place)(float* a, const float* b, size_t n, Stream& stream);
  // out[b] = the sum of squares of 65536-element block b of n fp32 values
  // (cpu/norm.h); out holds NumNormBlocks(n) doubles.
  Status (*sum_squares_blocks)(const float* data, size_t n, double* out, Stream& stream);
  // One Adam step over n elements with fp32 gradients; copy (bf16 or fp16,
  // copy_dtype) receives the new parameters when not null.
  Status (*adam_step)(const math::AdamStepConstants& constants, float* params, float* exp_avg, float* exp_avg_sq,
                      const float* grads, void* copy, DType copy_dtype, size_t n, Stream& stream);
  // dst = src converted, n elements.
  Status (*cast)(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, Stream& stream);
  // Holds the stream for `seconds` (the benchmarks' synthetic compute): a
  // spinning kernel on CUDA, a sleeping task on the host.
  Status (*busy_wait)(double seconds, Stream& stream);
  // Page-locks pinned host buffers for `device`'s asynchronous copies
  // (cudaHostRegister); the host device needs none (kInvalidArgument).
  Result<std::unique_ptr<MemoryRegistrar>> (*create_host_registrar)(Device& device);
  // The PCI bus id of the device ("0000:17:00.0"), which binds the pinned
  // pool to the NUMA node next to it; empty for the host device.
  Result<std::string> (*pci_bus_id)(Device& device);
};

// The table of a device kind (defined by the registry, sched/backends.cc).
const DeviceKernels& KernelsFor(DeviceKind kind);
// The host device's table (device_kernels.cc).
const DeviceKernels& HostKernels();

// KernelsFor(device.kind()).create_host_registrar(device) and .pci_bus_id(device).
Result<std::unique_ptr<MemoryRegistrar>> CreateHostRegistrarFor(Device& device);
Result<std::string> DevicePciBusId(Device& device);

// Whether `comm`'s collectives take device memory of a CUDA device (NCCL);
// defined by the registry.
bool CommunicatesDeviceMemory(const Communicator* comm);

}  // namespace sched
}  // namespace zinf
