// HostDevice: streams as FIFO worker threads, events as generation counters,
// a copy-engine thread, the checking mode's tagged pointers and delays, and
// the option that runs the tasks of all streams one at a time.
#include "cpu/host_device.h"

#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include "common/check.h"
#include "common/device_allocator.h"
#include "common/logging.h"
#include "common/runtime_info.h"
#include "common/units.h"
#include "cpu/io_memory.h"

namespace zinf::cpu {
namespace {

// Bit 62 makes a user-space address non-canonical on x86-64 and AArch64
// (without top-byte-ignore on this bit), so dereferencing it faults.
constexpr uintptr_t kTag = uintptr_t{1} << 62;
std::atomic<uint64_t> next_stream_id{1};

// Ranges of HostDevices in checking mode, for IsTaggedDevicePointer.
std::mutex tagged_mu;
std::vector<std::pair<uintptr_t, uintptr_t>> tagged_ranges;

class HostDevice;

// Enqueues a copy-engine operation on `stream`: in stream order like a task,
// but not a host function (DeviceOptions::serialize_tasks leaves it out).
Status EnqueueCopyOp(Stream& stream, StreamTask op);

// Set on the device's own threads (stream workers, the copy engine): their
// waits are the device's, not the host's, and are not counted.
thread_local bool t_device_thread = false;

// The host's waits on the device (Device::wait_stats).
struct WaitCounters {
  std::atomic<uint64_t> blocking{0}, draining{0};
};

struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;                               // generation of the latest Record
  uint64_t completed = 0;                              // generation whose work has run
  std::chrono::steady_clock::time_point completed_at;  // when `completed` last moved
  // Where the latest Record put it: its stream's count of submitted
  // operations just after it (a wait drains the stream when the count has
  // not moved since).
  std::shared_ptr<std::atomic<uint64_t>> stream_submitted;
  uint64_t position = 0;

  void Complete(uint64_t gen) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (gen > completed) completed_at = std::chrono::steady_clock::now();
      completed = std::max(completed, gen);
    }
    cv.notify_all();
  }
  void WaitFor(uint64_t gen) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= gen; });
  }
};

class HostStream;

class HostContext : public StreamContext {
 public:
  explicit HostContext(const HostDevice* device) : device_(device) {}
  void* Host(const void* device_ptr) const override;

 private:
  const HostDevice* device_;
};

// One copy engine per device: copies from every stream are serialized on it
// and overlap work running on other streams, like a GPU's DMA engine.
class CopyEngine {
 public:
  CopyEngine()
      : thread_([this] {
          t_device_thread = true;
          pthread_setname_np(pthread_self(), "zinf-copy");
          Loop();
        }) {}
  ~CopyEngine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Blocks the calling stream thread until the copy is done. An idle engine
  // (no copy running or queued) lets the caller move the bytes itself, in
  // the engine's turn: copies stay one at a time, without a hand-off.
  void Copy(void* dst, const void* src, uint64_t bytes, bool is_memset, int byte) {
    Job job{dst, src, bytes, is_memset, byte};
    std::unique_lock<std::mutex> lock(mu_);
    if (!busy_ && jobs_.empty()) {
      busy_ = true;
      lock.unlock();
      Move(job);
      lock.lock();
      busy_ = false;
      if (!jobs_.empty()) cv_.notify_all();  // a copy queued meanwhile: the engine's thread takes it
      return;
    }
    jobs_.push_back(&job);
    cv_.notify_all();
    done_cv_.wait(lock, [&] { return job.done; });
  }

 private:
  struct Job {
    void* dst;
    const void* src;
    uint64_t bytes;
    bool is_memset;
    int byte;
    bool done = false;
  };
  static void Move(const Job& job) {
    if (job.bytes == 0) {
      // nothing to move (and memmove with a null pointer is undefined even then)
    } else if (job.is_memset) {
      std::memset(job.dst, job.byte, job.bytes);
    } else {
      std::memmove(job.dst, job.src, job.bytes);
    }
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !busy_ && (stop_ || !jobs_.empty()); });
      if (jobs_.empty()) return;
      Job* job = jobs_.front();
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      Move(*job);
      lock.lock();
      busy_ = false;
      job->done = true;
      done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job*> jobs_;
  bool busy_ = false;  // a copy is running (on the engine's thread or its caller's)
  bool stop_ = false;
  std::thread thread_;
};

