// IoEngine: request splitting, the io_uring and pread/pwrite workers, and the
// completion logic both share (short-transfer resubmission, retries, errors).
//
// Life of a block: Submit() cuts each op into blocks and hands each worker
// its share in one batch. A worker issues an attempt for a block, and on its
// completion OnAttemptDone() either finishes the block or asks for the
// remainder to be issued again. The last block of a request to finish runs
// the finalizer, wakes the waiters and calls the callback.
#include "nvme/io_engine.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "common/check.h"
#include "common/fault_injection.h"
#include "common/logging.h"
#include "common/units.h"

namespace zinf::nvme {

namespace internal {

struct RequestState {
  std::mutex mu;
  std::condition_variable cv;
  Status status;  // first failure; guarded by mu
  bool done = false;
  std::atomic<int64_t> remaining{0};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> bytes{0};
  IoCallback callback;
  IoFinalizer finalizer;

  void Fail(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok()) status = std::move(s);
    failed.store(true);
  }
};

}  // namespace internal

bool IoRequest::Done() const {
  ZINF_CHECK(state_);
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Status IoRequest::Wait() const {
  ZINF_CHECK(state_);
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

uint64_t IoRequest::bytes_transferred() const { return state_ ? state_->bytes.load() : 0; }

namespace {

constexpr int kMaxRetries = 16;                   // EAGAIN / EINTR per block
constexpr unsigned kBufferSlots = 512;            // registered-buffer table per ring
constexpr unsigned kFileSlots = 1024;             // registered-file table per ring
constexpr uint64_t kMaxFixedBuffer = 1ull << 30;  // io_uring's per-buffer limit

struct Block {
  std::shared_ptr<internal::RequestState> req;
  std::shared_ptr<File> file;
  IoKind kind;
  uint64_t offset;       // of the remainder
  char* buffer;          // of the remainder
  uint64_t remaining;    // bytes still to transfer
  uint64_t total;        // the block's full length
  uint64_t attempt = 0;  // length of the attempt in flight
  int retries = 0;
};

enum class Next { kIssue, kHandled, kAgain };

std::string Errno(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

// testing::FailUringSubmit's fault: the error (0: none) and the submissions
// carrying blocks to let through before it.
std::atomic<int> g_submit_fault_err{0};
std::atomic<int> g_submit_fault_after{0};

}  // namespace

class IoEngine::Impl {
 public:
  explicit Impl(const IoEngineOptions& o) : options(o) {}

  // --- shared completion logic ------------------------------------------

  // Before an attempt: cancelled (the request already failed), an injected
  // error, or issue `b->attempt` bytes.
  Next Prepare(Block* b) {
    if (b->req->failed.load()) {
      FinishBlock(b, Status::Ok());  // not issued: the request's first error stands
      return Next::kHandled;
    }
    if (auto err = b->file->InjectError(b->kind, b->offset, b->remaining)) {
      b->attempt = b->remaining;
      return OnAttemptDone(b, -*err) ? Next::kAgain : Next::kHandled;
    }
    if (int err = fault::At(b->kind == IoKind::kWrite ? fault::Site::kIoWrite : fault::Site::kIoRead)) {
      b->attempt = b->remaining;
      return OnAttemptDone(b, -err) ? Next::kAgain : Next::kHandled;
    }
    uint64_t limit = b->file->LimitTransfer(b->kind, b->offset, b->remaining);
    b->attempt = limit == 0 || limit > b->remaining ? b->remaining : limit;
    blocks_issued.fetch_add(1, std::memory_order_relaxed);
    return Next::kIssue;
  }

  // After an attempt returned `res` (bytes, or -errno). Returns true when the
  // block must be issued again (remainder of a short transfer, or a retry).
  bool OnAttemptDone(Block* b, int64_t res) {
    if (uint32_t delay = b->file->CompletionDelayMicros(b->kind)) ::usleep(delay);
    if (res < 0) {
      int err = static_cast<int>(-res);
      if ((err == EAGAIN || err == EINTR) && b->retries++ < kMaxRetries) {
        retries.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      FinishBlock(b, IoError(DescribeIoFailure(b->kind, b->file->path(), b->offset, b->attempt, err)));
      return false;
    }
    if (res == 0) {
      uint64_t done = b->total - b->remaining;
      if (b->kind == IoKind::kRead) {
        FinishBlock(b, DataLoss("pread " + b->file->path() + " offset=" + std::to_string(b->offset) +
                                " len=" + std::to_string(b->remaining) + ": end of file after " + std::to_string(done) +
                                " of " + std::to_string(b->total) + " bytes of the block"));
      } else {
        FinishBlock(b, IoError("pwrite " + b->file->path() + " offset=" + std::to_string(b->offset) +
                               " len=" + std::to_string(b->remaining) + ": wrote 0 bytes"));
      }
      return false;
    }
    uint64_t n = static_cast<uint64_t>(res);
    ZINF_CHECK(n <= b->attempt);
    (b->kind == IoKind::kRead ? bytes_read : bytes_written).fetch_add(n, std::memory_order_relaxed);
    b->req->bytes.fetch_add(n, std::memory_order_relaxed);
    b->offset += n;
    b->buffer += n;
    b->remaining -= n;
    if (b->remaining > 0) {
      short_resubmits.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    FinishBlock(b, Status::Ok());
    return false;
  }

  void FinishBlock(Block* b, Status st) {
    auto req = std::move(b->req);
    delete b;
    if (!st.ok()) req->Fail(std::move(st));
    if (req->remaining.fetch_sub(1) == 1) CompleteRequest(req);
  }

  void CompleteRequest(const std::shared_ptr<internal::RequestState>& req) {
    Status st;
    {
      std::lock_guard<std::mutex> lock(req->mu);
      st = req->status;
    }
    if (req->finalizer) st = req->finalizer(std::move(st));
    if (!st.ok()) failed_requests.fetch_add(1, std::memory_order_relaxed);
    // The callback runs before waiters wake: once Wait() returns, it has run.
    if (req->callback) {
      req->callback(st);
      req->callback = nullptr;
    }
    // The busy interval closes before waiters wake too: a caller whose
    // Wait() returned finds the stretch that held its request. (The
    // destructor, which waits for no requests in flight, then joins this
    // worker before anything here goes.)
    {
      std::lock_guard<std::mutex> lock(inflight_mu);
      if (--inflight_requests == 0) {
        const IoBusyInterval busy{busy_since, std::chrono::steady_clock::now()};
        busy_seconds += std::chrono::duration<double>(busy.end - busy.begin).count();
        if (busy_intervals.size() >= kMaxBusyIntervals) busy_intervals.pop_front();
        busy_intervals.push_back(busy);
      }
    }
    {
      std::lock_guard<std::mutex> lock(req->mu);
      req->status = st;
      req->done = true;
    }
    req->cv.notify_all();
    inflight_cv.notify_all();
  }

  // Registered-buffer lookup: the slot of the registered buffer holding
  // [p, p+len), or -1.
  int FixedBufferSlot(const char* p, uint64_t len) {
    std::shared_lock<std::shared_mutex> lock(buffers_mu);
    auto it = buffers.upper_bound(reinterpret_cast<uintptr_t>(p));
    if (it == buffers.begin()) return -1;
    --it;
    uintptr_t start = it->first, end = start + it->second.first;
    uintptr_t q = reinterpret_cast<uintptr_t>(p);
    return q >= start && q + len <= end ? it->second.second : -1;
  }

  // --- workers -------------------------------------------------------------

  class Worker {
   public:
    virtual ~Worker() = default;
    virtual void Enqueue(std::vector<Block*>& blocks) = 0;
    virtual void Stop() = 0;
  };

  class UringWorker;
  class PosixWorker;

  IoEngineOptions options;
  std::string backend;
  std::string fallback_reason;
  bool fixed_buffers_enabled = false;
  bool fixed_files_enabled = false;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<io_uring*> rings;  // for registration calls; owned by the workers
  std::atomic<uint64_t> round_robin{0};

  std::shared_mutex buffers_mu;
  // Registered segments (a buffer over 1 GiB is several, 1 GiB apart) and
  // the buffers as registered.
  std::map<uintptr_t, std::pair<uint64_t, int>> buffers;  // segment start -> (bytes, slot)
  std::map<uintptr_t, uint64_t> registrations;            // buffer start -> bytes
  std::vector<int> free_buffer_slots;

  // Shared with files' release hooks, which may outlive the engine.
  struct FileSlots {
    std::mutex mu;
    bool engine_alive = true;
    std::vector<io_uring*> rings;
    std::vector<int> free_slots;
  };
  std::shared_ptr<FileSlots> file_slots = std::make_shared<FileSlots>();

  std::mutex inflight_mu;
  std::condition_variable inflight_cv;
  uint64_t inflight_requests = 0;
  // Busy stretches (inflight_mu): the current one's start, and the ended
  // ones not yet taken.
  static constexpr size_t kMaxBusyIntervals = 4096;
  std::chrono::steady_clock::time_point busy_since;
  std::deque<IoBusyInterval> busy_intervals;
  double busy_seconds = 0;

  std::atomic<uint64_t> bytes_read{0}, bytes_written{0}, blocks_issued{0}, short_resubmits{0}, retries{0},
      failed_requests{0}, submit_batches{0};
};

// One io_uring per worker thread. An eventfd read is kept armed in the ring
// so Enqueue can wake a worker that is blocked waiting for completions.
//
// A submission that fails for good (any error but EINTR, EAGAIN and EBUSY)
// leaves the ring unusable, and no request may wait forever for it:
//   - the blocks whose entries the kernel never consumed fail at once, with
//     the error and their path, offset and length; nothing submits again, so
//     the kernel never touches their buffers (with SQPOLL the kernel's thread
//     could still consume them, so there they are waited for instead);
//   - blocks the kernel consumed complete as usual (their buffers are the
//     kernel's until then), but a remainder or retry of one is not issued;
//   - blocks not yet issued, and every block enqueued later, fail.
// The worker keeps running, on a condition variable instead of the ring,
// until Stop.
class IoEngine::Impl::UringWorker : public IoEngine::Impl::Worker {
 public:
  UringWorker(Impl* engine) : engine_(engine) {}

  Status Init() {
    const auto& o = engine_->options;
    io_uring_params params{};
    if (o.sqpoll) {
      params.flags |= IORING_SETUP_SQPOLL;
      params.sq_thread_idle = o.sqpoll_idle_ms;
    }
    int rc = io_uring_queue_init_params(o.queue_depth + 2, &ring_, &params);
    if (rc < 0) return Unavailable("io_uring_queue_init: " + Errno(-rc));
    initialized_ = true;
    efd_ = ::eventfd(0, EFD_CLOEXEC);
    if (efd_ < 0) return IoError("eventfd: " + Errno(errno));
    return Status::Ok();
  }

  io_uring* ring() { return &ring_; }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }

  ~UringWorker() override {
    if (thread_.joinable()) Stop();
    if (initialized_) io_uring_queue_exit(&ring_);
    if (efd_ >= 0) ::close(efd_);
  }

  void Enqueue(std::vector<Block*>& blocks) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), blocks.begin(), blocks.end());
    }
    cv_.notify_one();  // a worker whose ring failed waits here
    Wake();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    cv_.notify_one();
    Wake();
    thread_.join();
  }

 private:
  void Wake() {
    if (waiting_.load()) {
      uint64_t one = 1;
      ssize_t n = ::write(efd_, &one, sizeof(one));
      (void)n;  // a full counter still wakes the reader
    }
  }

  void ArmEventfd() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    ZINF_CHECK(sqe != nullptr);
    io_uring_prep_read(sqe, efd_, &efd_value_, sizeof(efd_value_), 0);
    io_uring_sqe_set_data64(sqe, 0);
  }

  void Issue(Block* b) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    ZINF_CHECK(sqe != nullptr);  // the SQ holds queue_depth + 2 entries
    int fd = b->file->fd();
    int slot = engine_->fixed_files_enabled ? b->file->FixedSlotFor(engine_) : -1;
    if (slot >= 0) fd = slot;
    int buf_slot = engine_->fixed_buffers_enabled ? engine_->FixedBufferSlot(b->buffer, b->attempt) : -1;
    auto len = static_cast<unsigned>(b->attempt);
    if (b->kind == IoKind::kRead) {
      if (buf_slot >= 0)
        io_uring_prep_read_fixed(sqe, fd, b->buffer, len, b->offset, buf_slot);
      else
        io_uring_prep_read(sqe, fd, b->buffer, len, b->offset);
    } else {
      if (buf_slot >= 0)
        io_uring_prep_write_fixed(sqe, fd, b->buffer, len, b->offset, buf_slot);
      else
        io_uring_prep_write(sqe, fd, b->buffer, len, b->offset);
    }
    if (slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, b);
    ++inflight_;
    ++unsubmitted_;
    if (engine_->options.single_submit) {
      if (const int rc = Submit(); HardSubmitError(rc)) issue_error_ = rc;  // Loop fails the ring
    }
  }

  // io_uring_submit, counting the calls that carry blocks (IoEngineStats::submit_batches).
  int Submit(unsigned wait_for = 0) {
    if (unsubmitted_ > 0) {
      if (g_submit_fault_err.load() != 0 && g_submit_fault_after.fetch_sub(1) <= 0) {
        return -g_submit_fault_err.exchange(0);  // testing::FailUringSubmit: the entries stay unconsumed
      }
      if (int err = fault::At(fault::Site::kRingSubmit)) return -err;  // ZINF_FAULT=ring:N, the same way
      engine_->submit_batches.fetch_add(1, std::memory_order_relaxed);
    }
    unsubmitted_ = 0;
    return wait_for == 0 ? io_uring_submit(&ring_) : io_uring_submit_and_wait(&ring_, wait_for);
  }

  static bool HardSubmitError(int rc) { return rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY; }

  // A block the failed ring will not transfer: the submission's error, with
  // the block's path, offset and length.
  void FailBlock(Block* b) {
    engine_->FinishBlock(b, IoError(DescribeIoFailure(b->kind, b->file->path(), b->offset, b->remaining, ring_error_) +
                                    " (io_uring submission; the ring takes no more requests)"));
  }

  // The submission failed with -rc for good: fail what the kernel never saw
  // (see the class comment), then serve the worker's remaining life.
  void FailRing(int rc, std::deque<Block*>& local) {
    ZINF_LOG_ERROR("io_uring_submit_and_wait: {}: the ring takes no more requests", Errno(-rc));
    ring_error_ = -rc;
    if (!(ring_.flags & IORING_SETUP_SQPOLL)) {
      // Entries from the kernel's head to our tail were never consumed; the
      // SQ array maps slot i to entry i (io_uring_queue_init sets it so).
      const unsigned head = *ring_.sq.khead;
      const unsigned unconsumed = io_uring_sq_ready(&ring_);
      for (unsigned i = 0; i < unconsumed; ++i) {
        auto* b = reinterpret_cast<Block*>(ring_.sq.sqes[(head + i) & ring_.sq.ring_mask].user_data);
        if (b == nullptr) continue;  // the eventfd read
        --inflight_;
        FailBlock(b);
      }
    }
    for (Block* b : local) FailBlock(b);
    local.clear();
    for (;;) {
      std::deque<Block*> queued;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (inflight_ == 0) cv_.wait(lock, [&] { return stop_.load() || !queue_.empty(); });
        queued.swap(queue_);
        if (queued.empty() && inflight_ == 0 && stop_.load()) return;
      }
      for (Block* b : queued) FailBlock(b);
      if (inflight_ > 0) {
        // Consumed blocks complete into the CQ without a submission; a
        // short sleep lets the kernel deliver them (no io_uring_enter: it
        // could carry the failed entries to the kernel).
        Reap(local);
        for (Block* b : local) FailBlock(b);  // remainders and retries
        local.clear();
        if (inflight_ > 0) ::usleep(200);
      }
    }
  }

  void Loop() {
    ArmEventfd();
    std::deque<Block*> local;
    const unsigned depth = engine_->options.queue_depth;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        while (!queue_.empty()) {
          local.push_back(queue_.front());
          queue_.pop_front();
        }
      }
      while (!local.empty() && inflight_ < depth && issue_error_ == 0) {
        Block* b = local.front();
        local.pop_front();
        switch (engine_->Prepare(b)) {
          case Next::kIssue:
            Issue(b);
            break;
          case Next::kAgain:
            local.push_front(b);
            break;
          case Next::kHandled:
            break;
        }
      }
      if (issue_error_ != 0) return FailRing(issue_error_, local);
      if (stop_.load() && local.empty() && inflight_ == 0) {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty()) break;
        continue;
      }
      // Announce the wait, then look once more: an Enqueue after this point
      // sees waiting_ and writes the eventfd, so no wake-up is lost.
      waiting_.store(true);
      bool more;
      {
        std::lock_guard<std::mutex> lock(mu_);
        more = !queue_.empty() || stop_.load();
      }
      if (more && inflight_ < depth) {
        waiting_.store(false);
        if (const int rc = Submit(); HardSubmitError(rc)) return FailRing(rc, local);
        continue;
      }
      const int rc = Submit(1);
      waiting_.store(false);
      if (HardSubmitError(rc)) return FailRing(rc, local);
      Reap(local);
    }
  }

  void Reap(std::deque<Block*>& local) {
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    std::vector<Block*> again;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      auto* b = static_cast<Block*>(io_uring_cqe_get_data(cqe));
      if (b == nullptr) {
        if (ring_error_ == 0) ArmEventfd();  // a wake-up; re-arm for the next one
        continue;
      }
      --inflight_;
      if (engine_->OnAttemptDone(b, cqe->res)) again.push_back(b);
    }
    io_uring_cq_advance(&ring_, seen);
    // Remainders and retries go first, so a request is not starved by newer ones.
    for (auto it = again.rbegin(); it != again.rend(); ++it) local.push_front(*it);
  }

  Impl* engine_;
  io_uring ring_{};
  bool initialized_ = false;
  unsigned unsubmitted_ = 0;  // blocks prepared since the last submit
  int efd_ = -1;
  uint64_t efd_value_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::deque<Block*> queue_;
  std::condition_variable cv_;  // Enqueue and Stop, for a worker whose ring failed
  std::atomic<bool> waiting_{false};
  std::atomic<bool> stop_{false};
  unsigned inflight_ = 0;
  int ring_error_ = 0;   // the errno of the submission that failed for good; the worker thread's
  int issue_error_ = 0;  // a single-block submission's hard failure (-errno), for Loop to handle
};

