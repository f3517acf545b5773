// MpiComm: collectives from tagged non-blocking point-to-point messages,
// polled against a no-progress deadline. See mpi_comm.h for the contract and
// common/communicator.h for the determinism argument and its cost.
//
// Why point-to-point and not MPI_Ialltoall & co: collectives enqueued on
// different streams run on different threads in whatever order those threads
// reach them, and MPI collectives on one communicator must be issued in the
// same order everywhere. A message tagged with (sequence number, phase)
// matches its peer's no matter which thread posts it or when. It also tells
// us, at the deadline, exactly which peers' messages never came: those are
// the silent ranks (the role an "arrival" message would otherwise play).
#include "cpu/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "cpu/collective_call.h"
#include "cpu/io_memory.h"
#include "cpu/mpi_runtime.h"
#include "cpu/startup_watch.h"

namespace zinf::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Messages are counted in MPI_BYTE with an int count; bigger transfers go
// as several messages with the same tag (MPI keeps them in order).
constexpr size_t kMaxMessageBytes = size_t{1} << 30;

// A failure notice (Abort): a 4-byte status code, 4 bytes of flags, the
// 8-byte number of collectives the sender finished (every one up to it;
// see Graced), then the cause's text, at most this long, on the
// communicator's own notice channel.
// Flag kPeerGone: the sender found a rank silent (no finalize at exit).
constexpr int kNoticeTag = 0;
constexpr size_t kNoticeHeader = 16;
constexpr size_t kMaxNoticeText = 4000;
constexpr int32_t kPeerGone = 1;

// Polling: spin while a message arrived this recently, else sleep this long.
constexpr auto kSpinWindow = std::chrono::microseconds(200);
constexpr auto kIdleSleep = std::chrono::microseconds(50);

// Abandoning a failed collective's requests: the transfers already under way
// are let finish while any of them still completes this often, up to the
// limit (see Abandon).
constexpr auto kDrainQuiet = std::chrono::milliseconds(200);
constexpr auto kDrainLimit = std::chrono::seconds(2);

// A collective the notice's sender finished before it stopped may still
// finish here: its messages to this rank are on their way, and so are those
// of the other ranks, which finish it too. It waits for them while any
// arrives this often, and fails once none does.
constexpr auto kNoticeGrace = std::chrono::milliseconds(500);

// tag = (seq * kPhases + phase) mod (MPI_TAG_UB + 1).
enum Phase : int { kCheckPhase = 0, kDataPhase = 1, kGatherPhase = 2, kPhases = 3 };

// One message to post: a send to or a receive from `peer`.
struct Transfer {
  bool is_send;
  int peer;
  void* buffer;  // host address
  size_t bytes;
};

// Balanced split of `count` elements over n ranks: rank r owns
// [ChunkBegin(r), ChunkBegin(r + 1)).
size_t ChunkBegin(size_t count, int n, int r) {
  const size_t q = count / n, rem = count % n;
  return static_cast<size_t>(r) * q + std::min(static_cast<size_t>(r), rem);
}

void* HostAddress(const StreamContext& ctx, const void* device_ptr) {
  return device_ptr ? ctx.Host(device_ptr) : nullptr;
}

// ---------------------------------------------------------------------------
class MpiComm final : public Communicator {
 public:
  // `runtime` null: the 1-rank communicator that never calls MPI.
  MpiComm(MpiRuntime* runtime, MPI_Comm comm, MPI_Comm notices, int rank, int size, int tag_ub,
          const CommOptions& options, int local_size = 1)
      : runtime_(runtime),
        comm_(comm),
        notices_(notices),
        rank_(rank),
        size_(size),
        local_size_(local_size),
        tag_ub_(tag_ub),
        options_(options) {}

  ~MpiComm() override {
    // Once broken, abandoned requests may still reference comm_: leave it.
    if (runtime_ && !broken_.load()) {
      auto lock = MpiLock();
      MPI_Comm_free(&comm_);
      MPI_Comm_free(&notices_);
    }
  }