class HostDevice : public Device {
 public:
  HostDevice(const DeviceOptions& options, char* base, uint64_t budget)
      : options_(options), base_(base), budget_(budget), allocator_(*this, budget) {
    if (options_.checking) {
      std::lock_guard<std::mutex> lock(tagged_mu);
      tagged_ranges.push_back({reinterpret_cast<uintptr_t>(base_), reinterpret_cast<uintptr_t>(base_) + budget_});
    }
  }
  ~HostDevice() override {
    copy_engine_.reset();
    if (options_.checking) {
      std::lock_guard<std::mutex> lock(tagged_mu);
      auto r = std::make_pair(reinterpret_cast<uintptr_t>(base_), reinterpret_cast<uintptr_t>(base_) + budget_);
      tagged_ranges.erase(std::remove(tagged_ranges.begin(), tagged_ranges.end(), r), tagged_ranges.end());
    }
    // An abandoned MPI transfer may still read or write here (io_memory.h):
    // the pages go back, the addresses stay mapped (reading zeros).
    if (HoldsAbandonedTransfer(base_, budget_)) {
      ZINF_LOG_DEBUG("HostDevice: {} left mapped: an abandoned MPI transfer may still use it", FormatBytes(budget_));
      ::madvise(base_, budget_, MADV_DONTNEED);
      return;
    }
    ::munmap(base_, budget_);
  }

  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::span<std::byte> addressable() const {
    if (options_.checking) return {};
    return {reinterpret_cast<std::byte*>(base_), static_cast<size_t>(budget_)};
  }
  std::string name() const override {
    return std::string("host (") + FormatBytes(budget_) + " budget" + (options_.checking ? ", checking" : "") +
           (options_.serialize_tasks ? ", tasks serialized" : "") + ")";
  }

  Result<void*> Allocate(uint64_t bytes, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(uint64_t offset, allocator_.Allocate(bytes, stream));
    return ToDevice(base_ + offset);
  }
  Status Free(void* device_ptr, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(char* p, Resolve(device_ptr, 0, "Free"));
    return allocator_.Free(static_cast<uint64_t>(p - base_), stream);
  }
  DeviceMemoryStats memory_stats() const override { return allocator_.stats(); }
  DeviceWaitStats wait_stats() const override {
    return DeviceWaitStats{waits_.blocking.load(), waits_.draining.load()};
  }
  WaitCounters& waits() { return waits_; }

  Result<std::unique_ptr<Stream>> CreateStream() override;
  Result<std::unique_ptr<Stream>> AdoptStream(void*) override {
    return InvalidArgument("the cpu device has no native streams to adopt: use a stream it creates");
  }
  Result<std::unique_ptr<Event>> CreateEvent() override;
  Result<std::unique_ptr<Event>> CreateTimingEvent() override;

  Status CopyToDevice(void* dst, const void* src, uint64_t bytes, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(char* d, Resolve(dst, bytes, "CopyToDevice destination"));
    return EnqueueCopyOp(stream, [this, d, src, bytes](const StreamContext&) {
      copy_engine_->Copy(d, src, bytes, false, 0);
      return Status::Ok();
    });
  }
  Status CopyToHost(void* dst, const void* src, uint64_t bytes, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(char* s, Resolve(src, bytes, "CopyToHost source"));
    return EnqueueCopyOp(stream, [this, dst, s, bytes](const StreamContext&) {
      copy_engine_->Copy(dst, s, bytes, false, 0);
      return Status::Ok();
    });
  }
  Status CopyOnDevice(void* dst, const void* src, uint64_t bytes, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(char* d, Resolve(dst, bytes, "CopyOnDevice destination"));
    ZINF_ASSIGN_OR_RETURN(char* s, Resolve(src, bytes, "CopyOnDevice source"));
    return EnqueueCopyOp(stream, [this, d, s, bytes](const StreamContext&) {
      copy_engine_->Copy(d, s, bytes, false, 0);
      return Status::Ok();
    });
  }
  Status Memset(void* dst, int byte, uint64_t bytes, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(char* d, Resolve(dst, bytes, "Memset destination"));
    return EnqueueCopyOp(stream, [this, d, byte, bytes](const StreamContext&) {
      copy_engine_->Copy(d, nullptr, bytes, true, byte);
      return Status::Ok();
    });
  }