// The fallback: queue_depth threads per ring issuing pread/pwrite.
class IoEngine::Impl::PosixWorker : public IoEngine::Impl::Worker {
 public:
  PosixWorker(Impl* engine, unsigned threads) : engine_(engine) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~PosixWorker() override {
    if (!threads_.empty()) Stop();
  }

  void Enqueue(std::vector<Block*>& blocks) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), blocks.begin(), blocks.end());
    }
    cv_.notify_all();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Loop() {
    for (;;) {
      Block* b;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        b = queue_.front();
        queue_.pop_front();
      }
      for (;;) {
        Next next = engine_->Prepare(b);
        if (next == Next::kHandled) break;
        if (next == Next::kAgain) continue;
        ssize_t n = b->kind == IoKind::kRead ? ::pread(b->file->fd(), b->buffer, b->attempt, b->offset)
                                             : ::pwrite(b->file->fd(), b->buffer, b->attempt, b->offset);
        if (!engine_->OnAttemptDone(b, n < 0 ? -errno : n)) break;
      }
    }
  }

  Impl* engine_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Block*> queue_;
  bool stop_ = false;
};

// --- IoEngine ----------------------------------------------------------------

IoEngine::IoEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

IoEngine::~IoEngine() {
  {
    std::unique_lock<std::mutex> lock(impl_->inflight_mu);
    impl_->inflight_cv.wait(lock, [&] { return impl_->inflight_requests == 0; });
  }
  {
    std::lock_guard<std::mutex> lock(impl_->file_slots->mu);
    impl_->file_slots->engine_alive = false;
    impl_->file_slots->rings.clear();
  }
  for (auto& w : impl_->workers) w->Stop();
  impl_->workers.clear();
}

