// NcclComm: grouped ncclSend/ncclRecv all-to-all + rank-order kernel for
// reductions, NCCL's all-gather and broadcast for data movement, and the
// watchdog that turns an NCCL error, a hang or a peer's failure notice into a
// broken (aborted) communicator. See nccl_comm.h and common/communicator.h.
//
// Threads: the callers' (collectives, Abort, Health) and one watchdog per
// communicator. Locks; mu_ is outermost, and no thread holds two of the
// others at once:
//   mu_         one collective at a time, from validation to its watchdog
//               event (held while a call that answered ncclInProgress is
//               polled);
//   nccl_mu_    every NCCL call on comm_, and aborted_: ncclCommAbort frees
//               comm_, so nothing may touch it at or after that moment. Held
//               only for the calls themselves (a whole group: start, sends
//               and receives, end), never across a wait, so that Abort() and
//               the watchdog get in while a collective polls;
//   watch_mu_   the watchdog's queue of in-flight collectives, the event
//               pool and stop_;
//   notice_mu_  one notices_->Health() at a time;
//   Communicator::failure_mu_ (LocalFailure/SetLocalFailure): the cause.
// States: healthy -> broken (LocalFailure set, then comm_ aborted, first
// cause wins) or -> released (the destructor's finalize and destroy).
#include "gpu/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_device.h"
#include "gpu/reduce_kernels.h"

static_assert(sizeof(ncclUniqueId) == zinf::gpu::kNcclUniqueIdBytes, "NCCL_UNIQUE_ID_BYTES changed");

namespace zinf::gpu {
namespace {

Status NcclError(ncclResult_t rc, const char* stmt, ncclComm_t comm, const char* file, int line) {
  StatusCode code = StatusCode::kInternal;
  switch (rc) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      code = StatusCode::kInvalidArgument;
      break;
    case ncclSystemError:
    case ncclRemoteError:
      code = StatusCode::kUnavailable;
      break;
    default:
      break;
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

using Clock = std::chrono::steady_clock;

constexpr auto kWatchPeriod = std::chrono::milliseconds(50);
// How long an NCCL error or a timeout waits for a peer's notice that would
// explain it (see PreferNotice).
constexpr auto kNoticeGrace = std::chrono::milliseconds(200);

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string FormatSeconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", seconds);
  return buf;
}

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

// Balanced split, as MpiComm's: rank r owns [ChunkBegin(r), ChunkBegin(r + 1)).
size_t ChunkBegin(size_t count, int n, int r) {
  const size_t q = count / n, rem = count % n;
  return static_cast<size_t>(r) * q + std::min(static_cast<size_t>(r), rem);
}

// The communicator's state: ncclSuccess, ncclInProgress (a non-blocking call
// still being carried out) or the error that broke it.
ncclResult_t AsyncState(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
  return rc != ncclSuccess ? rc : state;
}

// Calls `poll` (returning the communicator's state) until the state leaves
// ncclInProgress, or returns ncclInProgress once `timeout_seconds` passed.
// Spins first (most calls settle within microseconds), then naps up to 1 ms
// (connection set-up with a peer can take seconds).
template <typename Poll>
ncclResult_t PollWhileInProgress(Poll&& poll, double timeout_seconds) {
  const Clock::time_point start = Clock::now();
  std::chrono::microseconds nap(5);
  for (int round = 0;; ++round) {
    const ncclResult_t state = poll();
    if (state != ncclInProgress) return state;
    if (SecondsSince(start) >= timeout_seconds) return ncclInProgress;
    if (round < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, bool owned, int rank, int size, int device, const CommOptions& options,
           std::unique_ptr<Communicator> notices)
      : comm_(comm),
        owned_(owned),
        rank_(rank),
        size_(size),
        device_(device),
        options_(options),
        notices_(std::move(notices)) {}

  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      stop_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    cudaSetDevice(device_);
    // The communicator outlives the work it enqueued (Communicator's
    // contract), so these events have completed.
    for (const Pending& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (barrier_scratch_) cudaFree(barrier_scratch_);
    if (owned_) Release();
    // notices_ (the MPI channel) is destroyed after this, with the members.
  }

  Status Init() {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMalloc(&barrier_scratch_, sizeof(float)));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemset(barrier_scratch_, 0, sizeof(float)));
    watchdog_ = std::thread([this] { WatchLoop(); });
    return Status::Ok();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status AllGather(const void* send, void* recv, size_t count, DType dtype, Stream& stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_ASSIGN_OR_RETURN(Op op, Begin(CollectiveKind::kAllGather, count, dtype, stream));
    Status st =
        Call(op, "ncclAllGather", [&] { return ncclAllGather(send, recv, count, NcclType(dtype), comm_, op.stream); });
    return Finish(op, std::move(st));
  }

  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_ASSIGN_OR_RETURN(Op call, Begin(CollectiveKind::kReduceScatter, count, dtype, stream));
    const size_t bytes = count * DTypeSizeBytes(dtype);
    const auto* in = static_cast<const char*>(send);
    std::vector<std::pair<const void*, size_t>> chunks(size_);
    for (int p = 0; p < size_; ++p) chunks[p] = {in + p * bytes, count};
    Status st = AllToAllThenReduce(call, chunks, count, recv, dtype, op, stream);
    return Finish(call, std::move(st));
  }

  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_ASSIGN_OR_RETURN(Op call, Begin(CollectiveKind::kAllReduce, count, dtype, stream));
    Status st = AllReduceBody(call, send, recv, count, dtype, op, stream);
    return Finish(call, std::move(st));
  }

