// NcclComm: grouped ncclSend/ncclRecv all-to-all + rank-order kernel for
// reductions, NCCL's all-gather and broadcast for data movement. See
// nccl_comm.h and common/communicator.h.
#include "gpu/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cpu/mpi_comm.h"
#include "gpu/cuda_check.h"
#include "gpu/reduce_kernels.h"

static_assert(sizeof(ncclUniqueId) == zinf::gpu::kNcclUniqueIdBytes, "NCCL_UNIQUE_ID_BYTES changed");

namespace zinf::gpu {
namespace {

Status NcclError(ncclResult_t rc, const char* stmt, ncclComm_t comm, const char* file, int line) {
  StatusCode code = StatusCode::kInternal;
  switch (rc) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: code = StatusCode::kInvalidArgument; break;
    case ncclSystemError:
    case ncclRemoteError: code = StatusCode::kUnavailable; break;
    default: break;
  }
  const char* detail = ncclGetLastError(comm);
  int device = -1;
  cudaGetDevice(&device);  // best effort, as in cuda_check.h
  return Status(code, std::string(stmt) + ": " + ncclGetErrorString(rc) +
                          (detail && *detail ? std::string(" (") + detail + ")" : std::string()) + " on device " +
                          std::to_string(device) + " at " + file + ":" + std::to_string(line));
}

}  // namespace
}  // namespace zinf::gpu

// nccl-tests' NCCLCHECK, returning the error instead of exiting. `comm` names
// the communicator whose last error text to add (nullptr: the thread's).
#define ZINF_NCCL_RETURN_IF_ERROR(comm, stmt)                                                                          \
  do {                                                                                                                 \
    ncclResult_t zinf_nccl_rc_ = (stmt);                                                                               \
    if (zinf_nccl_rc_ != ncclSuccess) return ::zinf::gpu::NcclError(zinf_nccl_rc_, #stmt, (comm), __FILE__, __LINE__); \
  } while (0)

namespace zinf::gpu {
namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
  }
  return ncclFloat32;
}