Result<std::unique_ptr<IoEngine>> IoEngine::Create(const IoEngineOptions& options) {
  const auto& o = options;
  if (o.block_size == 0 || o.block_size % kDirectAlignment != 0)
    return InvalidArgument("block size " + std::to_string(o.block_size) + " is not a positive multiple of 4096");
  if (o.block_size > (1ull << 31)) return InvalidArgument("block size " + FormatBytes(o.block_size) + " exceeds 2 GiB");
  if (o.queue_depth == 0 || o.queue_depth > 4096)
    return InvalidArgument("queue depth " + std::to_string(o.queue_depth) + " is outside 1..4096");
  if (o.rings == 0 || o.rings > 256) return InvalidArgument("rings " + std::to_string(o.rings) + " is outside 1..256");

  auto impl = std::make_unique<Impl>(o);
  Impl* raw = impl.get();
  bool use_uring = o.backend != IoBackend::kPosix;
  if (use_uring && std::getenv("ZINF_NO_IO_URING") && std::string(std::getenv("ZINF_NO_IO_URING")) == "1") {
    if (o.backend == IoBackend::kUring) return Unavailable("io_uring requested but disabled by ZINF_NO_IO_URING=1");
    raw->fallback_reason = "disabled by ZINF_NO_IO_URING=1";
    use_uring = false;
  }
  if (use_uring) {
    std::vector<std::unique_ptr<Impl::UringWorker>> uring_workers;
    Status st;
    for (unsigned r = 0; r < o.rings && st.ok(); ++r) {
      auto w = std::make_unique<Impl::UringWorker>(raw);
      st = w->Init();
      uring_workers.push_back(std::move(w));
    }
    if (!st.ok()) {
      if (o.backend == IoBackend::kUring) return st.WithContext("io_uring backend");
      raw->fallback_reason = st.message();
    } else {
      raw->backend = "io_uring";
      raw->fixed_buffers_enabled = o.fixed_buffers;
      raw->fixed_files_enabled = o.fixed_files;
      for (auto& w : uring_workers) {
        if (raw->fixed_buffers_enabled && io_uring_register_buffers_sparse(w->ring(), kBufferSlots) < 0) {
          WarnOnce("io_uring: sparse buffer registration unsupported; fixed buffers off");
          raw->fixed_buffers_enabled = false;
        }
        if (raw->fixed_files_enabled && io_uring_register_files_sparse(w->ring(), kFileSlots) < 0) {
          WarnOnce("io_uring: sparse file registration unsupported; fixed files off");
          raw->fixed_files_enabled = false;
        }
        raw->rings.push_back(w->ring());
      }
      for (int s = kBufferSlots - 1; s >= 0; --s) raw->free_buffer_slots.push_back(s);
      raw->file_slots->rings = raw->rings;
      for (int s = kFileSlots - 1; s >= 0; --s) raw->file_slots->free_slots.push_back(s);
      for (auto& w : uring_workers) {
        w->Start();
        raw->workers.push_back(std::move(w));
      }
    }
  }
  if (raw->workers.empty()) {
    if (!raw->fallback_reason.empty())
      WarnOnce("io_uring unavailable (" + raw->fallback_reason + "): using a pread/pwrite thread pool");
    raw->backend = "posix";
    unsigned threads = std::min(o.queue_depth, 64u);
    for (unsigned r = 0; r < o.rings; ++r) raw->workers.push_back(std::make_unique<Impl::PosixWorker>(raw, threads));
  }
  return std::unique_ptr<IoEngine>(new IoEngine(std::move(impl)));
}