  Status Broadcast(void* buffer, size_t count, DType dtype, int root, Stream& stream) override {
    if (root < 0 || root >= size_)
      return InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank of this " +
                             std::to_string(size_) + "-rank communicator");
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_ASSIGN_OR_RETURN(Op op, Begin(CollectiveKind::kBroadcast, count, dtype, stream));
    Status st = Call(op, "ncclBroadcast",
                     [&] { return ncclBroadcast(buffer, buffer, count, NcclType(dtype), root, comm_, op.stream); });
    return Finish(op, std::move(st));
  }

  // NCCL has no barrier: a one-element all-reduce orders the streams alike.
  Status Barrier(Stream& stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    ZINF_ASSIGN_OR_RETURN(Op op, Begin(CollectiveKind::kBarrier, 0, DType::kFloat32, stream));
    Status st = Call(op, "ncclAllReduce(barrier)", [&] {
      return ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, op.stream);
    });
    return Finish(op, std::move(st));
  }

  void Abort(const Status& cause) override {
    if (cause.ok()) return;
    Break(cause);
  }

  Status Health() override {
    Status failure = LocalFailure();
    if (!failure.ok() || !notices_) return failure;
    Status peer = NoticeHealth();
    if (peer.ok()) return peer;
    Break(peer);  // so that kernels in flight return, not only the next call
    return LocalFailure();
  }

  void SetStagingDevice(Device* device) override { staging_device_.store(device); }

  uint64_t ReductionStagingBytes(size_t count, DType dtype) const override {
    return NcclReductionStagingBytes(size_, count, dtype);
  }

 private:
  // One collective being enqueued.
  struct Op {
    std::string what;  // "reduce_scatter #12 of 4096 bf16 elements", for errors
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;  // recorded after it, for the watchdog
  };
  // A collective the watchdog waits for.
  struct Pending {
    cudaEvent_t event;
    Clock::time_point enqueued;
    std::string what;
  };

  std::string Who() const { return "NCCL communicator rank " + std::to_string(rank_) + " of " + std::to_string(size_); }

  // Validation, the collective's name and number, and its watchdog event.
  // An error here enqueued nothing. Caller holds mu_.
  Result<Op> Begin(CollectiveKind kind, size_t count, DType dtype, Stream& stream) {
    const std::string name(CollectiveName(kind));
    if (static_cast<unsigned>(dtype) > static_cast<unsigned>(DType::kFloat16))
      return InvalidArgument(name + ": unknown dtype " + std::to_string(static_cast<int>(dtype)));
    auto s = static_cast<cudaStream_t>(stream.native_handle());
    if (!s) {
      return InvalidArgument(name +
                             ": NcclComm needs a CUDA stream (this stream has no cudaStream_t: a HostDevice stream?)");
    }
    if (!LocalFailure().ok()) return BrokenError(name);
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    Op op;
    op.stream = s;
    op.what = name + " #" + std::to_string(++next_seq_);
    if (kind != CollectiveKind::kBarrier)
      op.what += " of " + std::to_string(count) + " " + std::string(DTypeName(dtype)) + " elements";
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      if (!free_events_.empty()) {
        op.event = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (!op.event) ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&op.event, cudaEventDisableTiming));
    return op;
  }

  // Hands the collective to the watchdog: its event, recorded on its stream
  // now. Recorded after a failure too, which may have come after part of the
  // work was enqueued.
  Status Finish(Op& op, Status st) {
    const cudaError_t err = cudaEventRecord(op.event, op.stream);
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (err != cudaSuccess) {
      free_events_.push_back(op.event);
      if (st.ok()) st = CudaError(err, "cudaEventRecord(watchdog event)", __FILE__, __LINE__).WithContext(op.what);
      return st;
    }
    pending_.push_back(Pending{op.event, Clock::now(), std::move(op.what)});
    return st;
  }

  Status BrokenError(const std::string& what) const {
    return Unavailable(what +
                       ": the NCCL communicator is unusable after an earlier failure: " + LocalFailure().message());
  }

  // The first cause wins. Tells the peers (this rank issues no further
  // collectives), then aborts NCCL so that kernels in flight return.
  void Break(const Status& cause) {
    SetLocalFailure(cause);
    if (notices_) notices_->Abort(LocalFailure());
    std::lock_guard<std::mutex> lock(nccl_mu_);
    if (aborted_) return;
    aborted_ = true;
    // Frees comm_; its result says nothing that could still be acted on.
    (void)ncclCommAbort(comm_);
  }

  // The end of an owned communicator: ncclCommFinalize polled to completion,
  // then ncclCommDestroy. A finalize that fails or does not settle within
  // the timeout (a peer gone) is an abort instead.
  void Release() {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    if (aborted_) return;  // ncclCommAbort freed it
    aborted_ = true;
    ncclResult_t rc = ncclCommFinalize(comm_);
    if (rc == ncclInProgress || rc == ncclSuccess)
      rc = PollWhileInProgress([this] { return AsyncState(comm_); }, options_.timeout_seconds);
    if (rc == ncclSuccess) {
      (void)ncclCommDestroy(comm_);
      return;
    }
    ZINF_LOG_WARN("{}: ncclCommFinalize: {}; aborting it instead", Who(),
                  rc == ncclInProgress ? "not complete after " + FormatSeconds(options_.timeout_seconds) + " s"
                                       : std::string(ncclGetErrorString(rc)));
    (void)ncclCommAbort(comm_);
  }

  // The channel's Health, one caller at a time: the watchdog and Health()
  // may ask together, and a probe-then-receive of the same notice from two
  // threads could leave one waiting for a message that is gone.
  Status NoticeHealth() {
    std::lock_guard<std::mutex> lock(notice_mu_);
    return notices_->Health();
  }

  // An NCCL error or a timeout is often the consequence of a peer's failure
  // (its abort closed the connections): when that peer's notice arrives
  // within kNoticeGrace, it is the better cause, naming the rank and why.
  Status PreferNotice(Status st) {
    if (!notices_) return st;
    const Clock::time_point until = Clock::now() + kNoticeGrace;
    for (;;) {
      Status peer = NoticeHealth();
      if (!peer.ok()) return peer;
      if (Clock::now() >= until) return st;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Polls the call `stmt` of `op` that answered ncclInProgress. A timeout or
  // an error breaks the communicator. Caller holds mu_, not nccl_mu_.
  Status AwaitProgress(const Op& op, const char* stmt) {
    bool aborted = false;
    const ncclResult_t state = PollWhileInProgress(
        [&] {
          std::lock_guard<std::mutex> lock(nccl_mu_);
          if (aborted_) {
            aborted = true;
            return ncclInternalError;
          }
          return AsyncState(comm_);
        },
        options_.timeout_seconds);
    if (aborted) return BrokenError(op.what);
    if (state == ncclSuccess) return Status::Ok();
    Status st;
    if (state == ncclInProgress) {
      st = Unavailable(Who() + ": " + op.what + ": " + stmt + " still in progress after " +
                       FormatSeconds(options_.timeout_seconds) +
                       " s (zinf.comm_timeout_s): a peer may be dead or stopped");
    } else {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      if (aborted_) return BrokenError(op.what);
      st = NcclError(state, stmt, comm_, __FILE__, __LINE__).WithContext(Who() + ": " + op.what);
    }
    st = PreferNotice(std::move(st));
    Break(st);
    return st;
  }

  // One NCCL call on comm_ outside a group; waits while it is in progress.
  template <typename F>
  Status Call(const Op& op, const char* stmt, F&& call) {
    ncclResult_t rc;
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      if (aborted_) return BrokenError(op.what);
      rc = call();
      if (rc != ncclSuccess && rc != ncclInProgress)
        return NcclError(rc, stmt, comm_, __FILE__, __LINE__).WithContext(op.what);
    }
    return rc == ncclInProgress ? AwaitProgress(op, stmt) : Status::Ok();
  }

  // Inside a group NCCL defers the work to ncclGroupEnd: ncclInProgress is
  // not an error there. Caller holds nccl_mu_.
  Status InGroup(ncclResult_t rc, const char* stmt) const {
    return rc == ncclSuccess || rc == ncclInProgress ? Status::Ok() : NcclError(rc, stmt, comm_, __FILE__, __LINE__);
  }

  // ncclGroupStart, `body` (sends and receives on comm_, checked with
  // InGroup), ncclGroupEnd; waits while the group is in progress.
  template <typename F>
  Status Group(const Op& op, F&& body) {
    Status st;
    ncclResult_t end = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      if (aborted_) return BrokenError(op.what);
      const ncclResult_t start = ncclGroupStart();
      if (start != ncclSuccess)
        return NcclError(start, "ncclGroupStart", comm_, __FILE__, __LINE__).WithContext(op.what);
      st = body();
      end = ncclGroupEnd();
      if (end != ncclSuccess && end != ncclInProgress && st.ok())
        st = NcclError(end, "ncclGroupEnd", comm_, __FILE__, __LINE__);
      st = std::move(st).WithContext(op.what);
    }
    if (end == ncclInProgress) {  // even after an error: no other NCCL call until it settles
      Status wait = AwaitProgress(op, "ncclGroupEnd");
      if (st.ok()) st = std::move(wait);
    }
    return st;
  }

  Status AllReduceBody(const Op& call, const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                       Stream& stream) {
    const size_t elem = DTypeSizeBytes(dtype);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    std::vector<std::pair<const void*, size_t>> chunks(size_);
    for (int p = 0; p < size_; ++p) {
      const size_t begin = ChunkBegin(count, size_, p);
      chunks[p] = {in + begin * elem, ChunkBegin(count, size_, p + 1) - begin};
    }
    const size_t mine = ChunkBegin(count, size_, rank_), my_count = chunks[rank_].second;
    ZINF_RETURN_IF_ERROR(AllToAllThenReduce(call, chunks, my_count, out + mine * elem, dtype, op, stream));
    if (size_ == 1) return Status::Ok();
    // All-gather of the uneven chunks. Zero-element messages are skipped on
    // both sides alike (both compute the same sizes).
    const ncclDataType_t type = NcclType(dtype);
    return Group(call, [&]() -> Status {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (my_count) {
          ZINF_RETURN_IF_ERROR(InGroup(ncclSend(out + mine * elem, my_count, type, p, comm_, call.stream), "ncclSend"));
        }
        const size_t begin = ChunkBegin(count, size_, p), n = ChunkBegin(count, size_, p + 1) - begin;
        if (n) {
          ZINF_RETURN_IF_ERROR(InGroup(ncclRecv(out + begin * elem, n, type, p, comm_, call.stream), "ncclRecv"));
        }
      }
      return Status::Ok();
    });
  }

  // chunks[p] = (device address, elements) of what this rank sends to p;
  // every peer sends `my_count` elements for this rank. The staging is
  // stream-ordered (from the staging device's budget, else cudaMallocAsync),
  // so concurrent collectives on different streams never share it. Caller
  // holds mu_.
  Status AllToAllThenReduce(const Op& call, const std::vector<std::pair<const void*, size_t>>& chunks, size_t my_count,
                            void* out, DType dtype, ReduceOp op, Stream& stream) {
    const size_t elem = DTypeSizeBytes(dtype);
    if (size_ == 1) {
      if (my_count && out != chunks[0].first) {
        ZINF_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(out, chunks[0].first, my_count * elem, cudaMemcpyDeviceToDevice, call.stream));
      }
      return Status::Ok();
    }
    const uint64_t staging_bytes = NcclReductionStagingBytes(size_, my_count, dtype);
    Device* const device = staging_device_.load();
    void* staging = nullptr;
    if (staging_bytes && device) {
      if (CudaOrdinal(*device) != device_) {
        return InvalidArgument(call.what + ": the staging device (" + device->name() +
                               ") is not this communicator's CUDA device " + std::to_string(device_));
      }
      Result<void*> got = device->Allocate(staging_bytes, stream);
      if (!got.ok()) {
        return got.status().WithContext(call.what + ": NCCL reduction staging of " + std::to_string(staging_bytes) +
                                        " bytes");
      }
      staging = *got;
    } else if (staging_bytes) {
      const cudaError_t err = cudaMallocAsync(&staging, staging_bytes, call.stream);
      if (err != cudaSuccess) {
        return CudaError(err, "cudaMallocAsync(staging)", __FILE__, __LINE__)
            .WithContext(call.what + ": NCCL reduction staging of " + std::to_string(staging_bytes) + " bytes");
      }
    }
    const size_t slot_bytes = my_count * elem;
    auto slot = [&](int p) { return static_cast<char*>(staging) + (p < rank_ ? p : p - 1) * slot_bytes; };
    const ncclDataType_t type = NcclType(dtype);
    Status st = Group(call, [&]() -> Status {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (chunks[p].second) {
          ZINF_RETURN_IF_ERROR(
              InGroup(ncclSend(chunks[p].first, chunks[p].second, type, p, comm_, call.stream), "ncclSend"));
        }
        if (my_count) {
          ZINF_RETURN_IF_ERROR(InGroup(ncclRecv(slot(p), my_count, type, p, comm_, call.stream), "ncclRecv"));
        }
      }
      return Status::Ok();
    });
    if (st.ok()) {
      st = LaunchReduceInRankOrder(staging, chunks[rank_].first, rank_, size_, out, my_count, dtype, op, call.stream);
    }
    if (staging) {
      Status freed;
      if (device) {
        freed = device->Free(staging, stream);
      } else {
        const cudaError_t err = cudaFreeAsync(staging, call.stream);
        if (err != cudaSuccess) freed = CudaError(err, "cudaFreeAsync(staging)", __FILE__, __LINE__);
      }
      if (st.ok()) st = std::move(freed);
    }
    return st;
  }

  // NCCL's asynchronous error, if any. OK once aborted (already broken).
  Status AsyncError() {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    if (aborted_) return Status::Ok();
    const ncclResult_t state = AsyncState(comm_);
    if (state == ncclSuccess || state == ncclInProgress) return Status::Ok();
    return NcclError(state, "asynchronous NCCL error (ncclCommGetAsyncError)", comm_, __FILE__, __LINE__)
        .WithContext(Who());
  }

  // The watchdog thread: every kWatchPeriod, recycles the events of
  // completed collectives, then breaks the communicator on a peer's notice,
  // an NCCL error, or the oldest collective in flight passing the timeout.
  // Stops when stop_ is set.
  void WatchLoop() {
    cudaSetDevice(device_);  // best effort: the events belong to device_
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!stop_) {
      watch_cv_.wait_for(lock, kWatchPeriod, [this] { return stop_; });
      if (stop_) break;
      for (auto it = pending_.begin(); it != pending_.end();) {
        const cudaError_t q = cudaEventQuery(it->event);
        if (q == cudaErrorNotReady) {
          ++it;
          continue;
        }
        if (q == cudaSuccess) {
          free_events_.push_back(it->event);
        } else {
          // The device failed; the stream reports that. Not recycled.
          (void)cudaGetLastError();
          cudaEventDestroy(it->event);
        }
        it = pending_.erase(it);
      }
      std::string oldest;
      double waited_seconds = 0;
      if (!pending_.empty()) {  // in enqueue order: the front is the oldest in flight
        oldest = pending_.front().what;
        waited_seconds = SecondsSince(pending_.front().enqueued);
      }
      lock.unlock();
      if (LocalFailure().ok()) {
        Status st = notices_ ? NoticeHealth() : Status::Ok();
        if (st.ok()) st = AsyncError();
        if (st.ok() && !oldest.empty()) {
          st = CheckNcclDeadline(oldest, waited_seconds, options_.timeout_seconds)
                   .WithContext(Who() + " (NCCL aborted)");
        }
        if (!st.ok()) Break(PreferNotice(std::move(st)));
      }
      lock.lock();
    }
  }

  ncclComm_t comm_;  // freed by ncclCommAbort: touched only under nccl_mu_ while !aborted_
  const bool owned_;
  const int rank_, size_, device_;
  const CommOptions options_;
  std::unique_ptr<Communicator> notices_;  // the peers' failure notices (MPI); may be null
  std::mutex notice_mu_;                   // one notices_->Health() at a time
  std::atomic<Device*> staging_device_{nullptr};
  float* barrier_scratch_ = nullptr;

  std::mutex mu_;          // one collective at a time
  uint64_t next_seq_ = 0;  // mu_

  std::mutex nccl_mu_;
  bool aborted_ = false;  // nccl_mu_: comm_ is gone (aborted, or released by the destructor)

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stop_ = false;                     // watch_mu_
  std::deque<Pending> pending_;           // watch_mu_; in enqueue order
  std::vector<cudaEvent_t> free_events_;  // watch_mu_; completed, to record again
  std::thread watchdog_;
};