// Balanced split, as MpiComm's: rank r owns [ChunkBegin(r), ChunkBegin(r + 1)).
size_t ChunkBegin(size_t count, int n, int r) {
  const size_t q = count / n, rem = count % n;
  return static_cast<size_t>(r) * q + std::min(static_cast<size_t>(r), rem);
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, bool owned, int rank, int size, int device, const CommOptions& options)
      : comm_(comm), owned_(owned), rank_(rank), size_(size), device_(device), options_(options) {}

  ~NcclComm() override {
    cudaSetDevice(device_);
    if (barrier_scratch_) cudaFree(barrier_scratch_);
    if (owned_) ncclCommDestroy(comm_);
  }

  Status Init() {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMalloc(&barrier_scratch_, sizeof(float)));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemset(barrier_scratch_, 0, sizeof(float)));
    return Status::Ok();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status AllGather(const void* send, void* recv, size_t count, DType dtype, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(cudaStream_t s, Begin("all_gather", dtype, stream));
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ZINF_NCCL_RETURN_IF_ERROR(comm_, ncclAllGather(send, recv, count, NcclType(dtype), comm_, s));
    return Status::Ok();
  }

  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(cudaStream_t s, Begin("reduce_scatter", dtype, stream));
    const size_t bytes = count * DTypeSizeBytes(dtype);
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const auto* in = static_cast<const char*>(send);
    std::vector<std::pair<const void*, size_t>> chunks(size_);
    for (int p = 0; p < size_; ++p) chunks[p] = {in + p * bytes, count};
    return AllToAllThenReduce(chunks, count, recv, dtype, op, s);
  }

  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(cudaStream_t s, Begin("all_reduce", dtype, stream));
    const size_t elem = DTypeSizeBytes(dtype);
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    std::vector<std::pair<const void*, size_t>> chunks(size_);
    for (int p = 0; p < size_; ++p) {
      const size_t begin = ChunkBegin(count, size_, p);
      chunks[p] = {in + begin * elem, ChunkBegin(count, size_, p + 1) - begin};
    }
    const size_t mine = ChunkBegin(count, size_, rank_), my_count = chunks[rank_].second;
    ZINF_RETURN_IF_ERROR(AllToAllThenReduce(chunks, my_count, out + mine * elem, dtype, op, s));
    // All-gather of the uneven chunks. Zero-element messages are skipped on
    // both sides alike (both compute the same sizes).
    ZINF_NCCL_RETURN_IF_ERROR(comm_, ncclGroupStart());
    Status st;
    for (int p = 0; p < size_ && st.ok(); ++p) {
      if (p == rank_) continue;
      if (my_count) st = Nccl(ncclSend(out + mine * elem, my_count, NcclType(dtype), p, comm_, s), "ncclSend");
      const size_t begin = ChunkBegin(count, size_, p), n = ChunkBegin(count, size_, p + 1) - begin;
      if (st.ok() && n) st = Nccl(ncclRecv(out + begin * elem, n, NcclType(dtype), p, comm_, s), "ncclRecv");
    }
    ncclResult_t end = ncclGroupEnd();
    ZINF_RETURN_IF_ERROR(st);
    ZINF_NCCL_RETURN_IF_ERROR(comm_, end);
    return Status::Ok();
  }

  Status Broadcast(void* buffer, size_t count, DType dtype, int root, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(cudaStream_t s, Begin("broadcast", dtype, stream));
    if (root < 0 || root >= size_)
      return InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank of this " +
                             std::to_string(size_) + "-rank communicator");
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ZINF_NCCL_RETURN_IF_ERROR(comm_, ncclBroadcast(buffer, buffer, count, NcclType(dtype), root, comm_, s));
    return Status::Ok();
  }

  // NCCL has no barrier: a one-element all-reduce orders the streams alike.
  Status Barrier(Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(cudaStream_t s, Begin("barrier", DType::kFloat32, stream));
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ZINF_NCCL_RETURN_IF_ERROR(comm_,
                              ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, s));
    return Status::Ok();
  }

 private:
  Result<cudaStream_t> Begin(const char* what, DType dtype, Stream& stream) {
    if (static_cast<unsigned>(dtype) > static_cast<unsigned>(DType::kFloat16))
      return InvalidArgument(std::string(what) + ": unknown dtype " + std::to_string(static_cast<int>(dtype)));
    auto s = static_cast<cudaStream_t>(stream.native_handle());
    if (!s) {
      return InvalidArgument(std::string(what) +
                             ": NcclComm needs a CUDA stream (this stream has no cudaStream_t: a HostDevice stream?)");
    }
    return s;
  }

  Status Nccl(ncclResult_t rc, const char* what) const {
    return rc == ncclSuccess ? Status::Ok() : NcclError(rc, what, comm_, __FILE__, __LINE__);
  }

  // chunks[p] = (device address, elements) of what this rank sends to p;
  // every peer sends `my_count` elements for this rank. Staging is
  // stream-ordered (cudaMallocAsync/cudaFreeAsync), so concurrent
  // collectives on different streams never share it. Caller holds mu_.
  Status AllToAllThenReduce(const std::vector<std::pair<const void*, size_t>>& chunks, size_t my_count, void* out,
                            DType dtype, ReduceOp op, cudaStream_t s) {
    const size_t elem = DTypeSizeBytes(dtype);
    if (size_ == 1) {
      if (my_count && out != chunks[0].first)
        ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, chunks[0].first, my_count * elem, cudaMemcpyDeviceToDevice, s));
      return Status::Ok();
    }
    void* staging = nullptr;
    const size_t slot_bytes = my_count * elem;
    if (slot_bytes) ZINF_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&staging, slot_bytes * (size_ - 1), s));
    auto slot = [&](int p) { return static_cast<char*>(staging) + (p < rank_ ? p : p - 1) * slot_bytes; };
    Status st = Nccl(ncclGroupStart(), "ncclGroupStart");
    if (st.ok()) {
      for (int p = 0; p < size_ && st.ok(); ++p) {
        if (p == rank_) continue;
        if (chunks[p].second)
          st = Nccl(ncclSend(chunks[p].first, chunks[p].second, NcclType(dtype), p, comm_, s), "ncclSend");
        if (st.ok() && my_count) st = Nccl(ncclRecv(slot(p), my_count, NcclType(dtype), p, comm_, s), "ncclRecv");
      }
      Status end = Nccl(ncclGroupEnd(), "ncclGroupEnd");
      if (st.ok()) st = end;
    }
    if (st.ok()) st = LaunchReduceInRankOrder(staging, chunks[rank_].first, rank_, size_, out, my_count, dtype, op, s);
    if (staging) {
      cudaError_t err = cudaFreeAsync(staging, s);
      if (st.ok() && err != cudaSuccess) st = CudaError(err, "cudaFreeAsync(staging)", __FILE__, __LINE__);
    }
    return st;
  }

  ncclComm_t comm_;
  const bool owned_;
  const int rank_, size_, device_;
  const CommOptions options_;
  std::mutex mu_;  // one thread in this NCCL communicator at a time
  float* barrier_scratch_ = nullptr;
};