const IoEngineOptions& IoEngine::options() const { return impl_->options; }
std::string IoEngine::backend_name() const { return impl_->backend; }
const std::string& IoEngine::fallback_reason() const { return impl_->fallback_reason; }

Result<std::shared_ptr<File>> IoEngine::Open(const std::string& path, const FileOptions& options) {
  ZINF_ASSIGN_OR_RETURN(auto file, File::Open(path, options));
  if (!impl_->fixed_files_enabled) return file;
  auto slots = impl_->file_slots;
  int slot;
  {
    std::lock_guard<std::mutex> lock(slots->mu);
    if (slots->free_slots.empty()) return file;  // table full: plain fd I/O still works
    slot = slots->free_slots.back();
    slots->free_slots.pop_back();
    int fd = file->fd();
    for (io_uring* ring : slots->rings) {
      int rc = io_uring_register_files_update(ring, static_cast<unsigned>(slot), &fd, 1);
      if (rc < 0) {
        slots->free_slots.push_back(slot);
        WarnOnce("io_uring_register_files_update: " + Errno(-rc) + "; files are used unregistered");
        return file;
      }
    }
  }
  file->SetFixedRegistration(impl_.get(), slot, [slots, slot] {
    std::lock_guard<std::mutex> lock(slots->mu);
    if (!slots->engine_alive) return;
    int none = -1;
    for (io_uring* ring : slots->rings) io_uring_register_files_update(ring, static_cast<unsigned>(slot), &none, 1);
    slots->free_slots.push_back(slot);
  });
  return file;
}

