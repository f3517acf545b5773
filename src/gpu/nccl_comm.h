// NcclComm: the Communicator for CUDA buffers. Collectives are enqueued with
// NCCL directly on the stream's cudaStream_t (Stream::native_handle), so they
// order with the stream's kernels and copies without any host round trip.
//
// Reductions are deterministic exactly as MpiComm's (common/communicator.h):
// an all-to-all of chunks with grouped ncclSend/ncclRecv into a staging
// buffer, then a kernel that reduces in rank order with the host's
// per-element math (gpu/reduce_kernels.cu). NCCL's own ring/tree reductions
// are not used: their summation order depends on the algorithm, protocol and
// channel count NCCL picks. All-reduce is that reduce-scatter followed by an
// all-gather, so RS + AG == AR bit for bit. All-gather and broadcast are
// NCCL's own (pure data movement). The staging ((size-1)*count elements per
// reduce-scatter, ReductionStagingBytes) comes from the device set with
// SetStagingDevice, stream-ordered from its budget (kOutOfMemory, nothing
// enqueued, when it does not fit); without one, from cudaMallocAsync.
//
// Two ways in: a rank/size/unique id (the ranks of an mpirun job get theirs
// from the backend registry, sched/backends.h, which broadcasts rank 0's id
// over MPI; a caller may exchange one its own way), or a caller's existing
// ncclComm_t (e.g. from torch.distributed under torchrun), which is used but
// not destroyed.
//
// Failures. The communicators made here are non-blocking NCCL communicators
// (ncclConfig_t::blocking = 0): no NCCL call blocks the host, and a call that
// answers ncclInProgress is polled (ncclCommGetAsyncError) for at most
// CommOptions::timeout_seconds. Each NcclComm runs one watchdog thread that
// wakes every 50 ms and breaks the communicator when
//   - NCCL reports an asynchronous error (naming NCCL's message),
//   - the oldest collective still in flight on the device has not completed
//     timeout_seconds after it was enqueued (kUnavailable naming the
//     collective and the wait: a peer may be dead or stopped; the time counts
//     from the enqueue, so it includes work queued before it on its stream),
//   - the notice channel (below) reports a peer's failure.
// Breaking calls ncclCommAbort, so NCCL kernels in flight return (the
// stream's later work runs on whatever they left: the data is garbage), and
// tells the peers through the notice channel when there is one. From then on
// every collective fails at once with kUnavailable "... unusable after an
// earlier failure: <cause>", and Health() returns the cause.
//
// The notice channel: a host communicator over the same ranks (the
// registry passes its MPI one), kept by the NCCL communicator; Abort(cause)
// tells every peer through it (MpiComm's Abort) before aborting NCCL here;
// a peer's notice reaches this rank's Health() and watchdog as kUnavailable
// "rank R stopped: <cause>". Without a channel (a caller-supplied id or
// communicator), Abort breaks only this rank, and the peers' watchdogs find
// it silent after timeout_seconds.
//
// No CUDA or NCCL header leaks from this file. Thread-safety: as
// Communicator; one thread at a time enqueues into the NCCL communicator
// (serialized internally), and Abort/Health may be called from any thread,
// also while another thread is inside a collective call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

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

// ncclCommInitRankConfig (non-blocking) with an id from rank 0 (e.g.
// broadcast over MPI, or exchanged through torchrun's store). Collective over
// the `size` ranks: returns once all joined, or kUnavailable after
// options.timeout_seconds (the half-made communicator aborted). `notices`,
// when not null, is a host communicator over the same ranks that the result
// keeps as its notice channel (Abort/Health above). `cuda_device` is this
// process's device ordinal.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size, const NcclUniqueId& id,
                                                             int cuda_device, const CommOptions& options,
                                                             std::unique_ptr<Communicator> notices = nullptr);

// Wraps an existing communicator, blocking or not as the caller made it (a
// non-blocking one still initializing is waited for, up to
// options.timeout_seconds). The caller keeps ownership and must keep it
// alive (and not destroy it) while the wrapper and its enqueued work exist;
// the wrapper never destroys it. But the watchdog does abort it, as its own,
// on an NCCL error, a timeout or Abort(): a hang is worse. ncclCommAbort
// frees the communicator, so once the wrapper's Health() is not OK the
// caller must neither use nor destroy its ncclComm_t. With a blocking
// communicator, an NCCL call that blocks the host (e.g. connecting to a peer
// that never comes) cannot be interrupted: the timeout covers work on the
// device only.
Result<std::unique_ptr<Communicator>> WrapNcclCommunicator(ncclComm* comm, const CommOptions& options);

// Whether `comm` is one of the communicators above (collectives on device memory).
bool IsNcclCommunicator(const Communicator* comm);

// Host-only pieces of NcclComm, exposed for tests and planning.
//
// The device staging of a reduction of `count` elements per rank on `size`
// ranks: (size-1) * count * element bytes; 0 on one rank (no exchange).
uint64_t NcclReductionStagingBytes(int size, size_t count, DType dtype);
// The watchdog's verdict on the oldest collective in flight, `what`
// ("reduce_scatter #12 of 4096 bf16 elements"), enqueued `waited_seconds`
// ago: OK while waited_seconds < timeout_seconds, else kUnavailable naming
// it, the wait and the likely cause.
Status CheckNcclDeadline(std::string_view what, double waited_seconds, double timeout_seconds);

}  // namespace zinf::gpu
