#include "sched/device_kernels.h"

#include <string>

#include "common/build_config.h"

#if ZINF_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/cuda_host_register.h"
#include "gpu/kernels.h"
#endif
#if ZINF_HAVE_NCCL
#include "gpu/nccl_comm.h"
#endif

namespace zinf::sched {

#if ZINF_HAVE_CUDA

Status DeviceAddInPlace(float* a, const float* b, size_t n, Stream& stream) {
  return gpu::AddInPlace(a, b, n, stream.native_handle());
}

Status DeviceSumSquaresBlocks(const float* data, size_t n, double* out, Stream& stream) {
  return gpu::SumSquaresBlocks(data, n, out, stream.native_handle());
}

Status DeviceAdamStep(const AdamStepConstants& constants, float* params, float* exp_avg, float* exp_avg_sq,
                      const float* grads, void* copy, DType copy_dtype, size_t n, Stream& stream) {
  return gpu::AdamStep(constants, params, exp_avg, exp_avg_sq, grads, DType::kFloat32, copy, copy_dtype, n,
                       stream.native_handle());
}

Status DeviceCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, Stream& stream) {
  return gpu::Cast(src, src_dtype, dst, dst_dtype, n, stream.native_handle());
}

Result<std::unique_ptr<MemoryRegistrar>> CreateHostRegistrarFor(Device& device) {
  const int ordinal = gpu::CudaOrdinal(device);
  if (ordinal < 0) return InvalidArgument("device " + device.name() + " is not a CUDA device");
  ZINF_ASSIGN_OR_RETURN(auto r, gpu::CudaHostRegistrar::Create(ordinal));
  return std::unique_ptr<MemoryRegistrar>(std::move(r));
}

Result<std::string> DevicePciBusId(Device& device) {
  if (device.kind() == DeviceKind::kHost) return std::string();
  const int ordinal = gpu::CudaOrdinal(device);
  if (ordinal < 0) return InvalidArgument("device " + device.name() + " is not a CUDA device");
  return gpu::CudaDevicePciBusId(ordinal);
}

#else

namespace {
Status NoCuda() { return Unimplemented("this build of zinf has no CUDA (configure with -DZINF_WITH_CUDA=ON)"); }
}  // namespace

Status DeviceAddInPlace(float*, const float*, size_t, Stream&) { return NoCuda(); }
Status DeviceSumSquaresBlocks(const float*, size_t, double*, Stream&) { return NoCuda(); }
Status DeviceAdamStep(const AdamStepConstants&, float*, float*, float*, const float*, void*, DType, size_t, Stream&) {
  return NoCuda();
}
Status DeviceCast(const void*, DType, void*, DType, size_t, Stream&) { return NoCuda(); }
Result<std::unique_ptr<MemoryRegistrar>> CreateHostRegistrarFor(Device&) { return NoCuda(); }
Result<std::string> DevicePciBusId(Device& device) {
  if (device.kind() == DeviceKind::kHost) return std::string();
  return NoCuda();
}

#endif

bool CommunicatesDeviceMemory(const Communicator* comm) {
#if ZINF_HAVE_NCCL
  return gpu::IsNcclCommunicator(comm);
#else
  (void)comm;
  return false;
#endif
}

}  // namespace zinf::sched
