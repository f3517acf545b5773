// TransportComm: see transport_comm.h for the contract, communicator.h for
// the reduction it keeps.
#include "cpu/transport_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/collective_call.h"
#include "cpu/io_memory.h"

namespace zinf::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// How often a wait, and Health, read the board for a peer's notice.
constexpr auto kBoardPeriod = std::chrono::milliseconds(100);
// After this rank's deadline: how long the others get to post that they
// are stuck too, before the ones that did not are named silent.
constexpr auto kLateGrace = std::chrono::seconds(5);
// The same after a transport error (a peer's socket closed).
constexpr auto kLostGrace = std::chrono::seconds(2);
// Polling: yield while an operation started this recently, else sleep.
constexpr auto kSpinWindow = std::chrono::microseconds(200);
constexpr auto kIdleSleep = std::chrono::microseconds(50);

// Staging an abandoned operation may still write into: kept, reachable, for
// the life of the process.
void KeepForever(StagingPool::Buffer b) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<std::byte[]>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(b.data));
}

// Board keys.
constexpr const char* kStoppedKey = "stopped";  // "<rank>\n<code>: <cause>"
std::string LateKey(int rank) { return "late/" + std::to_string(rank); }

class TransportComm final : public Communicator {
 public:
  TransportComm(std::unique_ptr<Transport> transport, const CommOptions& options)
      : t_(std::move(transport)), options_(options), rank_(t_->rank()), size_(t_->size()) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return std::max(1, t_->local_size()); }

  Status AllGather(const void* send, void* recv, size_t count, DType dtype, Stream& stream) override {
    CallInfo info{CollectiveKind::kAllGather, 0, count, dtype};
    ZINF_RETURN_IF_ERROR(Validate(info, send, recv));
    return Submit(info, stream, [this, send, recv](const CallInfo& c, const StreamContext& ctx, Turn& turn) {
      const size_t bytes = c.count * DTypeSizeBytes(c.dtype);
      if (bytes == 0) return Status::Ok();
      auto* out = static_cast<std::byte*>(ctx.Host(recv));
      const void* in = ctx.Host(send);
      ZINF_ASSIGN_OR_RETURN(Transport::Handle h, StartOp(c, Transport::Op::kAllGather, in, out, bytes, -1));
      turn.Pass();
      return Await(c, h, {{in, bytes}, {out, bytes * size_}});
    });
  }

  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    CallInfo info{CollectiveKind::kReduceScatter, 0, count, dtype, op};
    ZINF_RETURN_IF_ERROR(Validate(info, send, recv));
    return Submit(info, stream, [this, send, recv](const CallInfo& c, const StreamContext& ctx, Turn& turn) {
      const size_t bytes = c.count * DTypeSizeBytes(c.dtype);
      if (bytes == 0) return Status::Ok();
      const void* in = ctx.Host(send);
      ZINF_ASSIGN_OR_RETURN(StagingPool::Buffer staging, staging_.Acquire(bytes * size_));
      ZINF_ASSIGN_OR_RETURN(Transport::Handle h,
                            StartOp(c, Transport::Op::kAllToAll, in, staging.data.get(), bytes, -1));
      turn.Pass();
      Status st = Await(c, h, {{in, bytes * size_}}, &staging);
      if (!st.ok()) return st;
      Reduce(c, staging.data.get(), bytes, ctx.Host(recv));
      staging_.Release(std::move(staging));
      return Status::Ok();
    });
  }

  // The all-to-all of a reduce-scatter over count padded to a multiple of
  // size(), the ordered sum of this rank's chunk, then an all-gather of the
  // chunks: element for element what ReduceScatter + AllGather give.
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream& stream) override {
    CallInfo info{CollectiveKind::kAllReduce, 0, count, dtype, op};
    ZINF_RETURN_IF_ERROR(Validate(info, send, recv));
    return Submit(info, stream, [this, send, recv](const CallInfo& c, const StreamContext& ctx, Turn& turn) {
      const size_t elem = DTypeSizeBytes(c.dtype);
      if (c.count == 0) return Status::Ok();
      const size_t chunk = (c.count + size_ - 1) / size_, chunk_bytes = chunk * elem, padded = chunk_bytes * size_;
      ZINF_ASSIGN_OR_RETURN(StagingPool::Buffer whole, staging_.Acquire(padded));
      ZINF_ASSIGN_OR_RETURN(StagingPool::Buffer parts, staging_.Acquire(padded));
      std::byte* w = whole.data.get();
      std::memcpy(w, ctx.Host(send), c.count * elem);
      std::memset(w + c.count * elem, 0, padded - c.count * elem);
      ZINF_ASSIGN_OR_RETURN(Transport::Handle h,
                            StartOp(c, Transport::Op::kAllToAll, w, parts.data.get(), chunk_bytes, -1));
      Status st = Await(c, h, {}, &whole, &parts);
      if (!st.ok()) return st;
      std::byte* mine = w + rank_ * chunk_bytes;
      Reduce(c, parts.data.get(), chunk_bytes, mine, chunk);
      staging_.Release(std::move(parts));
      ZINF_ASSIGN_OR_RETURN(h, StartOp(c, Transport::Op::kAllGather, mine, w, chunk_bytes, -1));
      turn.Pass();
      st = Await(c, h, {}, &whole);
      if (!st.ok()) return st;
      std::memcpy(ctx.Host(recv), w, c.count * elem);
      staging_.Release(std::move(whole));
      return Status::Ok();
    });
  }

  Status Broadcast(void* buffer, size_t count, DType dtype, int root, Stream& stream) override {
    CallInfo info{CollectiveKind::kBroadcast, 0, count, dtype, ReduceOp::kSum, root};
    ZINF_RETURN_IF_ERROR(Validate(info, buffer, buffer));
    return Submit(info, stream, [this, buffer](const CallInfo& c, const StreamContext& ctx, Turn& turn) {
      const size_t bytes = c.count * DTypeSizeBytes(c.dtype);
      if (bytes == 0) return Status::Ok();
      void* b = ctx.Host(buffer);
      ZINF_ASSIGN_OR_RETURN(Transport::Handle h, StartOp(c, Transport::Op::kBroadcast, nullptr, b, bytes, c.root));
      turn.Pass();
      return Await(c, h, {{b, bytes}});
    });
  }

  Status Barrier(Stream& stream) override {
    CallInfo info{CollectiveKind::kBarrier};
    ZINF_RETURN_IF_ERROR(Validate(info, nullptr, nullptr));
    return Submit(info, stream, [this](const CallInfo& c, const StreamContext&, Turn& turn) {
      ZINF_ASSIGN_OR_RETURN(Transport::Handle h, StartOp(c, Transport::Op::kBarrier, nullptr, nullptr, 0, -1));
      turn.Pass();
      return Await(c, h, {});
    });
  }

  // Posts the notice (unless a peer's notice broke this one: then the board
  // has it already) and breaks.
  void Abort(const Status& cause) override {
    if (cause.ok()) return;
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      if (aborted_) return;
      aborted_ = true;
    }
    if (size_ > 1 && !notified_by_peer_.load()) {
      Status posted = t_->Post(kStoppedKey, std::to_string(rank_) + "\n" + std::string(StatusCodeName(cause.code())) +
                                                ": " + cause.message());
      (void)posted;  // best effort: the peers' deadlines still find this rank silent
    }
    Break(cause);
  }

  Status Health() override {
    if (!broken_.load() && size_ > 1 && BoardDue()) {
      if (std::optional<Status> notice = PeerNotice()) Break(*notice);
    }
    if (!broken_.load()) return Status::Ok();
    std::lock_guard<std::mutex> lock(broken_mu_);
    return broken_cause_;
  }

 private:
  // A buffer an abandoned operation may still touch.
  struct Span {
    const void* p;
    size_t bytes;
  };

  // A collective's place in the order of starts (see transport_comm.h).
  class Turn {
   public:
    explicit Turn(TransportComm* comm, uint64_t seq) : comm_(comm), seq_(seq) {}
    ~Turn() { Pass(); }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    // Waits until the collective before this one passed its turn.
    Status Take(const CallInfo& c) { return comm_->WaitForTurn(c); }
    // Lets the next collective start its operations.
    void Pass() {
      if (passed_) return;
      passed_ = true;
      comm_->PassTurn(seq_);
    }

   private:
    TransportComm* const comm_;
    const uint64_t seq_;
    bool passed_ = false;
  };
  using Body = std::function<Status(const CallInfo&, const StreamContext&, Turn&)>;

  Status Validate(const CallInfo& c, const void* send, const void* recv) const {
    if (broken_.load()) return BrokenError(std::string(CollectiveName(c.kind)));
    return ValidateCall(c, send, recv, size_);
  }

  Status Submit(CallInfo info, Stream& stream, Body body) {
    info.seq = next_seq_.fetch_add(1) + 1;
    Status st = stream.Enqueue([this, info, body = std::move(body)](const StreamContext& ctx) -> Status {
      Turn turn(this, info.seq);
      ZINF_RETURN_IF_ERROR(turn.Take(info));
      if (broken_.load()) return BrokenError(Describe(info));
      if (options_.checking && size_ > 1) ZINF_RETURN_IF_ERROR(CheckAgreement(info));
      return body(info, ctx, turn);
    });
    if (!st.ok()) {
      // This rank's numbering would no longer match its peers'.
      Status cause = st.WithContext("enqueue " + Describe(info));
      Break(cause);
      return cause;
    }
    return Status::Ok();
  }

  Status WaitForTurn(const CallInfo& c) {
    const Clock::time_point start = Clock::now();
    const auto timeout = std::chrono::duration<double>(options_.timeout_seconds);
    std::unique_lock<std::mutex> lock(turn_mu_);
    while (passed_ + 1 < c.seq) {
      if (broken_.load()) return BrokenError(Describe(c));
      if (Clock::now() - start > timeout) {
        Status st = Unavailable(Describe(c) + ": collective #" + std::to_string(passed_ + 1) +
                                " enqueued before it has not started on this rank after " +
                                FormatSeconds(options_.timeout_seconds) + " (is its stream stopped by an error?)");
        lock.unlock();
        Break(st);
        return st;
      }
      turn_cv_.wait_for(lock, kBoardPeriod);
    }
    return Status::Ok();
  }

  void PassTurn(uint64_t seq) {
    {
      std::lock_guard<std::mutex> lock(turn_mu_);
      passed_ = std::max(passed_, seq);
    }
    turn_cv_.notify_all();
  }

  Result<Transport::Handle> StartOp(const CallInfo& c, Transport::Op op, const void* send, void* recv, size_t bytes,
                                    int root) {
    Result<Transport::Handle> h = t_->Start(op, send, recv, bytes, root);
    if (!h.ok()) {
      Status st = h.status().WithContext(Describe(c));
      Break(st);
      return st;
    }
    return h;
  }

  // Polls `h` to its end. On failure the operation is abandoned: `spans`
  // stay mapped and the staging buffers are never freed.
  Status Await(const CallInfo& c, Transport::Handle h, std::initializer_list<Span> spans,
               StagingPool::Buffer* staging1 = nullptr, StagingPool::Buffer* staging2 = nullptr) {
    auto abandon = [&] {
      t_->Release(h);
      for (const Span& s : spans) KeepMappedForAbandonedTransfer(s.p, s.bytes);
      for (StagingPool::Buffer* b : {staging1, staging2})
        if (b) KeepForever(std::move(*b));  // the transport may still write there
    };
    const auto timeout = std::chrono::duration<double>(options_.timeout_seconds);
    const Clock::time_point start = Clock::now();
    for (;;) {
      Result<bool> done = t_->Test(h);
      if (!done.ok()) {
        abandon();
        // A peer's notice says more than the transport's words; without one,
        // the ranks that do not answer on the board are the likely cause.
        Status st = PeerNotice().value_or(Status(
            done.status().code(), Describe(c) + ": " + done.status().message() + "; " + LateRanks(c, kLostGrace)));
        Break(st);
        return st;
      }
      if (*done) {
        t_->Release(h);
        return Status::Ok();
      }
      const Clock::time_point now = Clock::now();
      if (size_ > 1 && BoardDue()) {
        if (std::optional<Status> notice = PeerNotice()) {
          abandon();
          Break(*notice);
          return Unavailable(Describe(c) + ": " + notice->message());
        }
      }
      if (broken_.load()) {
        abandon();
        return BrokenError(Describe(c));
      }
      if (now - start > timeout) {
        abandon();
        Status st = Unavailable(Describe(c) + ": no progress after " + FormatSeconds(options_.timeout_seconds) + "; " +
                                LateRanks(c));
        Break(st);
        return st;
      }
      if (now - start < kSpinWindow)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(kIdleSleep);
    }
  }

  // After this rank's deadline in `c`: which peers are stuck too, and which
  // said nothing (the silent ones).
  std::string LateRanks(const CallInfo& c, Clock::duration grace = kLateGrace) {
    if (size_ == 1) return "silent ranks: none";
    (void)t_->Post(LateKey(rank_), Describe(c));
    std::vector<std::optional<std::string>> said(size_);
    const Clock::time_point until = Clock::now() + grace;
    for (;;) {
      int missing = 0;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || said[p]) continue;
        Result<std::optional<std::string>> v = t_->Read(LateKey(p));
        if (v.ok() && *v) said[p] = **v;
        if (!said[p]) ++missing;
      }
      if (missing == 0 || Clock::now() >= until) break;
      std::this_thread::sleep_for(kBoardPeriod);
    }
    std::string silent, waiting;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (!said[p])
        silent += (silent.empty() ? "" : ", ") + std::to_string(p);
      else
        waiting += (waiting.empty() ? "" : "; ") + ("rank " + std::to_string(p) + " in " + *said[p]);
    }
    if (silent.empty()) return "silent ranks: none; every rank is waiting too (" + waiting + ")";
    return "silent ranks: " + silent + (waiting.empty() ? "" : " (waiting too: " + waiting + ")");
  }

  // Rate limit for reading the board.
  bool BoardDue() {
    const int64_t now = Clock::now().time_since_epoch().count();
    int64_t last = last_board_read_.load();
    const int64_t period = std::chrono::duration_cast<Clock::duration>(kBoardPeriod).count();
    return now - last >= period && last_board_read_.compare_exchange_strong(last, now);
  }

  // A peer's Abort, read from the board: "rank R stopped: cause".
  std::optional<Status> PeerNotice() {
    Result<std::optional<std::string>> v = t_->Read(kStoppedKey);
    if (!v.ok() || !*v) return std::nullopt;
    const std::string& text = **v;
    const size_t nl = text.find('\n');
    const std::string who = text.substr(0, nl);
    if (who == std::to_string(rank_)) return std::nullopt;  // our own notice
    notified_by_peer_.store(true);
    return Unavailable("rank " + who + " stopped: " + (nl == std::string::npos ? "" : text.substr(nl + 1)));
  }

  // Checking mode: every rank's call, compared with rank 0's.
  Status CheckAgreement(const CallInfo& info) {
    std::vector<WireCall> calls(size_);
    calls[rank_] = WireCall::From(info);
    ZINF_ASSIGN_OR_RETURN(Transport::Handle h,
                          StartOp(info, Transport::Op::kAllGather, &calls[rank_], calls.data(), sizeof(WireCall), -1));
    ZINF_RETURN_IF_ERROR(Await(info, h, {}));
    return CompareCalls(info, calls);
  }

  // The ordered reduction of `size_` slots of `slot_bytes` each (rank p's
  // contribution at p * slot_bytes) into `out`: `count` elements, or the
  // whole slot.
  void Reduce(const CallInfo& c, const std::byte* slots, size_t slot_bytes, void* out, size_t count = 0) {
    std::vector<const void*> inputs(size_);
    for (int p = 0; p < size_; ++p) inputs[p] = slots + p * slot_bytes;
    ReduceInRankOrder(inputs.data(), size_, out, count ? count : slot_bytes / DTypeSizeBytes(c.dtype), c.dtype, c.op);
  }

  Status BrokenError(const std::string& what) const {
    std::lock_guard<std::mutex> lock(broken_mu_);
    return Unavailable(what + ": the communicator is unusable after an earlier failure: " + broken_cause_.message());
  }

  void Break(const Status& cause) {
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      if (!broken_.load()) broken_cause_ = cause;
      broken_.store(true);
    }
    turn_cv_.notify_all();
  }

  const std::unique_ptr<Transport> t_;
  const CommOptions options_;
  const int rank_;
  const int size_;
  std::atomic<uint64_t> next_seq_{0};
  std::mutex turn_mu_;
  std::condition_variable turn_cv_;
  uint64_t passed_ = 0;  // the highest collective that passed its turn (turn_mu_)
  std::atomic<int64_t> last_board_read_{0};
  StagingPool staging_;
  std::atomic<bool> broken_{false};
  mutable std::mutex broken_mu_;
  Status broken_cause_;                        // (broken_mu_)
  bool aborted_ = false;                       // (broken_mu_)
  std::atomic<bool> notified_by_peer_{false};  // broken by a peer's notice: none goes back
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateTransportCommunicator(std::unique_ptr<Transport> transport,
                                                                  const CommOptions& options) {
  if (!transport) return InvalidArgument("transport communicator: no transport");
  if (!(options.timeout_seconds > 0))
    return InvalidArgument("transport communicator: timeout_seconds must be positive, got " +
                           std::to_string(options.timeout_seconds));
  if (transport->size() < 1 || transport->rank() < 0 || transport->rank() >= transport->size())
    return InvalidArgument("transport communicator: rank " + std::to_string(transport->rank()) + " of " +
                           std::to_string(transport->size()));
  return std::unique_ptr<Communicator>(new TransportComm(std::move(transport), options));
}

}  // namespace zinf::cpu
