// NcclComm: the Communicator for CUDA buffers. Collectives are enqueued with
// NCCL directly on the stream's cudaStream_t (Stream::native_handle), so they
// order with the stream's kernels and copies without any host round trip.
//
// Reductions are deterministic exactly as MpiComm's (common/communicator.h):
// an all-to-all of chunks with grouped ncclSend/ncclRecv into a staging
// buffer (stream-ordered cudaMallocAsync), then a kernel that reduces in rank
// order with the host's per-element math (gpu/reduce_kernels.cu). NCCL's own
// ring/tree reductions are not used: their summation order depends on the
// algorithm, protocol and channel count NCCL picks. All-reduce is that
// reduce-scatter followed by an all-gather, so RS + AG == AR bit for bit.
// All-gather and broadcast are NCCL's own (pure data movement).
//
// Three ways in: ranks of an mpirun job (rank 0 makes the unique id and
// broadcasts it over MPI), a caller-supplied rank/size/unique id, or a
// caller's existing ncclComm_t (e.g. from torch.distributed under torchrun),
// which is used but not destroyed.
//
// Not (yet) here: CommOptions::checking (no call agreement is exchanged) and
// the deadline: a rank that stops makes NCCL wait (NCCL_TIMEOUT-style
// watchdogs are the caller's). No CUDA or NCCL header leaks from this file.
// Thread-safety: as Communicator; calls into one NCCL communicator are
// serialized internally.
#pragma once

#include <cstddef>
#include <memory>

#include "common/communicator.h"

struct ncclComm;  // ncclComm_t is `struct ncclComm*`

namespace zinf::gpu {

// NCCL_UNIQUE_ID_BYTES; the bytes of an ncclUniqueId, to send between ranks.
constexpr size_t kNcclUniqueIdBytes = 128;
struct NcclUniqueId {
  char bytes[kNcclUniqueIdBytes];
};

// ncclGetUniqueId: call on one rank, hand the result to every rank.
Result<NcclUniqueId> NewNcclUniqueId();

// The ranks of the MPI world (one process per GPU under mpirun; one rank
// without mpirun): rank 0 makes the id and broadcasts it through an MPI
// communicator. `cuda_device` is this process's device ordinal.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicatorOverMpi(int cuda_device, const CommOptions& options);

// ncclCommInitRank with a caller-supplied id (e.g. exchanged through
// torchrun's store). Collective over the `size` ranks: blocks until all join.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size, const NcclUniqueId& id,
                                                             int cuda_device, const CommOptions& options);

// Wraps an existing communicator; the caller keeps ownership and must keep it
// alive (and not destroy it) while the wrapper and its enqueued work exist.
Result<std::unique_ptr<Communicator>> WrapNcclCommunicator(ncclComm* comm, const CommOptions& options);

// Whether `comm` is one of the communicators above (collectives on device memory).
bool IsNcclCommunicator(const Communicator* comm);

}  // namespace zinf::gpu