  // The host address of [device_ptr, device_ptr + bytes), or an error if it
  // is not inside this device's reservation.
  Result<char*> Resolve(const void* device_ptr, uint64_t bytes, const char* what) const {
    auto p = reinterpret_cast<uintptr_t>(device_ptr);
    if (options_.checking) {
      if (!(p & kTag))
        return InvalidArgument(std::string(what) + ": " + std::to_string(p) +
                               " is a host address, not this device's memory (checking mode)");
      p &= ~kTag;
    }
    auto lo = reinterpret_cast<uintptr_t>(base_);
    if (p < lo || p + bytes > lo + budget_ || p + bytes < p)
      return InvalidArgument(std::string(what) + ": [" + std::to_string(p) + ", +" + std::to_string(bytes) +
                             ") is not inside this device's memory");
    return reinterpret_cast<char*>(p);
  }

  void* ToDevice(char* host) const {
    return options_.checking ? reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host) | kTag) : host;
  }

  const DeviceOptions& options() const { return options_; }
  // Held while a task runs when the tasks are serialized.
  std::mutex& task_mu() { return task_mu_; }

 private:
  DeviceOptions options_;
  std::mutex task_mu_;
  char* base_;
  uint64_t budget_;
  DeviceAllocator allocator_;
  WaitCounters waits_;
  std::unique_ptr<CopyEngine> copy_engine_ = std::make_unique<CopyEngine>();
};

void* HostContext::Host(const void* device_ptr) const {
  auto r = device_->Resolve(device_ptr, 0, "StreamContext::Host");
  ZINF_CHECK_MSG(r.ok(), r.ok() ? "" : r.status().message().c_str());
  return *r;
}

class HostStream : public Stream {
 public:
  HostStream(HostDevice* device, uint64_t seed)
      : device_(device),
        id_(next_stream_id.fetch_add(1)),
        rng_(seed ^ (id_ * 0x9e3779b97f4a7c15ull)),
        context_(device),
        thread_([this] {
          t_device_thread = true;
          char name[16];  // what `top -H`, gdb and perf show: at most 15 characters
          std::snprintf(name, sizeof name, "zinf-stream%llu", static_cast<unsigned long long>(id_));
          pthread_setname_np(pthread_self(), name);
          Loop();
        }) {}