Status IoEngine::RegisterBuffer(void* addr, uint64_t bytes) {
  auto p = reinterpret_cast<uintptr_t>(addr);
  if (addr == nullptr || p % kDirectAlignment || bytes == 0 || bytes % kDirectAlignment)
    return InvalidArgument("register buffer " + std::to_string(p) + " (" + std::to_string(bytes) +
                           " bytes): address and size must be non-zero multiples of 4096");
  if (!impl_->fixed_buffers_enabled) return Status::Ok();
  std::unique_lock<std::shared_mutex> lock(impl_->buffers_mu);
  auto next = impl_->registrations.lower_bound(p);
  const bool overlaps_next = next != impl_->registrations.end() && next->first < p + bytes;
  const bool overlaps_prev =
      next != impl_->registrations.begin() && std::prev(next)->first + std::prev(next)->second > p;
  if (overlaps_next || overlaps_prev) {
    return AlreadyExists("buffer at " + std::to_string(p) + " overlaps a registered one");
  }
  // io_uring registers at most 1 GiB per slot: a larger buffer takes one
  // slot per GiB, and an I/O that crosses a GiB boundary goes unfixed.
  const uint64_t segments = (bytes + kMaxFixedBuffer - 1) / kMaxFixedBuffer;
  if (impl_->free_buffer_slots.size() < segments)
    return OutOfMemory("registered-buffer slots: " + std::to_string(segments) + " needed for " + FormatBytes(bytes) +
                       ", " + std::to_string(impl_->free_buffer_slots.size()) + " of " + std::to_string(kBufferSlots) +
                       " free");
  auto unregister_slot = [&](int slot, size_t rings) {
    iovec none{nullptr, 0};
    __u64 tag = 0;
    for (size_t u = 0; u < rings; ++u) io_uring_register_buffers_update_tag(impl_->rings[u], slot, &none, &tag, 1);
  };
  std::vector<uintptr_t> done;
  for (uint64_t k = 0; k < segments; ++k) {
    const uintptr_t seg = p + k * kMaxFixedBuffer;
    const uint64_t seg_bytes = std::min<uint64_t>(kMaxFixedBuffer, bytes - k * kMaxFixedBuffer);
    const int slot = impl_->free_buffer_slots.back();
    iovec iov{reinterpret_cast<void*>(seg), seg_bytes};
    for (size_t r = 0; r < impl_->rings.size(); ++r) {
      __u64 tag = 0;
      int rc = io_uring_register_buffers_update_tag(impl_->rings[r], static_cast<unsigned>(slot), &iov, &tag, 1);
      if (rc < 0) {
        unregister_slot(slot, r);
        for (uintptr_t d : done) {
          const int s = impl_->buffers[d].second;
          unregister_slot(s, impl_->rings.size());
          impl_->free_buffer_slots.push_back(s);
          impl_->buffers.erase(d);
        }
        return (rc == -ENOMEM ? OutOfMemory("") : IoError(""))
            .WithContext("io_uring_register_buffers_update " + FormatBytes(seg_bytes) + ": " + Errno(-rc) +
                         (rc == -ENOMEM ? " (RLIMIT_MEMLOCK too low? raise it with 'ulimit -l')" : ""));
      }
    }
    impl_->free_buffer_slots.pop_back();
    impl_->buffers[seg] = {seg_bytes, slot};
    done.push_back(seg);
  }
  impl_->registrations[p] = bytes;
  return Status::Ok();
}

