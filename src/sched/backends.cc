// The registry of built backends: the only place that asks which backends
// this build contains. Each optional backend is one #if block of the tables
// and factories it provides; everything else here is backend-neutral.
#include "sched/backends.h"

#include <string>
#include <utility>

#include "common/build_config.h"
#include "common/logging.h"
#include "cpu/host_device.h"
#include "cpu/host_info.h"
#include "cpu/mpi_comm.h"
#include "nvme/uring_probe.h"
#include "zinf/device.h"

#if ZINF_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/cuda_host_register.h"
#include "gpu/cuda_probe.h"
#include "gpu/gemm_reference.h"
#include "gpu/kernels.h"
#endif

namespace zinf::sched {
namespace {

// ---- CUDA -------------------------------------------------------------------
#if ZINF_HAVE_CUDA
constexpr bool kHaveCuda = true;

Status CudaAddInPlace(float* a, const float* b, size_t n, Stream& stream) {
  return gpu::AddInPlace(a, b, n, stream.native_handle());
}
Status CudaSumSquaresBlocks(const float* data, size_t n, double* out, Stream& stream) {
  return gpu::SumSquaresBlocks(data, n, out, stream.native_handle());
}
Status CudaAdamStep(const math::AdamStepConstants& constants, float* params, float* exp_avg, float* exp_avg_sq,
                    const float* grads, void* copy, DType copy_dtype, size_t n, Stream& stream) {
  return gpu::AdamStep(constants, params, exp_avg, exp_avg_sq, grads, DType::kFloat32, copy, copy_dtype, n,
                       stream.native_handle());
}
Status CudaCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, Stream& stream) {
  return gpu::Cast(src, src_dtype, dst, dst_dtype, n, stream.native_handle());
}
Status CudaBusyWait(double seconds, Stream& stream) { return gpu::BusyWait(seconds, stream.native_handle()); }
Result<int> OrdinalOf(const Device& device) {
  const int ordinal = gpu::CudaOrdinal(device);
  if (ordinal < 0) return InvalidArgument("device " + device.name() + " is not a CUDA device");
  return ordinal;
}
Result<std::unique_ptr<MemoryRegistrar>> CudaRegistrar(Device& device) {
  ZINF_ASSIGN_OR_RETURN(const int ordinal, OrdinalOf(device));
  ZINF_ASSIGN_OR_RETURN(auto r, gpu::CudaHostRegistrar::Create(ordinal));
  return std::unique_ptr<MemoryRegistrar>(std::move(r));
}
Result<std::string> CudaPciBusId(Device& device) {
  ZINF_ASSIGN_OR_RETURN(const int ordinal, OrdinalOf(device));
  return gpu::CudaDevicePciBusId(ordinal);
}
constexpr DeviceKernels kCudaKernels{
    .add_in_place = CudaAddInPlace,
    .sum_squares_blocks = CudaSumSquaresBlocks,
    .adam_step = CudaAdamStep,
    .cast = CudaCast,
    .busy_wait = CudaBusyWait,
    .create_host_registrar = CudaRegistrar,
    .pci_bus_id = CudaPciBusId,
};

constexpr CudaTimings kCudaTimings{
    .device_count = gpu::CudaDeviceCount,
    .time_flash_attention = gpu::TimeFlashAttention,
    .flash_copies_fit = gpu::FlashAttentionCopiesFit,
    .time_cublas_product = gpu::TimeCublasProduct,
};

Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, const DeviceOptions& options) {
  return gpu::CreateCudaDevice(ordinal, options);
}
int CudaDeviceCount() { return gpu::CudaDeviceCount(); }
BackendInfo ProbeCuda() { return gpu::ProbeCuda(); }

#else
constexpr bool kHaveCuda = false;

