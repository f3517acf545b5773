// The host device's DeviceKernels: the CPU kernels (cpu/adam.h, cast.h,
// norm.h) as stream tasks over the device memory's host addresses, each on
// the stream's own thread (a one-thread arena: the twin is about the bits,
// not the speed).
#include "sched/device_kernels.h"

#include <oneapi/tbb/task_arena.h>

#include <chrono>
#include <span>
#include <thread>

#include "cpu/adam.h"
#include "cpu/cast.h"
#include "cpu/norm.h"

namespace zinf::sched {
namespace {

template <class T>
T* HostOf(const StreamContext& ctx, T* device_ptr) {
  return device_ptr ? static_cast<T*>(ctx.Host(device_ptr)) : nullptr;
}

Status HostAddInPlace(float* a, const float* b, size_t n, Stream& stream) {
  return stream.Enqueue([a, b, n](const StreamContext& ctx) {
    float* ha = HostOf(ctx, a);
    const float* hb = HostOf(ctx, b);
    for (size_t i = 0; i < n; ++i) ha[i] = ha[i] + hb[i];
    return Status::Ok();
  });
}

Status HostSumSquaresBlocks(const float* data, size_t n, double* out, Stream& stream) {
  return stream.Enqueue([data, n, out](const StreamContext& ctx) {
    tbb::task_arena arena(1);
    return cpu::SumSquaresBlocks(arena, HostOf(ctx, data), DType::kFloat32, n,
                                 std::span<double>(HostOf(ctx, out), cpu::NumNormBlocks(n)))
        .status();
  });
}

Status HostAdamStep(const math::AdamStepConstants& constants, float* params, float* exp_avg, float* exp_avg_sq,
                    const float* grads, void* copy, DType copy_dtype, size_t n, Stream& stream) {
  return stream.Enqueue([=](const StreamContext& ctx) {
    tbb::task_arena arena(1);
    const cpu::AdamBuffers buffers{.params = HostOf(ctx, params),
                                   .exp_avg = HostOf(ctx, exp_avg),
                                   .exp_avg_sq = HostOf(ctx, exp_avg_sq),
                                   .grads = HostOf(ctx, grads),
                                   .grad_dtype = DType::kFloat32,
                                   .param_copy = HostOf(ctx, copy),
                                   .param_copy_dtype = copy_dtype,
                                   .num_elems = n};
    return cpu::AdamStep(arena, constants, buffers);
  });
}

Status HostCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, Stream& stream) {
  return stream.Enqueue([=](const StreamContext& ctx) {
    tbb::task_arena arena(1);
    return cpu::Cast(arena, HostOf(ctx, src), src_dtype, HostOf(ctx, dst), dst_dtype, n);
  });
}

Status HostBusyWait(double seconds, Stream& stream) {
  if (!(seconds >= 0)) return InvalidArgument("busy_wait: seconds must be >= 0");
  return stream.Enqueue([seconds](const StreamContext&) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return Status::Ok();
  });
}

Result<std::unique_ptr<MemoryRegistrar>> HostRegistrar(Device& device) {
  return InvalidArgument("device " + device.name() + ": host memory needs no page-locking registrar");
}

Result<std::string> HostPciBusId(Device&) { return std::string(); }

constexpr DeviceKernels kHostKernels{
    .add_in_place = HostAddInPlace,
    .sum_squares_blocks = HostSumSquaresBlocks,
    .adam_step = HostAdamStep,
    .cast = HostCast,
    .busy_wait = HostBusyWait,
    .create_host_registrar = HostRegistrar,
    .pci_bus_id = HostPciBusId,
};

}  // namespace

const DeviceKernels& HostKernels() { return kHostKernels; }

Result<std::unique_ptr<MemoryRegistrar>> CreateHostRegistrarFor(Device& device) {
  return KernelsFor(device.kind()).create_host_registrar(device);
}

Result<std::string> DevicePciBusId(Device& device) { return KernelsFor(device.kind()).pci_bus_id(device); }

}  // namespace zinf::sched