Status IoEngine::UnregisterBuffer(void* addr) {
  if (!impl_->fixed_buffers_enabled) return Status::Ok();
  std::unique_lock<std::shared_mutex> lock(impl_->buffers_mu);
  const auto p = reinterpret_cast<uintptr_t>(addr);
  auto reg = impl_->registrations.find(p);
  if (reg == impl_->registrations.end()) return NotFound("buffer at " + std::to_string(p) + " is not registered");
  for (uint64_t off = 0; off < reg->second; off += kMaxFixedBuffer) {
    auto it = impl_->buffers.find(p + off);
    if (it == impl_->buffers.end()) continue;
    const int slot = it->second.second;
    iovec none{nullptr, 0};
    __u64 tag = 0;
    for (io_uring* ring : impl_->rings)
      io_uring_register_buffers_update_tag(ring, static_cast<unsigned>(slot), &none, &tag, 1);
    impl_->free_buffer_slots.push_back(slot);
    impl_->buffers.erase(it);
  }
  impl_->registrations.erase(reg);
  return Status::Ok();
}

unsigned IoEngine::num_rings() const { return static_cast<unsigned>(impl_->workers.size()); }

IoRequest IoEngine::Submit(std::vector<IoOp> ops, IoCallback callback, IoFinalizer finalizer, int ring) {
  auto req = std::make_shared<internal::RequestState>();
  req->callback = std::move(callback);
  req->finalizer = std::move(finalizer);
  {
    std::lock_guard<std::mutex> lock(impl_->inflight_mu);
    if (impl_->inflight_requests++ == 0) impl_->busy_since = std::chrono::steady_clock::now();
  }

  // Validate everything before issuing anything.
  Status invalid;
  uint64_t num_blocks = 0;
  const uint64_t bs = impl_->options.block_size;
  for (const IoOp& op : ops) {
    const char* verb = op.kind == IoKind::kRead ? "read" : "write";
    if (!op.file) {
      invalid = InvalidArgument(std::string(verb) + ": no file");
      break;
    }
    if (op.length > 0 && op.buffer == nullptr) {
      invalid = InvalidArgument(std::string(verb) + " " + op.file->path() + ": null buffer");
      break;
    }
    if (op.file->direct()) {
      auto addr = reinterpret_cast<uintptr_t>(op.buffer);
      std::string what;
      if (op.offset % kDirectAlignment)
        what = "offset " + std::to_string(op.offset);
      else if (op.length % kDirectAlignment)
        what = "length " + std::to_string(op.length);
      else if (addr % kDirectAlignment)
        what = "buffer address " + std::to_string(addr);
      if (!what.empty()) {
        invalid = InvalidArgument(std::string(verb) + " " + op.file->path() + ": " + what +
                                  " is not a multiple of 4096, which O_DIRECT requires of offset, length and buffer");
        break;
      }
    }
    num_blocks += (op.length + bs - 1) / bs;
  }
  if (!invalid.ok() || num_blocks == 0) {
    req->remaining.store(1);
    if (!invalid.ok()) req->Fail(invalid);
    impl_->CompleteRequest(req);
    return IoRequest(req);
  }

  req->remaining.store(static_cast<int64_t>(num_blocks));
  const size_t nw = impl_->workers.size();
  std::vector<std::vector<Block*>> per_worker(nw);
  uint64_t next = impl_->round_robin.fetch_add(1);
  for (const IoOp& op : ops) {
    for (uint64_t off = 0; off < op.length; off += bs) {
      uint64_t len = std::min(bs, op.length - off);
      auto* b = new Block{req, op.file, op.kind, op.offset + off, static_cast<char*>(op.buffer) + off, len, len};
      per_worker[ring >= 0 ? static_cast<size_t>(ring) % nw : next++ % nw].push_back(b);
    }
  }
  for (size_t w = 0; w < nw; ++w)
    if (!per_worker[w].empty()) impl_->workers[w]->Enqueue(per_worker[w]);
  return IoRequest(req);
}