// No CUDA device can exist in this build: every entry says so.
template <class... Args>
Status NoCuda(Args...) {
  return NotBuilt(OptionalBackend::kCuda);
}
template <class T, class... Args>
Result<T> NoCudaResult(Args...) {
  return NotBuilt(OptionalBackend::kCuda);
}
constexpr DeviceKernels kCudaKernels{
    .add_in_place = NoCuda<float*, const float*, size_t, Stream&>,
    .sum_squares_blocks = NoCuda<const float*, size_t, double*, Stream&>,
    .adam_step =
        NoCuda<const math::AdamStepConstants&, float*, float*, float*, const float*, void*, DType, size_t, Stream&>,
    .cast = NoCuda<const void*, DType, void*, DType, size_t, Stream&>,
    .busy_wait = NoCuda<double, Stream&>,
    .create_host_registrar = NoCudaResult<std::unique_ptr<MemoryRegistrar>, Device&>,
    .pci_bus_id = NoCudaResult<std::string, Device&>,
};

constexpr CudaTimings kCudaTimings{};  // never handed out

Result<std::unique_ptr<Device>> CreateCudaDevice(int, const DeviceOptions&) { return NotBuilt(OptionalBackend::kCuda); }
int CudaDeviceCount() { return 0; }
BackendInfo ProbeCuda() { return NotBuiltInfo(OptionalBackend::kCuda); }
#endif

// ---- NCCL -------------------------------------------------------------------
#if ZINF_HAVE_NCCL
constexpr bool kHaveNccl = true;

Result<gpu::NcclUniqueId> NcclId() { return gpu::NewNcclUniqueId(); }
Result<std::unique_ptr<Communicator>> NcclCommunicator(int rank, int size, const gpu::NcclUniqueId& id, int cuda_device,
                                                       const CommOptions& options,
                                                       std::unique_ptr<Communicator> notices) {
  return gpu::CreateNcclCommunicator(rank, size, id, cuda_device, options, std::move(notices));
}
Result<std::unique_ptr<Communicator>> WrapNccl(void* nccl_comm, const CommOptions& options) {
  return gpu::WrapNcclCommunicator(static_cast<ncclComm*>(nccl_comm), options);
}
bool IsNccl(const Communicator* comm) { return gpu::IsNcclCommunicator(comm); }
BackendInfo ProbeNccl() { return gpu::ProbeNccl(); }

#else
constexpr bool kHaveNccl = false;

Result<gpu::NcclUniqueId> NcclId() { return NotBuilt(OptionalBackend::kNccl); }
Result<std::unique_ptr<Communicator>> NcclCommunicator(int, int, const gpu::NcclUniqueId&, int, const CommOptions&,
                                                       std::unique_ptr<Communicator>) {
  return NotBuilt(OptionalBackend::kNccl);
}
Result<std::unique_ptr<Communicator>> WrapNccl(void*, const CommOptions&) { return NotBuilt(OptionalBackend::kNccl); }
bool IsNccl(const Communicator*) { return false; }
BackendInfo ProbeNccl() { return NotBuiltInfo(OptionalBackend::kNccl); }
#endif

// ---- backend-neutral ----------------------------------------------------------

// The id is made on rank 0 and broadcast over MPI, which then stays as the
// NCCL communicator's notice channel.
Result<std::unique_ptr<Communicator>> NcclOverMpi(int cuda_device, const CommOptions& options) {
  if (!kHaveNccl) return NotBuilt(OptionalBackend::kNccl);
  ZINF_ASSIGN_OR_RETURN(auto mpi, cpu::CreateMpiCommunicator(options));
  gpu::NcclUniqueId id{};
  if (mpi->rank() == 0) {
    ZINF_ASSIGN_OR_RETURN(id, NcclId());
  }
  // The id is plain host memory: an inline stream runs the broadcast here and now.
  InlineHostStream host;
  static_assert(gpu::kNcclUniqueIdBytes % 4 == 0);
  ZINF_RETURN_IF_ERROR(mpi->Broadcast(id.bytes, gpu::kNcclUniqueIdBytes / 4, DType::kFloat32, 0, host));
  ZINF_RETURN_IF_ERROR(host.Synchronize().WithContext("broadcasting the NCCL unique id"));
  const int rank = mpi->rank(), size = mpi->size();
  return NcclCommunicator(rank, size, id, cuda_device, options, std::move(mpi));
}

}  // namespace