  ~HostStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Status Enqueue(StreamTask task) override {
    Push(Op{Op::kTask, std::move(task), nullptr, 0});
    return Status::Ok();
  }
  // On an idle stream, from a host thread, the task runs here and now: the
  // stream is busy meanwhile, so later operations wait their turn. In
  // checking mode every task takes its (randomly delayed) turn instead.
  Status EnqueueShort(StreamTask task) override {
    if (!t_device_thread && !device_->options().checking) {
      std::unique_lock<std::mutex> lock(mu_);
      if (ops_.empty() && !busy_) {
        ops_.push_back(Op{Op::kTask, std::move(task), nullptr, 0});
        submitted_count_->store(++submitted_);
        RunNext(lock);
        return Status::Ok();
      }
    }
    return Enqueue(std::move(task));
  }
  void EnqueueCopy(StreamTask op) { Push(Op{Op::kCopy, std::move(op), nullptr, 0}); }
  Status Wait(Event& event) override;
  // A host thread that waits runs the operations still queued itself, one
  // at a time, whenever the stream's own thread is not in one: the wait
  // then costs no hand-off to a thread that has yet to wake, and the
  // operations run on the core that reads their results next. Order is
  // kept: one operation runs at a time, in queue order, whoever runs it.
  Status Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t target = submitted_;
    if (completed_ < target && !t_device_thread) {
      device_->waits().blocking.fetch_add(1);
      device_->waits().draining.fetch_add(1);
      while (completed_ < target && !busy_ && !ops_.empty()) RunNext(lock);
    }
    done_cv_.wait(lock, [&] { return completed_ >= target; });
    return sticky_;
  }
  Status sticky_error() override {
    std::lock_guard<std::mutex> lock(mu_);
    return sticky_;
  }
  void* native_handle() const override { return nullptr; }
  uint64_t id() const override { return id_; }

  // Pushes the event's completion; returns the stream's submitted count
  // just after it. *done: the stream was idle, so the event is complete
  // now (the caller, holding the event's lock, marks it).
  uint64_t PushSignal(std::shared_ptr<EventState> event, uint64_t gen, bool* done) {
    return Push(Op{Op::kSignal, nullptr, std::move(event), gen}, done);
  }
  const std::shared_ptr<std::atomic<uint64_t>>& submitted_count() const { return submitted_count_; }
  HostDevice* device() const { return device_; }

 private:
  struct Op {
    enum Kind { kTask, kCopy, kSignal, kWait } kind;
    StreamTask task;
    std::shared_ptr<EventState> event;
    uint64_t gen;
  };

  // The stream's thread is woken when the queue stops being empty (and by
  // RunNext when an operation ends): a burst of operations wakes it once.
  // With `done_if_idle`, an operation with nothing to do once every earlier
  // one has finished (an event's completion, a wait on a complete event)
  // is not queued when the stream is idle: it counts as run, *done_if_idle
  // is set, and no thread wakes for it. In checking mode every operation
  // takes its (randomly delayed) turn.
  uint64_t Push(Op op, bool* done_if_idle = nullptr) {
    uint64_t n;
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_if_idle != nullptr && ops_.empty() && !busy_ && !device_->options().checking) {
        n = ++submitted_;
        ++completed_;
        submitted_count_->store(n);
        *done_if_idle = true;
        return n;
      }
      wake = ops_.empty();
      ops_.push_back(std::move(op));
      n = ++submitted_;
      submitted_count_->store(n);
    }
    if (wake) cv_.notify_all();
    return n;
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !busy_ && (stop_ || !ops_.empty()); });
      if (ops_.empty()) return;
      RunNext(lock);
    }
  }

  // Runs the queue's first operation on the calling thread (`lock` held on
  // entry and exit, released while it runs), as a device thread.
  void RunNext(std::unique_lock<std::mutex>& lock) {
    Op op = std::move(ops_.front());
    ops_.pop_front();
    busy_ = true;
    const bool failed = !sticky_.ok();
    lock.unlock();
    const bool was_device_thread = t_device_thread;
    t_device_thread = true;
    Status st = Run(op, failed);
    t_device_thread = was_device_thread;
    lock.lock();
    if (!st.ok() && sticky_.ok()) sticky_ = std::move(st);
    ++completed_;
    busy_ = false;
    done_cv_.notify_all();
    if (!ops_.empty() || stop_) cv_.notify_all();  // the stream's thread, if it waits for its turn
  }

  Status Run(Op& op, bool failed) {
    if (device_->options().checking) {
      // 0-2 ms before every operation: an ordering that only holds by luck fails here.
      std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 2001));
    }
    Status st;
    switch (op.kind) {
      case Op::kTask:
        if (failed) break;  // after an error, later tasks and copies are skipped
        if (device_->options().serialize_tasks) {
          std::lock_guard<std::mutex> one_at_a_time(device_->task_mu());
          st = op.task(context_);
        } else {
          st = op.task(context_);
        }
        break;
      case Op::kCopy:
        if (!failed) st = op.task(context_);
        break;
      case Op::kSignal:
        op.event->Complete(op.gen);  // events still complete, so waiters never hang
        break;
      case Op::kWait:
        op.event->WaitFor(op.gen);
        break;
    }
    return st;
  }

  HostDevice* device_;
  uint64_t id_;
  std::mt19937_64 rng_;
  HostContext context_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Op> ops_;
  uint64_t submitted_ = 0, completed_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> submitted_count_ = std::make_shared<std::atomic<uint64_t>>(0);
  Status sticky_;
  bool busy_ = false;  // an operation is running (on the stream's thread or a waiting host thread)
  bool stop_ = false;
  std::thread thread_;
};

