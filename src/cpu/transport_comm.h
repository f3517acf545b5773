// TransportComm: the Communicator for HostDevice buffers over collectives
// that another distributed runtime already runs for this job — under
// torchrun, the deepspeed launcher, accelerate launch or srun, a gloo
// process group of torch.distributed (zinf.torch supplies the Transport, see
// src/torch/torch_comm.cc) — so that zinf joins the launcher's world without
// sockets of its own.
//
// zinf keeps its contract on top of the transport's operations:
//   - The rank-order reduction of communicator.h: a reduction is an
//     all-to-all through the transport followed by ReduceInRankOrder here,
//     so the bits equal MpiComm's on the same inputs, whatever the transport
//     would have summed in.
//   - Order: transports match operations by the order they were started in,
//     and the engine enqueues collectives on several streams whose threads
//     reach them in any order. Each collective is numbered when enqueued
//     (the same order on every rank) and starts its operations only on its
//     turn: after the collective before it started its last operation. Only
//     the start is ordered; operations run concurrently in the transport.
//     An all-reduce (two operations, the second after the sum) or a checked
//     collective holds the turn until its last operation starts.
//   - Failures: Abort posts "rank R stopped: cause" on the transport's board
//     (a key-value store every rank reads, torch.distributed's Store); every
//     wait reads the board at least every kBoardPeriod and fails with that
//     notice. A wait with no completion for the timeout posts that this rank
//     is stuck, gives the others up to kLateGrace to say the same, and fails
//     naming the ranks that did not (the silent ones). A transport error (a
//     peer's socket closed: it died) fails at once, with a peer's notice in
//     place of the transport's words when there is one.
//   - An operation abandoned by a failure may still use its buffers inside
//     the transport: they stay mapped (KeepMappedForAbandonedTransfer) and
//     its staging is never freed.
//
// Thread-safety: as Communicator; the Transport's methods are called from
// any of the streams' threads, one Start at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "common/communicator.h"
#include "zinf/status.h"

namespace zinf::cpu {

// What TransportComm moves bytes with. Buffers are host memory.
class Transport {
 public:
  enum class Op : int {
    // send: `bytes`; recv: size()*bytes, rank r's at recv + r*bytes. send may
    // be recv + rank()*bytes (in place).
    kAllGather = 0,
    // send and recv: size()*bytes each; send's chunk p goes to rank p, and
    // rank p's chunk for this rank lands at recv + p*bytes.
    kAllToAll = 1,
    // `bytes` of root's recv into every rank's recv (send unused).
    kBroadcast = 2,
    // No buffers.
    kBarrier = 3,
  };
  using Handle = void*;

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_size() const = 0;
  // Starts an operation and returns at once. Every rank starts the same
  // operations in the same order (TransportComm sees to it).
  virtual Result<Handle> Start(Op op, const void* send, void* recv, size_t bytes, int root) = 0;
  // Whether it is done; an error when it failed. Never blocks.
  virtual Result<bool> Test(Handle handle) = 0;
  // Ends the handle, done or not (then the operation may still use its
  // buffers for a while).
  virtual void Release(Handle handle) = 0;
  // The board: text by key, seen by every rank. Post may overwrite; Read
  // never blocks (nullopt: no such key yet).
  virtual Status Post(const std::string& key, const std::string& value) = 0;
  virtual Result<std::optional<std::string>> Read(const std::string& key) = 0;
};

// kInvalidArgument for a null transport, a non-positive timeout or a rank
// outside [0, size).
Result<std::unique_ptr<Communicator>> CreateTransportCommunicator(std::unique_ptr<Transport> transport,
                                                                  const CommOptions& options);

}  // namespace zinf::cpu