bool Built(OptionalBackend backend) {
  switch (backend) {
    case OptionalBackend::kCuda:
      return kHaveCuda;
    case OptionalBackend::kNccl:
      return kHaveNccl;
  }
  return false;
}

const DeviceKernels& KernelsFor(DeviceKind kind) { return kind == DeviceKind::kCuda ? kCudaKernels : HostKernels(); }

bool CommunicatesDeviceMemory(const Communicator* comm) { return IsNccl(comm); }

Result<std::unique_ptr<Communicator>> CreateCommunicator(CommBackend backend, const CommOptions& options,
                                                         int cuda_device) {
  if (backend == CommBackend::kMpi) return cpu::CreateMpiCommunicator(options);
  return NcclOverMpi(cuda_device, options);
}

Result<gpu::NcclUniqueId> NewNcclUniqueId() { return NcclId(); }

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size, const gpu::NcclUniqueId& id,
                                                             int cuda_device, const CommOptions& options) {
  return NcclCommunicator(rank, size, id, cuda_device, options, nullptr);
}

Result<std::unique_ptr<Communicator>> WrapNcclCommunicator(void* nccl_comm, const CommOptions& options) {
  return WrapNccl(nccl_comm, options);
}

Result<const CudaTimings*> GetCudaTimings() {
  if (!kHaveCuda) return NotBuilt(OptionalBackend::kCuda);
  return &kCudaTimings;
}

RuntimeInfo ProbeRuntime() {
  RuntimeInfo info;
  info.version = ZINF_VERSION_STRING;
  info.revision = GitRevision();
  info.backends.push_back(ProbeCuda());
  info.backends.push_back(ProbeNccl());
  info.backends.push_back(nvme::ProbeIoUring());
  info.backends.push_back(cpu::ProbeTbb());
  info.backends.push_back(cpu::ProbeHwloc());
  info.backends.push_back(cpu::ProbeSimd());
  info.backends.push_back(cpu::ProbeMpi());
  info.backends.push_back(cpu::ProbeOpenBlas());
  return info;
}

}  // namespace zinf::sched

namespace zinf {

Result<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  const std::string& spec = options.spec;
  if (spec == "cpu") return cpu::CreateHostDevice(options);
  int ordinal = 0;
  const bool cuda_named = spec == "cuda" || spec.rfind("cuda:", 0) == 0;
  if (spec.rfind("cuda:", 0) == 0) {
    std::string n = spec.substr(5);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos)
      return InvalidArgument("device '" + spec + "': expected auto, cpu, cuda or cuda:N");
    ordinal = std::stoi(n);
  } else if (!cuda_named && spec != "auto") {
    return InvalidArgument("device '" + spec + "': expected auto, cpu, cuda or cuda:N");
  }
  if (!sched::kHaveCuda) {
    // cuda:N is parsed first, so a malformed one is the same error in every build.
    const Status not_built = NotBuilt(OptionalBackend::kCuda);
    if (cuda_named) return Unavailable("device '" + spec + "': " + not_built.message());
    ZINF_LOG_INFO("{}: using host", not_built.message());
    return cpu::CreateHostDevice(options);
  }
  if (cuda_named) return sched::CreateCudaDevice(ordinal, options);
  if (sched::CudaDeviceCount() > 0) {
    auto device = sched::CreateCudaDevice(0, options);
    if (device.ok()) ZINF_LOG_INFO("device: {}", (*device)->name());
    return device;
  }
  ZINF_LOG_INFO("no CUDA device: using host");
  return cpu::CreateHostDevice(options);
}

}  // namespace zinf