class HostEvent : public Event {
 public:
  explicit HostEvent(HostDevice* device) : device_(device) {}
  Status Record(Stream& stream) override {
    auto* hs = dynamic_cast<HostStream*>(&stream);
    if (!hs) return InvalidArgument("Event::Record: the stream belongs to another kind of device");
    // The generation and the stream position are taken under the event's
    // lock, so a concurrent Synchronize sees a matching pair.
    std::lock_guard<std::mutex> lock(state_->mu);
    const uint64_t gen = ++state_->recorded;
    state_->stream_submitted = hs->submitted_count();
    bool done = false;
    state_->position = hs->PushSignal(state_, gen, &done);
    if (done) {
      state_->completed_at = std::chrono::steady_clock::now();
      state_->completed = gen;
      state_->cv.notify_all();
    }
    return Status::Ok();
  }
  Result<bool> Query() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->completed >= state_->recorded;
  }
  Status Synchronize() override {
    uint64_t target, position;
    std::shared_ptr<std::atomic<uint64_t>> submitted;
    bool blocks;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      target = state_->recorded;
      position = state_->position;
      submitted = state_->stream_submitted;
      blocks = state_->completed < target && !t_device_thread;
    }
    state_->WaitFor(target);
    if (blocks) {
      device_->waits().blocking.fetch_add(1);
      if (submitted && submitted->load() == position) device_->waits().draining.fetch_add(1);
    }
    return Status::Ok();
  }
  Result<double> SecondsSince(Event& start) override {
    auto* other = dynamic_cast<HostEvent*>(&start);
    if (!other) return InvalidArgument("Event::SecondsSince: the start event belongs to another kind of device");
    auto done_at = [](EventState& e) -> std::optional<std::chrono::steady_clock::time_point> {
      std::lock_guard<std::mutex> lock(e.mu);
      if (e.recorded == 0 || e.completed < e.recorded) return std::nullopt;
      return e.completed_at;
    };
    const auto begin = done_at(*other->state_), end = done_at(*state_);
    if (!begin || !end) return FailedPrecondition("Event::SecondsSince: an event has not completed");
    return std::chrono::duration<double>(*end - *begin).count();
  }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  HostDevice* device_;
  std::shared_ptr<EventState> state_ = std::make_shared<EventState>();
};

Status HostStream::Wait(Event& event) {
  auto* he = dynamic_cast<HostEvent*>(&event);
  if (!he) return InvalidArgument("Stream::Wait: the event belongs to another kind of device");
  uint64_t gen;
  bool complete;
  {
    std::lock_guard<std::mutex> lock(he->state()->mu);
    gen = he->state()->recorded;  // the latest Record, as cudaStreamWaitEvent captures it
    complete = he->state()->completed >= gen;
  }
  bool done = false;
  Push(Op{Op::kWait, nullptr, he->state(), gen}, complete ? &done : nullptr);
  return Status::Ok();
}

Status EnqueueCopyOp(Stream& stream, StreamTask op) {
  auto* hs = dynamic_cast<HostStream*>(&stream);
  if (!hs) return InvalidArgument("HostDevice copy: the stream belongs to another kind of device");
  hs->EnqueueCopy(std::move(op));
  return Status::Ok();
}

Result<std::unique_ptr<Stream>> HostDevice::CreateStream() {
  uint64_t seed = options_.seed ? options_.seed
                                : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return std::unique_ptr<Stream>(new HostStream(this, seed));
}

Result<std::unique_ptr<Event>> HostDevice::CreateEvent() { return std::unique_ptr<Event>(new HostEvent(this)); }
Result<std::unique_ptr<Event>> HostDevice::CreateTimingEvent() { return CreateEvent(); }  // every host event is timed

}  // namespace

std::span<std::byte> HostAddressableMemory(const Device& device) {
  const auto* host = dynamic_cast<const HostDevice*>(&device);
  return host ? host->addressable() : std::span<std::byte>();
}

bool IsTaggedDevicePointer(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  if (!(v & kTag)) return false;
  v &= ~kTag;
  std::lock_guard<std::mutex> lock(tagged_mu);
  for (const auto& [lo, hi] : tagged_ranges)
    if (v >= lo && v < hi) return true;
  return false;
}

Result<std::unique_ptr<Device>> CreateHostDevice(const DeviceOptions& options) {
  uint64_t budget = options.memory_budget;
  if (budget == 0) budget = PhysicalMemoryBytes() / 4;
  budget = (budget + 4095) / 4096 * 4096;
  // Reserved, not committed: pages are backed as they are touched.
  void* base = ::mmap(nullptr, budget, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    return OutOfMemory("HostDevice: cannot reserve " + FormatBytes(budget) +
                       " of address space: " + std::strerror(errno));
  DeviceOptions resolved = options;
  if (const char* v = std::getenv("ZINF_SERIALIZE_TASKS"); v != nullptr && std::string_view(v) == "1") {
    resolved.serialize_tasks = true;
  }
  return std::unique_ptr<Device>(new HostDevice(resolved, static_cast<char*>(base), budget));
}

}  // namespace zinf::cpu