Result<std::unique_ptr<Communicator>> Make(ncclComm_t comm, bool owned, int rank, int size, int device,
                                           const CommOptions& options, std::unique_ptr<Communicator> notices) {
  auto c = std::make_unique<NcclComm>(comm, owned, rank, size, device, options, std::move(notices));
  ZINF_RETURN_IF_ERROR(c->Init().WithContext("NCCL communicator"));
  return std::unique_ptr<Communicator>(std::move(c));
}

Status CheckTimeout(const CommOptions& options) {
  if (!(options.timeout_seconds > 0))
    return InvalidArgument("NCCL communicator: timeout_seconds must be positive, got " +
                           std::to_string(options.timeout_seconds));
  return Status::Ok();
}

Result<std::unique_ptr<Communicator>> CreateWithNotices(int rank, int size, const NcclUniqueId& id, int cuda_device,
                                                        const CommOptions& options,
                                                        std::unique_ptr<Communicator> notices) {
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument("NCCL communicator: rank " + std::to_string(rank) + " of " + std::to_string(size));
  ZINF_RETURN_IF_ERROR(CheckTimeout(options));
  ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_device));
  ncclUniqueId nccl_id;
  std::memcpy(nccl_id.internal, id.bytes, sizeof(nccl_id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, size, nccl_id, rank, &config);
  if (rc == ncclInProgress && comm)
    rc = PollWhileInProgress([comm] { return AsyncState(comm); }, options.timeout_seconds);
  if (rc != ncclSuccess) {
    const std::string what = "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                             ", device " + std::to_string(cuda_device) + ")";
    Status st = rc == ncclInProgress
                    ? Unavailable(what + ": not complete after " + FormatSeconds(options.timeout_seconds) +
                                  " s (zinf.comm_timeout_s): a peer may be dead, stopped or never started")
                    : NcclError(rc, what.c_str(), comm, __FILE__, __LINE__);
    if (comm) (void)ncclCommAbort(comm);
    return st;
  }
  return Make(comm, /*owned=*/true, rank, size, cuda_device, options, std::move(notices));
}

}  // namespace

