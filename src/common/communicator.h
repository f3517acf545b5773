// Communicator: the collectives zinf's ranks use to partition model state
// (ZeRO): all-gather, reduce-scatter, all-reduce (sum; max for overflow
// flags), broadcast and barrier, each enqueued on a Stream like any other
// device work. MpiComm (src/cpu/mpi_comm.h) moves HostDevice buffers between
// processes started by mpirun; NcclComm (src/gpu/nccl_comm.h) moves CUDA
// buffers.
//
// Deterministic by construction, on every backend: a reduction is
//   out[i] = in[0][i] (op) in[1][i] (op) ... (op) in[n-1][i]
// accumulated in fp32 strictly in rank order and, for bf16/fp16, rounded once
// to nearest-even at the end (ReduceInRankOrder below). Every rank first
// receives every other rank's contribution to the elements it owns (an
// all-to-all), then sums them locally in that order. So the same inputs on the
// same number of ranks give bit-identical outputs on every run, the result does
// not depend on how a ring or tree happens to be cut, and ReduceScatter
// followed by AllGather gives exactly what AllReduce gives (AllReduce *is*
// that pair). The price versus a ring, per rank for S bytes and n ranks:
//   - bytes on the wire: the same. Ring reduce-scatter sends (n-1)/n*S per
//     rank, so does the all-to-all; ring all-reduce 2(n-1)/n*S, so does
//     all-to-all + all-gather.
//   - messages: n-1 per phase at once instead of n-1 sequential steps, which
//     is better latency on one node and worse on a large fabric (every rank
//     talks to every rank: n^2 connections, incast on one link).
//   - staging memory: the all-to-all lands (n-1)/n*S before the sum, where a
//     ring needs S/n.
//   - reduction work: the same (n-1)/n*S element additions per rank, but done
//     after the exchange instead of overlapped with it, and in fp32.
// Broadcast is flat (the root sends S to each of n-1 ranks: (n-1)*S out of
// the root, where a pipelined ring sends S) and Barrier is n-1 empty messages
// per rank; both are fine for the handful of ranks on one node zinf targets.
//
// Thread-safety: a Communicator may be used from any thread, but every rank
// must enqueue the same collectives in the same order (as with NCCL and MPI);
// collectives enqueued on different streams may run concurrently. The
// communicator must outlive the work it enqueued (synchronize first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "common/host_device.h"
#include "common/float16.h"
#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

enum class ReduceOp : uint8_t { kSum, kMax };

// "sum", "max".
constexpr std::string_view ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

struct CommOptions {
  // A collective that makes no progress (no message arrives or leaves) for
  // this long fails with kUnavailable naming the silent ranks, and the
  // communicator is then broken: every later call fails at once. The
  // engine's config key zinf.comm_timeout_s, with the same default.
  double timeout_seconds = 300;
  // Before every collective the ranks exchange (kind, sequence number,
  // count, dtype, root); a mismatch is kInvalidArgument naming both ranks'
  // calls. Costs one small all-to-all per collective.
  bool checking = false;
};

// Ranks on this machine as the launcher states it: Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS, torchrun's
// LOCAL_WORLD_SIZE, Slurm's SLURM_NTASKS_PER_NODE (a single count) — the
// first that is a positive integer; 0 when none is.
int LocalRanksFromEnvironment();

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // How many of this communicator's ranks run on this machine (>= 1): what
  // per-rank defaults divide the machine's threads by. By default the
  // launcher's word for it (LocalRanksFromEnvironment), else 1.
  virtual int local_size() const;

  // All of these enqueue on `stream` and return at once (an error returned
  // here means nothing was enqueued: invalid arguments, or a broken
  // communicator); the collective runs in stream order, and its errors become
  // the stream's sticky error. Buffers are device memory of the stream's
  // device, untouched by the caller until the stream passes the collective.
  //
  // AllGather: send holds `count` elements, recv size()*count; rank r's
  // elements land at recv + r*count. In place when send == recv + rank()*count.
  virtual Status AllGather(const void* send, void* recv, size_t count, DType dtype, Stream& stream) = 0;
  // ReduceScatter: send holds size()*count elements, recv `count`: rank r
  // gets the reduction of every rank's send[r*count, (r+1)*count). In place
  // when recv == send + rank()*count.
  virtual Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               Stream& stream) = 0;
  // AllReduce: send and recv hold `count` elements; send == recv is allowed.
  virtual Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) = 0;
  // Broadcast: `count` elements from `root`'s buffer into every rank's.
  virtual Status Broadcast(void* buffer, size_t count, DType dtype, int root, Stream& stream) = 0;
  // Work after the barrier on `stream` starts only once every rank's stream
  // has reached its barrier.
  virtual Status Barrier(Stream& stream) = 0;

  // Failure sharing: ranks that partition one model must stop together, or
  // the survivors wait forever in a collective the failed rank never joins.
  //
  // Abort: this rank failed (`cause`, not OK) and will issue no further
  // collectives. Tells every other rank, without waiting for any of them
  // (best effort: a peer that is gone is skipped), and breaks this
  // communicator. On every rank, every collective in progress or enqueued
  // later then fails: at once here, and on a peer as soon as the notice
  // arrives, with kUnavailable "rank R stopped: <cause>". Idempotent; the
  // first cause wins. A communicator with no channel to its peers (the
  // default here) only breaks itself: the peers' deadlines find the rank
  // silent.
  virtual void Abort(const Status& cause);
  // OK, or why this communicator can no longer be used: a peer's notice
  // (naming the rank and its cause), a deadline that passed (naming the
  // silent ranks), or this rank's own Abort. Never blocks; cheap enough to
  // call before every step's work.
  virtual Status Health();

  // Where reduction staging comes from. A communicator whose reductions
  // stage on the device (NCCL's deterministic all-to-all) allocates that
  // staging from `device`'s budget when one is set here, instead of from the
  // driver; the engine sets its device at creation and counts the staging in
  // its plan (ReductionStagingBytes). nullptr: the communicator's own
  // allocation. Call before any collective is enqueued.
  virtual void SetStagingDevice(Device* device) { (void)device; }
  // The device staging a reduction of `count` elements (per rank's share, as
  // ReduceScatter's `count`) holds while it runs: 0 for communicators that
  // stage in host memory.
  virtual uint64_t ReductionStagingBytes(size_t count, DType dtype) const {
    (void)count;
    (void)dtype;
    return 0;
  }

 protected:
  // For implementations: the default Abort/Health state.
  Status LocalFailure() const;
  void SetLocalFailure(const Status& cause);

 private:
  mutable std::mutex failure_mu_;
  Status failure_;
};

