// The registry of the backends this build contains: the one place that asks
// which were built (backends.cc holds every #if ZINF_HAVE_* of zinf, besides
// the model's factory in exec/gpt_device.cc). It creates devices
// (CreateDevice, declared in zinf/device.h), communicators (MPI, and NCCL by
// id, by wrapping, or over the MPI ranks), hands out the per-device kernels
// the engine enqueues (KernelsFor, sched/device_kernels.h) and the GPU
// timings the benchmarks take. A backend this build lacks answers with
// NotBuilt (common/runtime_info.h).
//
// It lives in src/sched, the lowest area that sees every backend (cpu, gpu,
// nvme); the C ABI, the tools and the benchmarks above it ask here.
// Thread-safety: every function may be called from any thread.
#pragma once

#include <memory>

#include "common/communicator.h"
#include "common/runtime_info.h"
#include "gpu/flash_attention_timing.h"
#include "gpu/nccl_comm.h"
#include "math/attention_math.h"
#include "sched/device_kernels.h"

namespace zinf::sched {

// What this build of zinf contains and what it finds on the machine at run
// time: CUDA (and whether a device is present), NCCL, io_uring, oneTBB,
// hwloc's topology, the SIMD level, MPI and OpenBLAS. `zinf --version`
// prints it. Never fails (an unusable backend says why in its detail).
RuntimeInfo ProbeRuntime();

// Whether this build contains `backend`.
bool Built(OptionalBackend backend);

// The communicators over the ranks of the mpirun job (one rank without
// mpirun):
//   kMpi   host buffers (MpiComm, cpu/mpi_comm.h);
//   kNccl  CUDA buffers of device `cuda_device` (NcclComm, gpu/nccl_comm.h):
//          rank 0 makes the NCCL id and broadcasts it over MPI, and the MPI
//          communicator stays as NCCL's notice channel (a failed rank tells
//          the others). NotBuilt(kNccl) in a build without NCCL.
enum class CommBackend { kMpi, kNccl };
Result<std::unique_ptr<Communicator>> CreateCommunicator(CommBackend backend, const CommOptions& options,
                                                         int cuda_device = 0);

// NCCL without MPI (e.g. under torchrun), as gpu/nccl_comm.h states;
// NotBuilt(kNccl) in a build without NCCL. `nccl_comm` is an ncclComm_t.
Result<gpu::NcclUniqueId> NewNcclUniqueId();
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size, const gpu::NcclUniqueId& id,
                                                             int cuda_device, const CommOptions& options);
Result<std::unique_ptr<Communicator>> WrapNcclCommunicator(void* nccl_comm, const CommOptions& options);

// The GPU timings of `zinf bench attention` and `zinf bench model`
// (gpu/flash_attention_timing.h, gpu/gemm_reference.h, gpu/kernels.h).
struct CudaTimings {
  int (*device_count)();
  Result<gpu::FlashTiming> (*time_flash_attention)(const math::AttentionShape& shape, bool bf16_copies, int reps,
                                                   uint64_t seed, float range, gpu::FlashVariant variant);
  // Whether the two-buffer (cp.async) flash attention kernels fit the
  // device's shared memory at `head_dim`.
  Result<bool> (*flash_copies_fit)(int64_t head_dim);
  // Seconds of one m x n x k product by cuBLAS on `stream` (a cudaStream_t),
  // the median of `reps`.
  Result<double> (*time_cublas_product)(void* stream, int64_t m, int64_t n, int64_t k, bool bf16, const void* a,
                                        const void* b, float* c, int reps);
};
// NotBuilt(kCuda) in a build without CUDA.
Result<const CudaTimings*> GetCudaTimings();

}  // namespace zinf::sched