uint64_t NcclReductionStagingBytes(int size, size_t count, DType dtype) {
  if (size <= 1) return 0;
  return static_cast<uint64_t>(size - 1) * count * DTypeSizeBytes(dtype);
}

Status CheckNcclDeadline(std::string_view what, double waited_seconds, double timeout_seconds) {
  if (waited_seconds < timeout_seconds) return Status::Ok();
  return Unavailable(std::string(what) + " has not completed " + FormatSeconds(waited_seconds) +
                     " s after it was enqueued (timeout " + FormatSeconds(timeout_seconds) +
                     " s, zinf.comm_timeout_s): a peer may be dead or stopped");
}

Result<NcclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  ZINF_NCCL_RETURN_IF_ERROR(nullptr, ncclGetUniqueId(&id));
  NcclUniqueId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size, const NcclUniqueId& id,
                                                             int cuda_device, const CommOptions& options,
                                                             std::unique_ptr<Communicator> notices) {
  return CreateWithNotices(rank, size, id, cuda_device, options, std::move(notices));
}

Result<std::unique_ptr<Communicator>> WrapNcclCommunicator(ncclComm* comm, const CommOptions& options) {
  if (!comm) return InvalidArgument("WrapNcclCommunicator: null ncclComm_t");
  ZINF_RETURN_IF_ERROR(CheckTimeout(options));
  // A non-blocking communicator may still be initializing. Not ours yet: on
  // an error or a timeout here it is left to the caller, not aborted.
  const ncclResult_t state = PollWhileInProgress([comm] { return AsyncState(comm); }, options.timeout_seconds);
  if (state == ncclInProgress) {
    return Unavailable("WrapNcclCommunicator: the communicator is still in progress after " +
                       FormatSeconds(options.timeout_seconds) + " s (zinf.comm_timeout_s)");
  }
  if (state != ncclSuccess)
    return NcclError(state, "WrapNcclCommunicator: ncclCommGetAsyncError", comm, __FILE__, __LINE__);
  int rank = 0, size = 0, device = 0;
  ZINF_NCCL_RETURN_IF_ERROR(comm, ncclCommUserRank(comm, &rank));
  ZINF_NCCL_RETURN_IF_ERROR(comm, ncclCommCount(comm, &size));
  ZINF_NCCL_RETURN_IF_ERROR(comm, ncclCommCuDevice(comm, &device));
  return Make(comm, /*owned=*/false, rank, size, device, options, nullptr);
}

bool IsNcclCommunicator(const Communicator* comm) { return dynamic_cast<const NcclComm*>(comm) != nullptr; }

}  // namespace zinf::gpu