// The ordered reduction every backend uses:
//   out[i] = in[0][i] (op) in[1][i] (op) ... (op) in[n-1][i]
// in fp32, in rank order, rounded once (RNE) for 16-bit types. kMax keeps a
// NaN and otherwise takes a later rank's value only when it is strictly
// greater, so -0/+0 ties resolve by rank too. A NaN result is always the
// canonical quiet NaN (0x7fc00000, bf16 0x7fc0, fp16 0x7e00): which NaN an
// addition returns differs between CPUs, compilers and GPUs. `out`
// may be one of the inputs (same element indices), not a shifted overlap.
// n >= 1. Host code; the CUDA kernel (src/gpu/reduce_kernels.cu) applies the
// same per-element functions below. Thread-safe (pure).
void ReduceInRankOrder(const void* const* inputs, int n, void* out, size_t count, DType dtype, ReduceOp op);

// "all_gather", "reduce_scatter", ... as collectives are named in errors.
enum class CollectiveKind : uint8_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
std::string_view CollectiveName(CollectiveKind kind);

// A stream for host memory that is not any device's: runs each task at once
// on the calling thread with an identity StreamContext, and keeps the first
// error sticky. For bootstrap exchanges (the NCCL unique id) and benchmarks
// over plain host buffers. Thread-safe.
class InlineHostStream final : public Stream {
 public:
  InlineHostStream();
  Status Enqueue(StreamTask task) override;
  Status Wait(Event& event) override;  // waits on the host at once
  Status Synchronize() override;
  Status sticky_error() override;
  void* native_handle() const override { return nullptr; }
  uint64_t id() const override { return id_; }

 private:
  const uint64_t id_;
  std::mutex mu_;  // one task at a time, and guards sticky_
  Status sticky_;
};

// The per-element math, shared by the host reduction and the CUDA kernel.
// A codec widens a stored element to fp32 (exactly) and narrows the fp32
// accumulator back (round to nearest even; see common/float16.h).
namespace reduce {

struct Fp32Codec {
  using Storage = float;
  ZINF_HOST_DEVICE static float Widen(float x) { return x; }
  ZINF_HOST_DEVICE static float Narrow(float x) { return x; }
};
struct Bf16Codec {
  using Storage = uint16_t;
  ZINF_HOST_DEVICE static float Widen(uint16_t x) { return Bf16BitsToFloat(x); }
  ZINF_HOST_DEVICE static uint16_t Narrow(float x) { return FloatToBf16Bits(x); }
};
struct Fp16Codec {
  using Storage = uint16_t;
  ZINF_HOST_DEVICE static float Widen(uint16_t x) { return HalfBitsToFloat(x); }
  ZINF_HOST_DEVICE static uint16_t Narrow(float x) { return FloatToHalfBits(x); }
};

// acc (op) x, where acc holds ranks 0..k-1 and x is rank k.
template <ReduceOp kOp>
ZINF_HOST_DEVICE inline float Combine(float acc, float x) {
  if constexpr (kOp == ReduceOp::kSum) {
    return acc + x;
  } else {
    if (acc != acc) return acc;  // NaN already: it stays
    return (x != x || x > acc) ? x : acc;
  }
}

// The accumulator, rounded to the stored type; any NaN becomes the
// canonical quiet NaN, so the bits do not depend on how the hardware (or the
// compiler's operand order) propagates NaN payloads and signs.
template <typename Codec>
ZINF_HOST_DEVICE inline typename Codec::Storage Finish(float acc) {
  return Codec::Narrow(acc != acc ? BitsToFloat(0x7fc00000u) : acc);
}

// One output element; element_of(r) is rank r's stored input element. The
// host's blocked loop (communicator.cc) applies the same Widen, Combine and
// Finish in the same order.
template <typename Codec, ReduceOp kOp, typename ElementOf>
ZINF_HOST_DEVICE inline typename Codec::Storage ReduceElement(const ElementOf& element_of, int n) {
  float acc = Codec::Widen(element_of(0));
  for (int r = 1; r < n; ++r) acc = Combine<kOp>(acc, Codec::Widen(element_of(r)));
  return Finish<Codec>(acc);
}

}  // namespace reduce
}  // namespace zinf