IoRequest IoEngine::Read(std::shared_ptr<File> file, uint64_t offset, void* buffer, uint64_t length,
                         IoCallback callback) {
  return Submit({IoOp{IoKind::kRead, std::move(file), offset, buffer, length}}, std::move(callback));
}

IoRequest IoEngine::Write(std::shared_ptr<File> file, uint64_t offset, const void* buffer, uint64_t length,
                          IoCallback callback) {
  return Submit({IoOp{IoKind::kWrite, std::move(file), offset, const_cast<void*>(buffer), length}},
                std::move(callback));
}

Status IoEngine::ReadSync(std::shared_ptr<File> file, uint64_t offset, void* buffer, uint64_t length) {
  return Read(std::move(file), offset, buffer, length).Wait();
}

Status IoEngine::WriteSync(std::shared_ptr<File> file, uint64_t offset, const void* buffer, uint64_t length) {
  return Write(std::move(file), offset, buffer, length).Wait();
}

bool IoEngine::IsRegistered(const void* addr, uint64_t bytes) const {
  return impl_->fixed_buffers_enabled && impl_->FixedBufferSlot(static_cast<const char*>(addr), bytes) >= 0;
}

IoEngineStats IoEngine::stats() const {
  IoEngineStats s;
  s.bytes_read = impl_->bytes_read.load();
  s.bytes_written = impl_->bytes_written.load();
  s.blocks = impl_->blocks_issued.load();
  s.short_resubmits = impl_->short_resubmits.load();
  s.retries = impl_->retries.load();
  s.failed_requests = impl_->failed_requests.load();
  s.submit_batches = impl_->submit_batches.load();
  std::lock_guard<std::mutex> lock(impl_->inflight_mu);
  s.busy_seconds = impl_->busy_seconds;
  return s;
}

std::vector<IoBusyInterval> IoEngine::TakeBusyIntervals() {
  std::lock_guard<std::mutex> lock(impl_->inflight_mu);
  std::vector<IoBusyInterval> out(impl_->busy_intervals.begin(), impl_->busy_intervals.end());
  impl_->busy_intervals.clear();
  return out;
}

namespace testing {
void FailUringSubmit(int err, int after) {
  g_submit_fault_after.store(after);
  g_submit_fault_err.store(err);
}
}  // namespace testing

}  // namespace zinf::nvme