Result<std::unique_ptr<Communicator>> Make(ncclComm_t comm, bool owned, int rank, int size, int device,
                                           const CommOptions& options) {
  auto c = std::make_unique<NcclComm>(comm, owned, rank, size, device, options);
  ZINF_RETURN_IF_ERROR(c->Init().WithContext("NCCL communicator"));
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace

Result<NcclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  ZINF_NCCL_RETURN_IF_ERROR(nullptr, ncclGetUniqueId(&id));
  NcclUniqueId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size, const NcclUniqueId& id,
                                                             int cuda_device, const CommOptions& options) {
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument("NCCL communicator: rank " + std::to_string(rank) + " of " + std::to_string(size));
  ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_device));
  ncclUniqueId nccl_id;
  std::memcpy(nccl_id.internal, id.bytes, sizeof(nccl_id.internal));
  ncclComm_t comm = nullptr;
  ZINF_NCCL_RETURN_IF_ERROR(nullptr, ncclCommInitRank(&comm, size, nccl_id, rank));
  return Make(comm, /*owned=*/true, rank, size, cuda_device, options);
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicatorOverMpi(int cuda_device, const CommOptions& options) {
  ZINF_ASSIGN_OR_RETURN(auto mpi, CreateMpiCommunicator(options));
  NcclUniqueId id{};
  if (mpi->rank() == 0) {
    ZINF_ASSIGN_OR_RETURN(id, NewNcclUniqueId());
  }
  // The id is plain host memory: an inline stream runs the broadcast here and now.
  InlineHostStream host;
  static_assert(kNcclUniqueIdBytes % 4 == 0);
  ZINF_RETURN_IF_ERROR(mpi->Broadcast(id.bytes, kNcclUniqueIdBytes / 4, DType::kFloat32, 0, host));
  ZINF_RETURN_IF_ERROR(host.Synchronize().WithContext("broadcasting the NCCL unique id"));
  return CreateNcclCommunicator(mpi->rank(), mpi->size(), id, cuda_device, options);
}

Result<std::unique_ptr<Communicator>> WrapNcclCommunicator(ncclComm* comm, const CommOptions& options) {
  if (!comm) return InvalidArgument("WrapNcclCommunicator: null ncclComm_t");
  int rank = 0, size = 0, device = 0;
  ZINF_NCCL_RETURN_IF_ERROR(comm, ncclCommUserRank(comm, &rank));
  ZINF_NCCL_RETURN_IF_ERROR(comm, ncclCommCount(comm, &size));
  ZINF_NCCL_RETURN_IF_ERROR(comm, ncclCommCuDevice(comm, &device));
  return Make(comm, /*owned=*/false, rank, size, device, options);
}

bool IsNcclCommunicator(const Communicator* comm) { return dynamic_cast<const NcclComm*>(comm) != nullptr; }

}  // namespace zinf::gpu