  // Sends the notice to every peer (MPI_Isend, freed at once: a small
  // message goes eagerly, and a peer that is gone must not hold this rank
  // up), then breaks. The peers poll for it in every collective's wait and
  // in Health().
  void Abort(const Status& cause) override {
    if (cause.ok()) return;
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      first = !aborted_;
      aborted_ = true;
    }
    if (!first) return;
    if (runtime_ && size_ > 1 && !notified_by_peer_.load()) {
      std::string text = std::string(StatusCodeName(cause.code())) + ": " + cause.message();
      if (text.size() > kMaxNoticeText) text.resize(kMaxNoticeText);
      notice_.resize(kNoticeHeader + text.size());
      const int32_t code = static_cast<int32_t>(cause.code());
      const int32_t flags = peers_gone_.load() ? kPeerGone : 0;
      const uint64_t finished = FinishedPrefix();
      std::memcpy(notice_.data(), &code, 4);
      std::memcpy(notice_.data() + 4, &flags, 4);
      std::memcpy(notice_.data() + 8, &finished, 8);
      std::memcpy(notice_.data() + kNoticeHeader, text.data(), text.size());
      auto lock = MpiLock();
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        MPI_Request request = MPI_REQUEST_NULL;
        if (MPI_Isend(notice_.data(), static_cast<int>(notice_.size()), MPI_BYTE, p, kNoticeTag, notices_, &request) ==
                MPI_SUCCESS &&
            request != MPI_REQUEST_NULL) {
          MPI_Request_free(&request);
        }
      }
    }
    // Every rank is still there (unless a deadline said otherwise): MPI_Finalize
    // at exit stays, so the job ends cleanly once every rank exits.
    Break(cause);
  }

  Status Health() override {
    if (!broken_.load()) PollNotices();
    if (!broken_.load()) return Status::Ok();
    std::lock_guard<std::mutex> lock(broken_mu_);
    return broken_cause_;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }

  Status AllGather(const void* send, void* recv, size_t count, DType dtype, Stream& stream) override {
    CallInfo info;
    info.kind = CollectiveKind::kAllGather;
    info.count = count;
    info.dtype = dtype;
    ZINF_RETURN_IF_ERROR(Validate(info, send, recv));
    return Submit(info, stream, [this, send, recv](const CallInfo& c, const StreamContext& ctx, Clock::time_point* t) {
      return RunAllGather(c, HostAddress(ctx, send), HostAddress(ctx, recv), t);
    });
  }

  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    CallInfo info;
    info.kind = CollectiveKind::kReduceScatter;
    info.count = count;
    info.dtype = dtype;
    info.op = op;
    ZINF_RETURN_IF_ERROR(Validate(info, send, recv));
    return Submit(info, stream, [this, send, recv](const CallInfo& c, const StreamContext& ctx, Clock::time_point* t) {
      return RunReduceScatter(c, HostAddress(ctx, send), HostAddress(ctx, recv), t);
    });
  }

  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    CallInfo info;
    info.kind = CollectiveKind::kAllReduce;
    info.count = count;
    info.dtype = dtype;
    info.op = op;
    ZINF_RETURN_IF_ERROR(Validate(info, send, recv));
    return Submit(info, stream, [this, send, recv](const CallInfo& c, const StreamContext& ctx, Clock::time_point* t) {
      return RunAllReduce(c, HostAddress(ctx, send), HostAddress(ctx, recv), t);
    });
  }

  Status Broadcast(void* buffer, size_t count, DType dtype, int root, Stream& stream) override {
    CallInfo info;
    info.kind = CollectiveKind::kBroadcast;
    info.count = count;
    info.dtype = dtype;
    info.root = root;
    ZINF_RETURN_IF_ERROR(Validate(info, buffer, buffer));
    return Submit(info, stream, [this, buffer](const CallInfo& c, const StreamContext& ctx, Clock::time_point* t) {
      return RunBroadcast(c, HostAddress(ctx, buffer), t);
    });
  }

  Status Barrier(Stream& stream) override {
    CallInfo info;
    info.kind = CollectiveKind::kBarrier;
    ZINF_RETURN_IF_ERROR(Validate(info, nullptr, nullptr));
    return Submit(info, stream, [this](const CallInfo& c, const StreamContext&, Clock::time_point* t) {
      std::vector<Transfer> transfers;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        transfers.push_back({false, p, nullptr, 0});
        transfers.push_back({true, p, nullptr, 0});
      }
      return Exchange(c, kDataPhase, transfers, t);
    });
  }

 private:
  using Body = std::function<Status(const CallInfo&, const StreamContext&, Clock::time_point*)>;

  Status Validate(const CallInfo& c, const void* send, const void* recv) const {
    if (broken_.load()) return BrokenError(std::string(CollectiveName(c.kind)));
    return ValidateCall(c, send, recv, size_);
  }

  // Receives a peer's failure notice, if one came, and breaks on it.
  void PollNotices() {
    if (!runtime_ || size_ == 1) return;
    // One thread at a time: two that probed the same notice would both
    // receive it, and the second would wait forever.
    std::unique_lock<std::mutex> one(notice_mu_, std::try_to_lock);
    if (!one.owns_lock()) return;  // another thread is looking right now
    auto lock = MpiLock();
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, notices_, &flag, &status) != MPI_SUCCESS || !flag) return;
    int bytes = 0;
    if (MPI_Get_count(&status, MPI_BYTE, &bytes) != MPI_SUCCESS || bytes < static_cast<int>(kNoticeHeader))
      bytes = static_cast<int>(kNoticeHeader);
    std::vector<char> buf(static_cast<size_t>(bytes));
    if (MPI_Recv(buf.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kNoticeTag, notices_, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS) {
      return;
    }
    int32_t flags = 0;
    uint64_t finished = 0;
    std::memcpy(&flags, buf.data() + 4, 4);
    std::memcpy(&finished, buf.data() + 8, 8);
    const std::string text(buf.data() + kNoticeHeader, buf.size() - kNoticeHeader);
    notified_by_peer_.store(true);
    Break(Unavailable("rank " + std::to_string(status.MPI_SOURCE) + " stopped: " + text),
          /*peers_silent=*/(flags & kPeerGone) != 0, /*peer_finished=*/finished);
  }

  // A collective that the peer whose notice broke this communicator had
  // finished: it may finish here too, if the peers' messages come
  // (kNoticeGrace). A rank that stops while ahead of its peers thus leaves
  // no rank failing a collective that every rank has done its part of.
  bool Graced(const CallInfo& c) const { return c.seq <= last_graced_seq_.load(); }

  // The collectives finished so far: every one numbered up to the result.
  uint64_t FinishedPrefix() {
    std::lock_guard<std::mutex> lock(finished_mu_);
    return finished_prefix_;
  }

  void Finished(uint64_t seq) {
    std::lock_guard<std::mutex> lock(finished_mu_);
    if (seq == finished_prefix_ + 1 && finished_later_.empty()) {  // in order, as one stream finishes them
      finished_prefix_ = seq;
      return;
    }
    finished_later_.insert(seq);
    while (!finished_later_.empty() && *finished_later_.begin() == finished_prefix_ + 1) {
      finished_later_.erase(finished_later_.begin());
      ++finished_prefix_;
    }
  }

  Status BrokenError(const std::string& what) const {
    std::lock_guard<std::mutex> lock(broken_mu_);
    return Unavailable(what + ": the communicator is unusable after an earlier failure: " + broken_cause_.message());
  }

  // Refuses all later work. `peers_silent`: a deadline passed, so some rank
  // is gone or stopped, and MPI_Finalize (which waits for every rank) must
  // not run at exit. `peer_finished`: the cause is a peer's notice, and
  // that peer finished every collective up to this number (see Graced).
  void Break(const Status& cause, bool peers_silent = false, uint64_t peer_finished = 0) {
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      if (!broken_.load()) {
        broken_cause_ = cause;
        last_graced_seq_.store(peer_finished);
      }
      broken_.store(true);
    }
    if (peers_silent) {
      peers_gone_.store(true);
      MpiRuntime::SkipFinalize();
    }
  }

  // Numbers the collective now, in call order, and runs `body` in stream order.
  Status Submit(CallInfo info, Stream& stream, Body body) {
    info.seq = next_seq_.fetch_add(1) + 1;
    Status st = stream.Enqueue([this, info, body = std::move(body)](const StreamContext& ctx) -> Status {
      if (broken_.load() && !Graced(info)) return BrokenError(Describe(info));
      Clock::time_point last_progress = Clock::now();
      if (options_.checking && size_ > 1) ZINF_RETURN_IF_ERROR(CheckAgreement(info, &last_progress));
      Status done = body(info, ctx, &last_progress);
      if (done.ok()) Finished(info.seq);
      return done;
    });
    if (!st.ok()) {
      // This rank's sequence numbers would no longer match its peers'.
      Status cause = st.WithContext("enqueue " + Describe(info));
      Break(cause);
      return cause;
    }
    return Status::Ok();
  }

  // Checking mode: every rank sends its call to every other; any difference
  // from rank 0's call is reported the same way on every rank.
  Status CheckAgreement(const CallInfo& info, Clock::time_point* last_progress) {
    std::vector<WireCall> calls(size_);
    calls[rank_] = WireCall::From(info);
    std::vector<Transfer> transfers;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      transfers.push_back({false, p, &calls[p], sizeof(WireCall)});
      transfers.push_back({true, p, &calls[rank_], sizeof(WireCall)});
    }
    ZINF_RETURN_IF_ERROR(Exchange(info, kCheckPhase, transfers, last_progress));
    return CompareCalls(info, calls);
  }

  Status RunAllGather(const CallInfo& c, const void* send, void* recv, Clock::time_point* t) {
    const size_t bytes = c.count * DTypeSizeBytes(c.dtype);
    auto* out = static_cast<std::byte*>(recv);
    if (bytes && out + rank_ * bytes != send) std::memmove(out + rank_ * bytes, send, bytes);
    std::vector<Transfer> transfers;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      transfers.push_back({false, p, out + p * bytes, bytes});
      transfers.push_back({true, p, const_cast<void*>(send), bytes});
    }
    return Exchange(c, kDataPhase, transfers, t);
  }

  Status RunReduceScatter(const CallInfo& c, const void* send, void* recv, Clock::time_point* t) {
    const size_t bytes = c.count * DTypeSizeBytes(c.dtype);
    if (size_ == 1) {
      if (bytes && recv != send) std::memmove(recv, send, bytes);
      return Status::Ok();
    }
    const auto* in = static_cast<const std::byte*>(send);
    return AllToAllThenReduce(
        c, c.count,
        [&](int p) {
          return Chunk{in + p * bytes, bytes};
        },
        recv, t);
  }

  // Reduce-scatter over the balanced split (rank r reduces its chunk of
  // every rank's input), then all-gather of the chunks: bit for bit what
  // ReduceScatter + AllGather give, element by element.
  Status RunAllReduce(const CallInfo& c, const void* send, void* recv, Clock::time_point* t) {
    const size_t elem = DTypeSizeBytes(c.dtype);
    if (size_ == 1) {
      if (c.count && recv != send) std::memmove(recv, send, c.count * elem);
      return Status::Ok();
    }
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    auto chunk_of = [&](int p) {
      const size_t begin = ChunkBegin(c.count, size_, p), end = ChunkBegin(c.count, size_, p + 1);
      return std::make_pair(begin * elem, (end - begin) * elem);
    };
    const auto [my_offset, my_bytes] = chunk_of(rank_);
    ZINF_RETURN_IF_ERROR(AllToAllThenReduce(
        c, my_bytes / elem,
        [&](int p) {
          const auto [offset, bytes] = chunk_of(p);
          return Chunk{in + offset, bytes};
        },
        out + my_offset, t));
    std::vector<Transfer> transfers;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto [offset, bytes] = chunk_of(p);
      transfers.push_back({false, p, out + offset, bytes});
      transfers.push_back({true, p, out + my_offset, my_bytes});
    }
    return Exchange(c, kGatherPhase, transfers, t);
  }

  struct Chunk {
    const std::byte* data;
    size_t bytes;
  };

  // The all-to-all and the ordered sum: sends chunk_for(p) to each peer p,
  // receives each peer's `my_count` elements for this rank into staging, and
  // reduces them with this rank's own chunk_for(rank_) in rank order into
  // `out` (which may be that own chunk).
  template <typename ChunkFor>
  Status AllToAllThenReduce(const CallInfo& c, size_t my_count, ChunkFor chunk_for, void* out, Clock::time_point* t) {
    const size_t slot_bytes = my_count * DTypeSizeBytes(c.dtype);
    ZINF_ASSIGN_OR_RETURN(StagingPool::Buffer staging, staging_.Acquire(slot_bytes * (size_ - 1)));
    auto slot = [&](int p) { return staging.data.get() + (p < rank_ ? p : p - 1) * slot_bytes; };
    std::vector<Transfer> transfers;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Chunk chunk = chunk_for(p);
      transfers.push_back({false, p, slot(p), slot_bytes});
      transfers.push_back({true, p, const_cast<std::byte*>(chunk.data), chunk.bytes});
    }
    if (Status st = Exchange(c, kDataPhase, transfers, t); !st.ok()) {
      // The communicator is broken now, and a request that could not be
      // cancelled may still write here: leak the buffer rather than reuse it.
      (void)staging.data.release();
      return st;
    }
    std::vector<const void*> inputs(size_);
    for (int p = 0; p < size_; ++p) inputs[p] = p == rank_ ? static_cast<const void*>(chunk_for(p).data) : slot(p);
    ReduceInRankOrder(inputs.data(), size_, out, my_count, c.dtype, c.op);
    staging_.Release(std::move(staging));
    return Status::Ok();
  }

  int Tag(const CallInfo& c, Phase phase) const {
    return static_cast<int>((c.seq * kPhases + phase) % (static_cast<uint64_t>(tag_ub_) + 1));
  }

  // Posts every transfer, then polls until all complete. Fails when nothing
  // completes for options_.timeout_seconds (since *last_progress, which
  // carries over between the phases of one collective), when another
  // collective breaks the communicator meanwhile, or on an MPI error. Any
  // failure here breaks the communicator: messages may be half-delivered.
  Status Exchange(const CallInfo& c, Phase phase, const std::vector<Transfer>& transfers,
                  Clock::time_point* last_progress) {
    if (transfers.empty()) return Status::Ok();
    ZINF_CHECK(runtime_ != nullptr);
    const int tag = Tag(c, phase);
    struct Piece {
      const Transfer* transfer;
      size_t bytes;
      std::byte* data = nullptr;  // set when posted
    };
    std::vector<Piece> pieces;
    // Receives first, so a peer's message finds its buffer posted.
    for (int pass = 0; pass < 2; ++pass) {
      for (const Transfer& tr : transfers) {
        if (tr.is_send != (pass == 1)) continue;
        size_t left = tr.bytes;
        do {
          const size_t n = std::min(left, kMaxMessageBytes);
          pieces.push_back({&tr, n});
          left -= n;
        } while (left > 0);
      }
    }
    std::vector<MPI_Request> requests(pieces.size(), MPI_REQUEST_NULL);
    Status posted;
    {
      auto lock = MpiLock();
      std::vector<size_t> offsets(transfers.size(), 0);
      for (size_t i = 0; i < pieces.size() && posted.ok(); ++i) {
        const Transfer& tr = *pieces[i].transfer;
        size_t& offset = offsets[&tr - transfers.data()];
        auto* buf = pieces[i].data = static_cast<std::byte*>(tr.buffer) + offset;
        const int n = static_cast<int>(pieces[i].bytes);
        int rc = tr.is_send ? MPI_Isend(buf, n, MPI_BYTE, tr.peer, tag, comm_, &requests[i])
                            : MPI_Irecv(buf, n, MPI_BYTE, tr.peer, tag, comm_, &requests[i]);
        offset += pieces[i].bytes;
        if (rc != MPI_SUCCESS) {
          posted = Status(MpiErrorCode(rc), Describe(c) + ": " + (tr.is_send ? "MPI_Isend to" : "MPI_Irecv from") +
                                                " rank " + std::to_string(tr.peer) + " (" + std::to_string(n) +
                                                " bytes): " + MpiErrorText(rc));
        }
      }
    }
    if (!posted.ok()) {
      Abandon(pieces, requests);
      Break(posted);
      return posted;
    }

    size_t pending = pieces.size();
    std::vector<int> indices(pieces.size());
    std::vector<MPI_Status> statuses(pieces.size());
    const auto timeout = std::chrono::duration<double>(options_.timeout_seconds);
    Clock::time_point last_event = Clock::now();   // this exchange's start or its latest completion
    std::optional<Clock::time_point> broken_seen;  // when this exchange found the communicator broken
    while (pending > 0) {
      int completed = 0;
      int rc;
      {
        auto lock = MpiLock();
        rc = MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &completed, indices.data(),
                          statuses.data());
      }
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        Status st(MpiErrorCode(rc), Describe(c) + ": MPI_Testsome: " + MpiErrorText(rc));
        Abandon(pieces, requests);
        Break(st);
        return st;
      }
      if (completed == MPI_UNDEFINED) completed = 0;
      for (int k = 0; k < completed; ++k) {
        const Piece& piece = pieces[indices[k]];
        Status st = CheckCompletion(c, piece.transfer->is_send, piece.transfer->peer, piece.bytes, statuses[k],
                                    rc == MPI_ERR_IN_STATUS);
        if (!st.ok()) {
          Abandon(pieces, requests);
          Break(st);
          return st;
        }
      }
      pending -= static_cast<size_t>(completed);
      const auto now = Clock::now();
      if (completed > 0) {
        *last_progress = last_event = now;
        continue;
      }
      if (now - last_event >= kSpinWindow) PollNotices();  // a peer's Abort
      // Another collective on this communicator failed meanwhile, or a peer
      // stopped (the messages of a collective it finished are still let come).
      if (broken_.load()) {
        if (!broken_seen) broken_seen = now;
        if (!Graced(c) || now - std::max(last_event, *broken_seen) >= kNoticeGrace) {
          Abandon(pieces, requests);
          return BrokenError(Describe(c));
        }
      }
      if (now - *last_progress > timeout) {
        Status st = Unavailable(Describe(c) + ": no progress after " + FormatSeconds(options_.timeout_seconds) +
                                "; silent ranks: " + SilentRanks(pieces, requests));
        Abandon(pieces, requests);
        Break(st, /*peers_silent=*/true);
        return st;
      }
      // Spin (yielding) while messages flow or were just posted, then sleep:
      // on an oversubscribed node a rank that spins while it waits for a late
      // peer starves the others, and a rank that sleeps at once makes every
      // small collective wait out its naps (docs/figures.md, the MPI
      // communicator).
      if (now - last_event < kSpinWindow)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(kIdleSleep);
    }
    return Status::Ok();
  }

  Status CheckCompletion(const CallInfo& c, bool is_send, int peer, size_t expected_bytes, const MPI_Status& status,
                         bool look_at_error) const {
    if (look_at_error && status.MPI_ERROR != MPI_SUCCESS) {
      return Status(
          MpiErrorCode(status.MPI_ERROR),
          Describe(c) + ": " + (is_send ? "send to" : "receive from") + " rank " + std::to_string(peer) + ": " +
              MpiErrorText(status.MPI_ERROR) +
              (is_send ? "" : "; do the ranks pass the same arguments? (CommOptions::checking compares them)"));
    }
    if (is_send) return Status::Ok();
    int received = 0;
    MPI_Status copy = status;
    int rc;
    {
      auto lock = MpiLock();
      rc = MPI_Get_count(&copy, MPI_BYTE, &received);
    }
    if (rc != MPI_SUCCESS) return Internal(Describe(c) + ": MPI_Get_count: " + MpiErrorText(rc));
    if (static_cast<size_t>(received) != expected_bytes) {
      return InvalidArgument(Describe(c) + ": rank " + std::to_string(peer) + " sent " + std::to_string(received) +
                             " bytes where " + std::to_string(expected_bytes) +
                             " were expected; do the ranks pass the same arguments? (CommOptions::checking compares "
                             "them)");
    }
    return Status::Ok();
  }

  // Peers whose messages to us never came; if every receive is done, the
  // peers that never took what we sent.
  template <typename Pieces>
  std::string SilentRanks(const Pieces& pieces, const std::vector<MPI_Request>& requests) const {
    std::vector<int> recv_peers, send_peers;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      (pieces[i].transfer->is_send ? send_peers : recv_peers).push_back(pieces[i].transfer->peer);
    }
    std::vector<int>& peers = recv_peers.empty() ? send_peers : recv_peers;
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    std::string s;
    for (int p : peers) s += (s.empty() ? "" : ", ") + std::to_string(p);
    return s.empty() ? "none" : s;
  }

  // Ends a failed collective's outstanding requests before its buffers go
  // back to the caller, who frees them on the error path. Receives no
  // message has matched yet are cancelled (so no late message lands in a
  // buffer the caller reuses). A transfer already under way cannot be
  // cancelled: freed at once, its request would go on moving bytes from and
  // into those buffers in later MPI calls, MPI_Finalize at exit included,
  // and Open MPI's shared-memory transport then faults (seen in the rank
  // fault campaign). So the requests are polled while any still completes,
  // since a live peer finishes a transfer it has begun within milliseconds,
  // and what is left after kDrainQuiet without a completion (or after
  // kDrainLimit) is freed: mostly a send no receive has matched yet, or a
  // receive from a rank that is gone. A peer that has not yet noticed the
  // failure may still match such a send, so its memory stays mapped until
  // exit (KeepMappedForAbandonedTransfer): the transport then reads stale
  // bytes of a collective that fails anyway, rather than fault.
  template <typename Pieces>
  void Abandon(const Pieces& pieces, std::vector<MPI_Request>& requests) {
    {
      auto lock = MpiLock();
      for (size_t i = 0; i < requests.size(); ++i)
        if (requests[i] != MPI_REQUEST_NULL && !pieces[i].transfer->is_send) MPI_Cancel(&requests[i]);
    }
    std::vector<int> indices(requests.size());
    std::vector<MPI_Status> statuses(requests.size());
    const Clock::time_point start = Clock::now();
    Clock::time_point last_completion = start;
    for (;;) {
      int completed = 0, rc;
      {
        auto lock = MpiLock();
        rc = MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &completed, indices.data(),
                          statuses.data());
        // A request that ended in error is left to its owner: free it.
        for (int k = 0; rc == MPI_ERR_IN_STATUS && k < completed; ++k)
          if (requests[indices[k]] != MPI_REQUEST_NULL) MPI_Request_free(&requests[indices[k]]);
      }
      if ((rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) || completed == MPI_UNDEFINED) break;
      const Clock::time_point now = Clock::now();
      if (completed > 0) last_completion = now;
      if (now - last_completion >= kDrainQuiet || now - start >= kDrainLimit) break;
      std::this_thread::sleep_for(kIdleSleep);
    }
    auto lock = MpiLock();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      KeepMappedForAbandonedTransfer(pieces[i].data, pieces[i].bytes);
      MPI_Request_free(&requests[i]);
    }
  }

  Status RunBroadcast(const CallInfo& c, void* buffer, Clock::time_point* t) {
    const size_t bytes = c.count * DTypeSizeBytes(c.dtype);
    std::vector<Transfer> transfers;
    if (rank_ == c.root) {
      for (int p = 0; p < size_; ++p)
        if (p != rank_) transfers.push_back({true, p, buffer, bytes});
    } else {
      transfers.push_back({false, c.root, buffer, bytes});
    }
    if (size_ == 1) transfers.clear();
    return Exchange(c, kDataPhase, transfers, t);
  }

  MpiRuntime* const runtime_;
  MPI_Comm comm_;
  MPI_Comm notices_;  // failure notices only (Abort), so their tag never meets a collective's
  const int rank_;
  const int size_;
  const int local_size_;  // ranks on this machine (MPI_COMM_TYPE_SHARED)
  const int tag_ub_;
  const CommOptions options_;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<uint64_t> last_graced_seq_{0};  // see Graced
  std::mutex finished_mu_;
  uint64_t finished_prefix_ = 0;       // see FinishedPrefix (finished_mu_)
  std::set<uint64_t> finished_later_;  // finished past a gap in the prefix (finished_mu_)
  StagingPool staging_;
  std::atomic<bool> broken_{false};
  mutable std::mutex broken_mu_;
  Status broken_cause_;
  bool aborted_ = false;                       // Abort ran (broken_mu_)
  std::atomic<bool> notified_by_peer_{false};  // broken by a peer's notice: no notice goes back
  std::atomic<bool> peers_gone_{false};        // a deadline found a rank silent, here or at a notice's sender
  std::vector<char> notice_;                   // the notice sent, alive while the sends are
  std::mutex notice_mu_;                       // PollNotices, one thread at a time
};

}  // namespace

bool StartedByMpiLauncher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return true;
  }
  return false;
}

Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(const CommOptions& options) {
  if (!(options.timeout_seconds > 0))
    return InvalidArgument("MPI communicator: timeout_seconds must be positive, got " +
                           std::to_string(options.timeout_seconds));
  int initialized = 0;
  if (int rc = MPI_Initialized(&initialized); rc != MPI_SUCCESS)
    return Internal("MPI_Initialized: " + MpiErrorText(rc));
  if (!initialized && !StartedByMpiLauncher()) {
    return std::unique_ptr<Communicator>(new MpiComm(nullptr, MPI_COMM_NULL, MPI_COMM_NULL, 0, 1, 0, options));
  }
  // MPI's start-up waits for every rank with no deadline: past the
  // communicator's own, the watch ends this process.
  std::string who = "rank ?";
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(var); v && *v) {
      who = std::string("rank ") + v;
      break;
    }
  }
  StartupWatch watch(who, options.timeout_seconds, "the communicator's timeout, zinf.comm_timeout_s");
  watch.Phase("MPI_Init_thread");
  ZINF_ASSIGN_OR_RETURN(MpiRuntime * runtime, MpiRuntime::Get());
  watch.Phase("MPI_Comm_dup");
  auto lock = MpiLock();
  MPI_Comm comm = MPI_COMM_NULL;
  // MPI_COMM_WORLD's handler (fatal by default) governs the dup itself.
  if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm); rc != MPI_SUCCESS)
    return Internal("MPI_Comm_dup(MPI_COMM_WORLD): " + MpiErrorText(rc));
  MPI_Comm notices = MPI_COMM_NULL;
  auto fail = [&](const char* call, int rc) {
    MPI_Comm_free(&comm);
    if (notices != MPI_COMM_NULL) MPI_Comm_free(&notices);
    return Internal(std::string(call) + ": " + MpiErrorText(rc));
  };
  if (int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN); rc != MPI_SUCCESS)
    return fail("MPI_Comm_set_errhandler", rc);
  if (int rc = MPI_Comm_dup(comm, &notices); rc != MPI_SUCCESS) return fail("MPI_Comm_dup(notices)", rc);
  int rank = 0, size = 0, flag = 0;
  void* tag_ub_attr = nullptr;
  if (int rc = MPI_Comm_rank(comm, &rank); rc != MPI_SUCCESS) return fail("MPI_Comm_rank", rc);
  if (int rc = MPI_Comm_size(comm, &size); rc != MPI_SUCCESS) return fail("MPI_Comm_size", rc);
  if (int rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub_attr, &flag); rc != MPI_SUCCESS)
    return fail("MPI_Comm_get_attr(MPI_TAG_UB)", rc);
  const int tag_ub = flag ? *static_cast<int*>(tag_ub_attr) : 32767;  // the standard's minimum
  // The ranks that share this machine's memory: what per-rank thread
  // defaults divide the machine by.
  MPI_Comm node = MPI_COMM_NULL;
  int local_size = 1;
  watch.Phase("MPI_Comm_split_type");
  if (int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node); rc != MPI_SUCCESS)
    return fail("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", rc);
  const int size_rc = MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  if (size_rc != MPI_SUCCESS) return fail("MPI_Comm_size(node)", size_rc);
  ZINF_LOG_DEBUG("MPI communicator: rank {} of {} ({} on this machine), tags up to {}", rank, size, local_size, tag_ub);
  return std::unique_ptr<Communicator>(new MpiComm(runtime, comm, notices, rank, size, tag_ub, options, local_size));
}

}  // namespace zinf::cpu
